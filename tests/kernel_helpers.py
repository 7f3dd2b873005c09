"""Helpers the kernel tests share (no test module imports another) that need JAX or
Pallas: the NaN-poisoned interpreter (POISONED), the generated mask function run over every pair,
random q, k, v and per-head checks of a kernel's output against float64, and gradients
against float64. The NumPy-only helpers are in helpers.py."""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from helpers import GRAD_TOLERANCE, TOLERANCE, mask_function_source, user_order_keep
from svgen.runtime import coords
from svgen.core.layout import TokenLayout
from svgen.runtime.reference import masked_attention_reference

#: How the kernel tests run a kernel on the CPU: Pallas's HLO interpreter (`interpret=True`),
#: which starts every output and scratch buffer as NaN (ints at their minimum) and pads a block
#: that reaches past its array with NaN too, so a row the kernel never writes, or a padding key
#: it fails to mask, stays NaN and fails the float64 comparison (checked by
#: test_kernels.test_the_interpreter_poisons_what_a_kernel_leaves_unwritten). Pallas's TPU
#: interpreter (pltpu.InterpretParams(uninitialized_memory="nan")) poisons the same, and
#: simulates DMAs and semaphores besides in host callbacks: its programs took about twice as
#: long to compile and run, and cannot be cached; tests of DMA order and races use it
#: directly (test_permute).
POISONED = True


def emitted_function(mask, layout: TokenLayout, name: str = "boundary_mask"):
    """(the function, its source): the generated mask function of ``mask`` on ``layout``,
    the module template's own text (helpers.mask_function_source), defined among the names a
    generated module gives it (coords, jnp, lax)."""
    text = mask_function_source(mask, layout, name)
    namespace = {"coords": coords, "jnp": jnp, "lax": lax}
    exec(compile(text, "<generated>", "exec"), namespace)
    return namespace[name], text


def emitted_keep(fn, layout: TokenLayout) -> np.ndarray:
    """keep[q, k] for every real pair from a generated boundary_mask, queries decoded in row
    form and turned into columns, as the kernel does once per q tile."""

    def keep(pos):
        return fn(
            coords.QueryCoords(pos[None, :], layout), coords.TokenCoords(pos[None, :], layout)
        )

    # Jitted: one XLA compile is faster than dispatching each op of the mask eagerly.
    kept = jax.jit(keep)(jnp.arange(layout.seq_len, dtype=jnp.int32))
    return np.broadcast_to(np.asarray(kept), (layout.seq_len, layout.seq_len))


def mixed_inputs(plan, dtype, seed, heads=4):
    rng = np.random.default_rng(seed)
    shape = (heads, plan.layout.seq_len, plan.spec.attention.head_dim)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    if dtype == "bfloat16":
        q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    return q, k, v


def check_per_head(plan, out, q, k, v, head_pattern, dtype):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    q64, k64, v64 = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v))
    keeps = [user_order_keep(p) for p in plan.patterns]
    for head, pattern in enumerate(np.asarray(head_pattern).tolist()):
        ref = masked_attention_reference(q64[head], k64[head], v64[head], keeps[pattern])
        # A mask that keeps nothing has a zero reference: then the output must be exactly 0.
        err = np.max(np.abs(out[head] - ref)) / max(np.max(np.abs(ref)), np.finfo(float).tiny)
        assert err <= TOLERANCE[dtype], f"head {head} ({plan.patterns[pattern].name}): {err:.2e}"
        assert np.all(out[head][~keeps[pattern].any(axis=1)] == 0.0)  # no key: exactly 0


def reference_grads(plan, q, k, v, head_pattern, do, sm_scale=None, keeps=None):
    """float64 dq, dk, dv of sum(attention(q, k, v) * do), heads [.., heads, seq, d];
    `keeps`: per pattern, the user-order mask (default: each pattern's exact mask)."""
    q64, k64, v64, do64 = (
        np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v, do)
    )
    scale = 1 / np.sqrt(q64.shape[-1]) if sm_scale is None else sm_scale
    keeps = keeps or [user_order_keep(p) for p in plan.patterns]
    grads = [np.zeros_like(q64), np.zeros_like(k64), np.zeros_like(v64)]  # q may be a chunk
    for index in np.ndindex(q64.shape[:-2]):
        keep = keeps[int(head_pattern[index[-1]])]
        s = np.where(keep, q64[index] @ k64[index].T * scale, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
        p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
        o, dout = p @ v64[index], do64[index]
        ds = p * (dout @ v64[index].T - (dout * o).sum(-1, keepdims=True))
        grads[0][index] = ds @ k64[index] * scale
        grads[1][index] = ds.T @ q64[index] * scale
        grads[2][index] = p.T @ dout
    return grads


# attention -> {(what, static arguments): its jitted program}, kept while the attention lives.
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _static_key(static: dict) -> str:
    return repr(sorted((k, np.asarray(v).tolist()) for k, v in static.items()))


def _program(attention, what: str, static: dict, build):
    """The jitted program `build(attention proxy)` of this attention, `what` and static
    arguments, built once: jax.jit's cache keeps its compiled executables by shapes and dtypes,
    so a second call of the same shapes runs without tracing or compiling again (an eager call
    of the attention traces and compiles its pallas_calls anew each time)."""
    programs = _PROGRAMS.setdefault(attention, {})
    key = (what, _static_key(static))
    if key not in programs:
        # A proxy: the program must not keep the attention (the key) alive.
        programs[key] = jax.jit(build(weakref.proxy(attention)))
    return programs[key]


def jitted(attention, method: str | None = None, /, **static):
    """attention(q, k, v, *args, **static) (or attention.<method>(...)) as a program jitted over
    its positional arguments, built once per attention, method and static keyword arguments
    (arrays among them, such as a head_pattern, are constants of the program, as when given to
    an eager call). With conftest's shared_compile, every test that runs one module's kernel at
    one shape shares one compile."""

    def build(target):
        def run(*args):
            return (target if method is None else getattr(target, method))(*args, **static)

        return run

    return _program(attention, f"call {method}", static, build)


def check_grads(plan, module, q, k, v, head_pattern, dtype, jit_pattern=False, keeps=None):
    """jax.grad of sum(attention * do) in interpret mode (NaN-poisoned) against float64; the
    program jitted once per module and head_pattern (traced with jit_pattern), do an input."""
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)
    static = {} if jit_pattern else {"head_pattern": np.asarray(head_pattern)}

    def build(attention):
        def loss(q, k, v, hp, do):
            out = attention(q, k, v, head_pattern=hp, interpret=POISONED)
            return jnp.sum(out.astype(jnp.float32) * do)

        grad = jax.grad(loss, argnums=(0, 1, 2))
        if jit_pattern:
            return grad
        hp = static["head_pattern"]
        return lambda q, k, v, do: grad(q, k, v, hp, do)

    program = _program(module.attention, "grad", static, build)
    hp = jnp.asarray(head_pattern, jnp.int32)
    got = program(q, k, v, hp, do) if jit_pattern else program(q, k, v, do)
    want = reference_grads(plan, q, k, v, np.asarray(head_pattern), do, keeps=keeps)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
        assert np.all(np.isfinite(a)), f"{name}: non-finite values"
        error = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
        assert error <= GRAD_TOLERANCE[dtype], f"{name}: relative error {error:.2e}"
