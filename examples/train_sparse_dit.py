"""Train a tiny video-DiT block through svgen's sparse kernel, and through dense attention.

    .venv/bin/python examples/train_sparse_dit.py [--steps N] [--seed N] [--log-every N]

The block: LayerNorm -> Q/K/V projections -> attention -> output projection, plus an MLP, each
with a residual. svgen compiles a small spec (SPEC below: 16 latent frames of 4 x 8 and 32
text tokens, 544 tokens; a spatial head in frame-major order and a temporal head in
temporal-major order, 128 x 128 tiles) and the block is trained twice with Adam from the same
initial weights on the same batches: once with the generated kernel's `attention` (Pallas
interpret mode, forward and both backward kernels) and once with dense softmax attention
under the same masks (jnp, the keep matrix in the user's token order). The task is to
regress a fixed random "teacher" block (same architecture, dense masked attention) on fresh
random tokens each step, so the loss can fall and the data is a function of the seed alone.

It prints the relative difference of the two runs' gradients at the initial weights and of
their final weights, both loss curves every --log-every steps, the largest relative difference
between the curves, and a last line `RESULT {json}` (the curves and the figures) for tests to
read. It fails (AssertionError) when a loss does not fall below LOSS_FRACTION of its first
value or the curves differ by more than CURVE_TOLERANCE anywhere. The loss falls in two
stages (the MLP in the first 25 steps, the attention heads from about step 150 on), so the
first check needs about the default 250 steps. Under a minute on two CPU cores (about 50 s:
the sparse run 30 s, the dense one 12 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from svgen import codegen
from svgen.runtime import libtpu_env
from svgen.analysis import analyze
from svgen.spec import parse_spec

SPEC = """
svgen: 1
name: tiny_dit
geometry: {frames: 16, height: 4, width: 8, text_tokens: 32, text_position: last}
attention: {heads: 2, head_dim: 64, dtype: float32}
patterns:
  spatial:
    any_of:
      - text: {}
      - first_frame: {frames: 1}
      - spatial_window: {frames: 1}
  temporal:
    any_of:
      - text: {}
      - first_frame: {frames: 1}
      - temporal_stride: {rows: 0, cols: 0}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: [spatial, temporal]
tiling: {block_q: 128, block_kv: 128}
"""
MODEL_DIM = 128
MLP_DIM = 256
BATCH = 2
LEARNING_RATE = 1e-2
# What the run must show: the loss ends below this fraction of where it started, and the
# sparse and dense curves agree to this relative difference at every step (float32: both
# compute the same function; only the order of the sums differs).
LOSS_FRACTION = 0.25
CURVE_TOLERANCE = 1e-4


def compile_spec(out_dir: pathlib.Path):
    """svgen compile SPEC into out_dir, and import the generated module."""
    plan = analyze(parse_spec(SPEC, source="train_sparse_dit.yaml"))
    for name, data in codegen.render(plan, "examples/train_sparse_dit.py").items():
        (out_dir / name).write_bytes(data)
    spec = importlib.util.spec_from_file_location("tiny_dit", out_dir / "tiny_dit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return plan, module


def user_order_keep(pattern) -> np.ndarray:
    """keep[q, k] of one pattern, in the user's token order. The mask is defined on kernel
    positions (a temporal-major pattern stores the video place by place), so evaluate it
    there and permute rows and columns back to where the user's tokens sit."""
    lay = pattern.layout
    c = lay.coordinates(np.arange(lay.seq_len))
    keep = pattern.mask.evaluate(c.reshape(-1, 1), c.reshape(1, -1))
    position = np.empty(lay.seq_len, np.int64)  # user token -> kernel position
    position[lay.original_index(np.arange(lay.seq_len))] = np.arange(lay.seq_len)
    return np.asarray(keep[np.ix_(position, position)], bool)


def dense_masked_attention(q, k, v, keep):
    """softmax(q k^T / sqrt(d), masked by keep [heads, seq, seq]) v; rows with no key are 0,
    as the kernel writes them. q, k, v: [batch, heads, seq, d]."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    scores = jnp.where(keep, scores, -jnp.inf)
    # The row max only shifts the exponent (softmax does not depend on it): no gradient
    # through it, and 0 for a row with no key so that no inf - inf appears.
    row_max = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = jnp.where(keep, jnp.exp(scores - row_max), 0.0)
    denom = probs.sum(axis=-1, keepdims=True)
    probs = probs / jnp.where(denom > 0, denom, 1.0)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def init_params(key, heads, head_dim, attn_scale=1.0):
    """Weights of one block. attn_scale > 1 sharpens the teacher's attention (larger q, k),
    so that which keys a head may see matters to the target."""
    ks = jax.random.split(key, 6)
    d, inner = MODEL_DIM, heads * head_dim

    def normal(k, shape, fan_in, scale=1.0):
        return scale * jax.random.normal(k, shape, jnp.float32) / np.sqrt(fan_in)

    return {
        "ln1": jnp.ones(d),
        "ln2": jnp.ones(d),
        "wq": normal(ks[0], (heads, d, head_dim), d, attn_scale),
        "wk": normal(ks[1], (heads, d, head_dim), d, attn_scale),
        "wv": normal(ks[2], (heads, d, head_dim), d),
        "wo": normal(ks[3], (heads, head_dim, d), inner),
        "w1": normal(ks[4], (d, MLP_DIM), d),
        "b1": jnp.zeros(MLP_DIM),
        "w2": normal(ks[5], (MLP_DIM, d), MLP_DIM),
        "b2": jnp.zeros(d),
    }


def block(params, x, attend):
    """One DiT block on x [batch, seq, MODEL_DIM]; attend(q, k, v) -> [batch, heads, seq, d]."""

    def layer_norm(x, gain):
        x = x - x.mean(-1, keepdims=True)
        return gain * x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    h = layer_norm(x, params["ln1"])
    q, k, v = (jnp.einsum("bsm,hmd->bhsd", h, params[w]) for w in ("wq", "wk", "wv"))
    x = x + jnp.einsum("bhsd,hdm->bsm", attend(q, k, v), params["wo"])
    h = layer_norm(x, params["ln2"])
    return x + jax.nn.gelu(h @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def batch_tokens(key, position_code):
    """Fresh tokens for one step: a fixed random code per token position (so that where a
    token sits matters, as in a video) plus noise."""
    noise = jax.random.normal(key, (BATCH,) + position_code.shape, position_code.dtype)
    return position_code + noise


def train(attend, params, teacher, position_code, data_key, steps):
    """Adam on the block with this attention: (the loss of every step, float64 NumPy; the
    final weights)."""
    optimizer = optax.adam(LEARNING_RATE)

    def loss_fn(params, teacher_params, x):
        target = block(teacher_params, x, teacher["attend"])
        return jnp.mean((block(params, x, attend) - target) ** 2)

    # The whole step under jit: the interpret-mode kernels (forward and both backward ones)
    # are then traced once and compiled with the rest. Eagerly they are re-traced and run op
    # by op on every call: about 5 s for one gradient here, against ~0.1 s for a jitted step.
    @jax.jit
    def step(params, opt_state, teacher_params, index):
        x = batch_tokens(jax.random.fold_in(data_key, index), position_code)
        loss, grads = jax.value_and_grad(loss_fn)(params, teacher_params, x)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    losses = []
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, teacher["params"], i)
        losses.append(loss)
    return np.asarray(jax.device_get(losses), np.float64), params


def gradient_difference(sparse, dense, params, teacher, position_code, data_key):
    """max over weights of |g_sparse - g_dense| / |g_dense| (Frobenius) at params, on the
    first step's batch."""

    def grads(attend):
        def loss_fn(params, teacher_params, x):
            target = block(teacher_params, x, teacher["attend"])
            return jnp.mean((block(params, x, attend) - target) ** 2)

        # Everything as an argument, not closed over: captured arrays become constants that
        # XLA then folds for seconds (the whole teacher forward).
        x = batch_tokens(jax.random.fold_in(data_key, 0), position_code)
        return jax.jit(jax.grad(loss_fn))(params, teacher["params"], x)

    return relative_difference(grads(sparse), grads(dense))


def relative_difference(a: dict, b: dict) -> float:
    """max over the arrays of two weight dicts of |a - b| / |b| (Frobenius norms)."""
    return max(float(jnp.linalg.norm(a[n] - b[n]) / jnp.linalg.norm(b[n])) for n in b)


def run(steps: int = 250, seed: int = 0, log_every: int = 25, verbose: bool = True) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        plan, module = compile_spec(pathlib.Path(tmp))
        heads, head_dim = plan.spec.attention.heads, plan.spec.attention.head_dim
        head_pattern = np.asarray(module.HEAD_PATTERN, np.int32)
        # Each head's keep matrix (its pattern's), for the dense run and the teacher.
        keeps = np.stack([user_order_keep(p) for p in plan.patterns])[head_pattern]
        keep = jnp.asarray(keeps)[None]  # [1, heads, seq, seq]

        def sparse(q, k, v):
            return module.attention(q, k, v, head_pattern=head_pattern, interpret=True)

        def dense(q, k, v):
            return dense_masked_attention(q, k, v, keep)

        key = jax.random.PRNGKey(seed)
        student_key, teacher_key, code_key, data_key = jax.random.split(key, 4)
        params = init_params(student_key, heads, head_dim)
        teacher = {
            "params": init_params(teacher_key, heads, head_dim, attn_scale=2.0),
            "attend": dense,
        }
        position_code = jax.random.normal(code_key, (plan.layout.seq_len, MODEL_DIM))

        grad_diff = gradient_difference(sparse, dense, params, teacher, position_code, data_key)
        t0 = time.perf_counter()
        sparse_losses, sparse_params = train(
            sparse, params, teacher, position_code, data_key, steps
        )
        t1 = time.perf_counter()
        dense_losses, dense_params = train(dense, params, teacher, position_code, data_key, steps)
        t2 = time.perf_counter()
        weight_diff = relative_difference(sparse_params, dense_params)

    rel = np.abs(sparse_losses - dense_losses) / np.abs(dense_losses)
    result = {
        "steps": steps,
        "seed": seed,
        "seq_len": plan.layout.seq_len,
        "densities": [round(float(p.density), 4) for p in plan.patterns],
        "sparse": sparse_losses.tolist(),
        "dense": dense_losses.tolist(),
        "initial": [sparse_losses[0], dense_losses[0]],
        "final": [sparse_losses[-1], dense_losses[-1]],
        "max_rel_diff": float(rel.max()),
        "grad_rel_diff": grad_diff,
        "weight_rel_diff": weight_diff,
        "seconds": {
            "sparse": round(t1 - t0, 1),
            "dense": round(t2 - t1, 1),
            "total": round(time.perf_counter() - start, 1),
        },
    }
    if verbose:
        kinds = ", ".join(
            f"{p.name} {p.layout.order} density {p.density:.3f}" for p in plan.patterns
        )
        print(
            f"{plan.spec.name}: {plan.layout.seq_len} tokens, {heads} heads ({kinds}), "
            f"batch {BATCH}, Adam {LEARNING_RATE}, {steps} steps"
        )
        print(f"gradient rel. difference at init (sparse vs dense): {grad_diff:.2e}")
        print(f"final weights rel. difference (sparse vs dense run): {weight_diff:.2e}")
        print(" step   sparse loss    dense loss    rel. diff")
        for i in sorted(set(range(0, steps, log_every)) | {steps - 1}):
            print(f"{i:5d}  {sparse_losses[i]:12.6f}  {dense_losses[i]:12.6f}  {rel[i]:.2e}")
        print(
            f"loss {sparse_losses[0]:.4f} -> {sparse_losses[-1]:.4f} (sparse), "
            f"{dense_losses[0]:.4f} -> {dense_losses[-1]:.4f} (dense); "
            f"max rel. difference {rel.max():.2e}; "
            f"{t1 - t0:.1f} s sparse, {t2 - t1:.1f} s dense"
        )
        print("RESULT " + json.dumps(result))
    for name, losses in (("sparse", sparse_losses), ("dense", dense_losses)):
        if not losses[-1] < LOSS_FRACTION * losses[0]:
            raise AssertionError(
                f"{name} loss did not fall below {LOSS_FRACTION} of its start: "
                f"{losses[0]:.4f} -> {losses[-1]:.4f}"
            )
    if not rel.max() <= CURVE_TOLERANCE:
        raise AssertionError(
            f"sparse and dense curves differ by {rel.max():.2e} "
            f"(step {int(rel.argmax())}), over {CURVE_TOLERANCE}"
        )
    return result


def main(argv=None) -> dict:
    # Before JAX starts its backends: JAX loads libtpu even for CPU work when it is installed,
    # and on a machine without a TPU libtpu would print warnings that look like a crash.
    libtpu_env.prepare()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    return run(args.steps, args.seed, args.log_every)


if __name__ == "__main__":
    main()
    sys.exit(0)
