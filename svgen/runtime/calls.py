"""What every generated module's `attention` checks and says, TPU and GPU alike: its
operands, head_pattern, sm_scale and token order, the moves between the user's and the
kernel's token order, and its docstring.

Other layouts (`layout_mover`)
-------------------------------
Where the heads use identity layouts and one temporal-major layout, the wrapper moves q, k, v
into kernel order and o back with the permute kernel (svgen.runtime.permute: one read and one
write of each tensor, frame-major heads copied whole, the head -> layout code traced); any
other mix of layouts is moved layout by layout (`layout_move`: a gather of whole tokens, or
reshapes and transposes of whole cubes), selected per head.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from svgen.runtime import chunks, permute, segments
from svgen.runtime import select as select_policy
from svgen.core.layout import TokenLayout
from svgen.core.tables import KernelShape

# attention(..., token_order=...): q, k, v and o in the user's token order, or already in each
# head's kernel order (what attention.to_kernel_order gives; nothing is permuted).
TOKEN_ORDERS = ("user", "kernel")
# What a spec's attention.dtype may name (svgen.spec.DTYPES: runtime/ never imports the spec
# reader; a test checks that they agree), for the advice of a dtype mismatch.
SPEC_DTYPES = ("bfloat16", "float32")


def per_head_layout(x, layouts: list[TokenLayout], head_layout, to_kernel: bool):
    """Apply each head's layout permutation to x [..., heads, seq, d], selected per head."""
    moves = [layout_move(lay, to_kernel) for lay in layouts]
    out = moves[0](x)
    for index, move in enumerate(moves[1:], start=1):
        out = jnp.where((head_layout == index)[:, None, None], move(x), out)
    return out


def layout_move(lay: TokenLayout, to_kernel: bool):
    """How XLA moves x [..., seq, d] into `lay`'s kernel order (or back), as measured on a
    TPU v5e at 10 x 75,600 x 128 bf16 (bench/permute_on_chip.py, docs/measured.md): a tiled
    order whose cubes divide the video by its reshapes and transposes, which ran at a plain
    copy's rate (1.17-1.23 ms, the gather 1.78-1.81); every other order by one gather of whole
    tokens (temporal-major: 1.81-1.88 ms, the reshapes, slices and joins 3.1-4.3)."""
    if lay.is_identity:
        return lambda x: x
    if lay.moves_by_reshape:
        return functools.partial(lay.to_kernel if to_kernel else lay.from_kernel, xp=jnp)
    return token_gather(lay, to_kernel)


@functools.cache
def token_gather(lay: TokenLayout, to_kernel: bool):
    """x [..., seq, d] -> the same tokens in `lay`'s kernel order (or back), as one gather of
    whole tokens (rows of d). Its VJP is the inverse gather: a permutation's transpose is its
    inverse, and XLA's scatter-add, the gather's own VJP, is what a permutation does not
    need."""
    into_kernel = lay.original_index(np.arange(lay.seq_len)).astype(np.int32)
    out_of_kernel = lay.kernel_position.astype(np.int32)
    forward, backward = (into_kernel, out_of_kernel) if to_kernel else (out_of_kernel, into_kernel)

    def take(x, index):
        return jnp.take(x, jnp.asarray(index), axis=-2)

    @jax.custom_vjp
    def gather(x):
        return take(x, forward)

    def gather_fwd(x):
        return take(x, forward), None

    def gather_bwd(_, g):
        return (take(g, backward),)

    gather.defvjp(gather_fwd, gather_bwd)
    return gather


@dataclasses.dataclass(frozen=True)
class BackendWords:
    """What a backend's `attention` docstring says of it: its name, what `interpret` does,
    its gradients, and a chunked call's."""

    name: str  # "TPU", "GPU"
    interpret: str
    grads: str
    chunk_grads: str


def attention_doc(
    shape: KernelShape,
    dtype: str | None,
    pattern_names: Sequence[str],
    default_head_pattern: Sequence[int] | None,
    *,
    words: BackendWords,
    any_dtype: str = "any floating dtype",
    runtime: segments.RuntimeInputs = segments.RuntimeInputs(),
    text_tokens: int = 0,
    kv_cache: "chunks.KvCache | None" = None,
    select: "select_policy.Selection | None" = None,
) -> str:
    """The docstring of a generated module's `attention` (what `help(module.attention)`
    shows), with this kernel's sizes, dtype and patterns written in. `any_dtype`: what q, k,
    v may be when the kernel has no dtype of its own; `runtime`: its run-time inputs."""
    n, d = shape.seq_len, shape.head_dim
    dtypes = f"of dtype {dtype}" if dtype is not None else f"of {any_dtype}"
    names = ", ".join(f"{i}: {name}" for i, name in enumerate(pattern_names))
    if default_head_pattern is None:
        default = "required: this kernel's patterns are chosen at run time (e.g. by profile())"
    else:
        default = f"the spec's assignment, HEAD_PATTERN = {tuple(default_head_pattern)}"
    backend, interpret, grads = words.name, words.interpret, words.grads
    extra, runtime_lines = _runtime_inputs_doc(runtime, text_tokens, n)
    if kv_cache is not None:
        extra += ", q_frame_offset=None"
    returns = "Returns o, of q's shape and dtype; a query whose mask keeps no key gets zeros."
    if select is not None:
        extra += f", {select.policy.rule}=None, return_selection=False"
        # The selection's own grain: a GPU kernel built from a TPU module keeps the TPU's.
        runtime_lines += _select_doc(select.policies, select.shape)
        returns += _selection_returns_doc(select.shape)
    if kv_cache is not None:
        runtime_lines += _kv_cache_doc(kv_cache, n, d, words.chunk_grads)
    return f"""attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None, token_order="user"{extra})

Block-sparse attention on {backend}: o = softmax(sm_scale * q k^T over the keys each query's
mask keeps) v, per head.

q, k, v: [heads, {n}, {d}] or [batch, heads, {n}, {d}] arrays {dtypes}, the
    three alike: heads before tokens (a [seq, heads, head_dim] array, PyTorch's order, needs
    jnp.swapaxes(x, -3, -2) first), tokens in the user's order (video frame-major, text first
    or last as the spec says) unless token_order="kernel".
head_pattern: int [heads], each head's pattern ({names}); may be traced under jax.jit. q may
    have any number of heads when it is given. None: {default}.
    A value that is no pattern index raises where it is concrete; traced, it makes that
    head's outputs (and gradients) NaN.
interpret: {interpret}
sm_scale: the factor on the scores q.k before the softmax, a finite real number; None:
    1/sqrt({d}).
token_order: "user", or "kernel": q, k, v already in each head's kernel order, and o
    returned in it (attention.to_kernel_order(x, head_pattern=...) and
    attention.from_kernel_order(y, ...) convert), so nothing is permuted around the kernel.
{runtime_lines}
{returns}
{grads}
"""


def _runtime_inputs_doc(runtime: segments.RuntimeInputs, text_tokens: int, n: int):
    """(the signature's extra arguments, their lines) for segment ids and text lengths."""
    extra = "".join(f", {name}=None" for name in runtime.arguments())
    runtime_lines = ""
    if runtime.segments:
        runtime_lines += f"""segment_ids: int32 [{n}] or [batch, {n}], in the user's token order (may be traced):
    only pairs of one id are kept, on top of the mask; a negative id marks a padding token
    (it attends nothing and nothing attends it). None: every token in one segment.
"""
    if runtime.per_video_frames:
        runtime_lines += """    Per-video frames: a video segment is whole frames, numbered from its own first
    frame (first_frame and block_causal apply per video; text keeps frame 0); concrete
    ids that cut a frame raise.
"""
    if runtime.text_lengths:
        runtime_lines += f"""text_lengths: int32 [] or [batch] (may be traced): how many of the {text_tokens} text tokens
    are real (counted from the first); the others are padding, never attended, their rows
    zeros. Concrete values outside 0 .. {text_tokens} raise; traced ones are clamped to it.
"""
    if runtime.any:
        runtime_lines += """    Each call refines the tables on the device (no host round trip, one compile for all
    run-time values); jax.vmap gives each batch element its own.
"""
    return extra, runtime_lines


def _select_doc(policies, shape: KernelShape) -> str:
    """The lines of a selection policy's amount argument (top_k or top_p) and of
    return_selection; policies: per pattern (one with one pattern)."""
    policy = policies[0]
    least = "/".join(sorted({str(p.min_blocks) for p in policies}, key=int))
    most = "/".join(sorted({str(p.max_blocks) for p in policies}, key=int))
    kind = "int" if policy.rule == "top_k" else "float"
    if len(set((p.default, p.min_blocks, p.max_blocks) for p in policies)) == 1:
        default = f"{int(policy.default)}" if policy.rule == "top_k" else f"{policy.default}"
        bounds = f"{least} .. {most}"
    else:
        default = "each head's pattern's: " + ", ".join(
            f"{int(p.default) if policy.rule == 'top_k' else p.default}" for p in policies
        )
        bounds = "each head's pattern's: " + ", ".join(
            f"{p.min_blocks} .. {p.max_blocks}" for p in policies
        )
    # Traced amounts cannot raise (Selection.amount checks concrete ones): say what they do.
    if policy.rule == "top_k":
        amount = (
            f"{kind} [] or [heads] (may be traced): kv blocks per compute block row (None: "
            f"{default})"
        )
        traced = f"A traced k cannot raise: below 0 selects {least} blocks."
    else:
        amount = (
            f"{kind} [] or [heads] in 0 .. 1 (may be traced): the mass to reach (None: {default})"
        )
        traced = (
            f"A traced\n    p cannot raise: NaN or below 0 selects {least} blocks, above 1 every "
            f"selectable block of\n    finite score (up to {most})."
        )
    return f"""{policy.rule}: {amount}.
    Per compute block row, the count of chosen blocks is clamped to {bounds}. {traced}
    Each call scores the candidate region's compute blocks ({shape.cq} x {shape.ckv} tokens) by
    mean-pooled q . k and attends the chosen ones whole, on top of the mask
    (svgen.runtime.select); a NaN or +inf score always selects its block. One compile for
    every value; gradients hold the selection fixed.
return_selection: True: the call returns (o, selected) (see Returns).
"""


def _selection_returns_doc(shape: KernelShape) -> str:
    """The Returns paragraph's words on return_selection (a select module only)."""
    return f"""
With return_selection=True, (o, selected): selected is bool [..., heads, row blocks, column
    blocks] (q's leading dimensions), True where the call chose that block of {shape.cq} x
    {shape.ckv} tokens (in each head's kernel order) on top of the mask; the mask's own blocks
    are not in it. attention.select.selectable (bool [row blocks, column blocks]; with heads
    of several patterns, [patterns, row blocks, column blocks]) is what it could choose from."""


def _kv_cache_doc(kv_cache: "chunks.KvCache", n: int, d: int, chunk_grads: str) -> str:
    """The lines of a chunked call's q_frame_offset: a rolling cache, or the whole video's."""
    c, rows = kv_cache.chunk_frames, kv_cache.rows
    if kv_cache.rolling:
        s, w = kv_cache.sink_frames, kv_cache.window_frames
        return f"""q_frame_offset: int32 [] (may be traced), a multiple of {c} in 0 .. {kv_cache.frames - c}: a chunked call
    (rolling KV cache). q is then [heads, {rows}, {d}] or [batch, heads, {rows}, {d}], the queries of
    frames q_frame_offset .. + {c - 1}; k and v the cache, [.., heads, {kv_cache.cache_tokens}, {d}]: {s} sink
    frames (frame a < {s} in slot a) and a ring of {w} (frame a >= {s} in slot {s} + (a - {s}) mod {w}),
    slot t at tokens t * {kv_cache.frame_tokens} ..; write the chunk's own frames before the call.
    Slots not written yet are never attended (they must only be finite). The mask is the full
    sequence's, in absolute frames: chunk by chunk, o equals the full-sequence call's rows
    (the compiler checked that the ring holds every frame it keeps). A traced offset that is
    no chunk start gives NaN outputs; a concrete one raises. jax.grad gives dq of the chunk
    and dk, dv of the ring.
"""
    return f"""q_frame_offset: int32 [] (may be traced), a multiple of {c} in 0 .. {kv_cache.frames - c}: a chunked call
    (KV cache). q is then [heads, {rows}, {d}] or [batch, heads, {rows}, {d}], the queries of
    frames q_frame_offset .. + {c - 1}; k and v the cache of the whole video, [.., heads, {n}, {d}],
    frame t at tokens t * {kv_cache.frame_tokens} ..; frames after the chunk are never attended
    (they must only be finite). The mask is the full sequence's, in absolute frames: chunk by
    chunk, o equals the full-sequence call's rows. A traced offset that is no chunk start
    gives NaN outputs; a concrete one raises. {chunk_grads}
"""


def checked_sm_scale(sm_scale, head_dim: int) -> float:
    """The call's sm_scale as a float (None: 1/sqrt(head_dim)). float() alone would take the
    string "0.1" and True, and a NaN or infinite scale would poison every output row."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    real = isinstance(sm_scale, numbers.Real) or (
        getattr(sm_scale, "shape", None) == ()
        and (
            jnp.issubdtype(sm_scale.dtype, jnp.floating)
            or jnp.issubdtype(sm_scale.dtype, jnp.integer)
        )
    )
    if not real or isinstance(sm_scale, (bool, np.bool_)):
        raise TypeError(
            "sm_scale must be a real number (the factor on the scores q.k; None: "
            f"1/sqrt(head_dim)), got {type(sm_scale).__name__} {sm_scale!r}"
        )
    value = float(sm_scale)
    if not math.isfinite(value):
        raise ValueError(f"sm_scale must be finite, got {value}")
    return value


def check_token_order(token_order) -> None:
    if token_order not in TOKEN_ORDERS:
        raise ValueError(f"token_order must be one of {TOKEN_ORDERS}, got {token_order!r}")


def check_order_operand(x, shape: KernelShape) -> None:
    """What to_kernel_order / from_kernel_order take: [..., heads, seq_len, head_dim]."""
    if x.ndim not in (3, 4) or x.shape[-2:] != (shape.seq_len, shape.head_dim):
        raise ValueError(_shape_message("x", x.shape, shape))


def _shape_message(name: str, got: tuple, shape: KernelShape) -> str:
    """What a q, k, v (or to_kernel_order operand) of the wrong shape is told: the expected
    layout with this kernel's sizes, and the transpose when the heads and tokens look swapped
    (PyTorch's [batch, seq, heads, head_dim])."""
    n, d = shape.seq_len, shape.head_dim
    message = (
        f"expected [heads, {n}, {d}] or [batch, heads, {n}, {d}] ([..., heads, seq, "
        f"head_dim] at this kernel's sizes) for {name}; got {tuple(got)}"
    )
    if len(got) in (3, 4) and got[-3] == n and got[-1] == d:
        message += (
            f" (is it [..., seq, heads, head_dim]? put the heads first: "
            f"jnp.swapaxes({name}, -3, -2))"
        )
    return message


def layout_mover(
    layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
):
    """How arrays [..., heads, seq, d] go between the user's order and each head's kernel
    order: `mover(x, to_kernel)`, or None where nothing moves. The permute kernel moves
    temporal-major heads (nothing at all when a static assignment gives every head an
    identity layout); otherwise XLA, layout by layout (`per_head_layout`)."""
    if permute_kernel:
        if static_pattern is not None and all(
            layouts[i].is_identity for i in layout_of_pattern[static_pattern]
        ):
            return None

        def by_permute_kernel(x, to_kernel):
            rows = x.reshape((-1,) + x.shape[-2:])
            moved = permute.permute(
                rows, layouts, head_layout, to_kernel=to_kernel, interpret=interpret
            )
            return moved.reshape(x.shape)

        return by_permute_kernel

    def by_layout(x, to_kernel):
        return per_head_layout(x, layouts, head_layout, to_kernel)

    return by_layout


def resolve_head_pattern(head_pattern, default, heads: int, spec_heads: int, num_patterns: int):
    """The call's head -> pattern assignment (the spec's static one when not given), checked
    as `_checked_head_pattern` says: (NumPy copy when concrete, int32 [heads] array)."""
    if head_pattern is None:
        if default is None:
            raise ValueError(
                "this kernel's patterns are assigned at run time: pass "
                "head_pattern (int [heads]), e.g. from profile()"
            )
        if heads != spec_heads:
            raise ValueError(
                f"q has {heads} heads, the spec {spec_heads}: any number of heads runs when "
                "you pass head_pattern (int [heads], each head's pattern index; e.g. its "
                "shard under shard_map)"
            )
        head_pattern = default
    return _checked_head_pattern(head_pattern, heads, num_patterns)


def _checked_head_pattern(head_pattern, heads: int, num_patterns: int):
    """(NumPy copy when concrete, int32 [heads] array). Concrete values are checked; traced
    ones are clamped into range, so a wrong value can never read outside the tables."""
    traced = isinstance(head_pattern, jax.core.Tracer)
    if not traced and not hasattr(head_pattern, "dtype"):
        head_pattern = np.asarray(head_pattern)
    if not jnp.issubdtype(head_pattern.dtype, jnp.integer):
        raise TypeError(
            f"head_pattern must hold integers (pattern indices), got dtype {head_pattern.dtype}"
        )
    if tuple(head_pattern.shape) != (heads,):
        raise ValueError(
            f"head_pattern must have shape ({heads},), one pattern index per head "
            f"of q; got shape {tuple(head_pattern.shape)}"
        )
    if traced:
        return None, jnp.clip(head_pattern.astype(jnp.int32), 0, num_patterns - 1)
    values = np.asarray(head_pattern, np.int64)
    bad = values[(values < 0) | (values >= num_patterns)]
    if bad.size:
        raise ValueError(
            f"head_pattern values must be pattern indices 0..{num_patterns - 1}; got {bad.tolist()}"
        )
    # A concrete assignment gives the flat walk a static grid.
    return values, jnp.asarray(values, jnp.int32)


def poison_unknown_patterns(out, head_pattern, num_patterns: int):
    """`out` [..., heads, seq, d] with NaN in every head whose traced head_pattern value is no
    pattern index. A concrete value out of range raised already; a traced one cannot raise,
    and the kernel ran such a head with the nearest pattern (its value clamped so that no
    table is read out of bounds): another pattern's result, which must not pass for this
    head's. The factor is 1 elsewhere (exact), and NaN gradients flow back through it too.
    Costs one elementwise pass over o, for traced assignments only."""
    if not isinstance(head_pattern, jax.core.Tracer):
        return out
    known = (head_pattern >= 0) & (head_pattern < num_patterns)
    factor = jnp.where(known, 1.0, jnp.nan).astype(out.dtype)
    return out * factor[:, None, None]


def check_operands(
    q, k, v, shape: KernelShape, dtype: str | None = None, rebuild: dict | None = None
) -> None:
    """q, k, v as the kernel takes them. `rebuild`: dtype name -> how to build a kernel for
    it other than from a spec (the GPU's float16), for the advice of a dtype mismatch."""
    check_dtypes(q, k, v, dtype, rebuild)
    if q.ndim not in (3, 4) or q.shape[-2:] != (shape.seq_len, shape.head_dim):
        raise ValueError(_shape_message("q", q.shape, shape))
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v shapes differ: {q.shape}, {k.shape}, {v.shape}")


def check_dtypes(q, k, v, dtype: str | None = None, rebuild: dict | None = None) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"{name} must be an array (jax or numpy), got {type(x).__name__}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating array, got dtype {x.dtype}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if dtype is not None and q.dtype != jnp.dtype(dtype):
        raise TypeError(
            f"this kernel was compiled for {dtype} (the spec's attention.dtype); got q, k, v "
            f"of dtype {q.dtype}: {_dtype_advice(jnp.dtype(q.dtype).name, dtype, rebuild)}"
        )


def _dtype_advice(got: str, compiled: str, rebuild: dict | None) -> str:
    """Cast, or build a kernel for the operands' dtype in a way that exists: a spec names only
    SPEC_DTYPES (float16 is refused there)."""
    cast = f"cast them (x.astype(jnp.{compiled}))"
    if got in SPEC_DTYPES:
        return f"{cast}, or compile a spec with attention.dtype: {got}"
    if rebuild and got in rebuild:
        return f"{cast}, or {rebuild[got]}"
    return f"{cast}; a spec's attention.dtype is one of {', '.join(SPEC_DTYPES)}"


def distinct_layouts(patterns) -> tuple[list[TokenLayout], np.ndarray]:
    """The patterns' token layouts, each once in first-use order, and each pattern's index
    into them (int32; NumPy: importing a generated module must not start a JAX backend)."""
    layouts: list[TokenLayout] = []
    for p in patterns:
        if p.layout not in layouts:
            layouts.append(p.layout)
    return layouts, np.asarray([layouts.index(p.layout) for p in patterns], np.int32)


@dataclasses.dataclass(frozen=True)
class StaticCall:
    """One whole-sequence call's options, checked: what a backend's `_static_call` reads.
    One object, so that the option list is written once for every backend."""

    head_pattern: object  # as the caller gave it (None: the module's default)
    interpret: object  # False, True or pltpu.InterpretParams
    sm_scale: float
    token_order: str  # one of TOKEN_ORDERS
    segment_ids: object  # run-time inputs (svgen.runtime.segments), or None
    text_lengths: object
    amount: object  # the selection's top_k / top_p (svgen.runtime.select), or None

    @property
    def in_kernel_order(self) -> bool:
        return self.token_order == "kernel"


class Attention:
    """A generated module's `attention(q, k, v, *, head_pattern=None, interpret=False,
    sm_scale=None, token_order="user"[, segment_ids=None][, text_lengths=None][,
    q_frame_offset=None][, top_k= | top_p=, return_selection=False])`, TPU and GPU alike.

    What every backend shares lives here: the call's checks, each head's pattern and layout,
    the dispatch of a KV-cache chunk's call (q_frame_offset), the moves between the user's
    and the kernel's token order (`to_kernel_order`, `from_kernel_order`), and the docstring
    and signature `help(module.attention)` shows. A backend (svgen.runtime.kernel's
    `TpuAttention`, svgen.runtime.gpu's `GpuAttention`) runs its kernel: `_static_call`
    (the whole sequence: o and the call's selection, svgen.runtime.select.Selected or None),
    `_chunk_call` (one chunk's rows), `_order_mover`.

    Public attributes: `tables` (the kernel's static tables), `runtime`, `kv_cache` and
    `select` (the spec's run-time inputs, chunks and selection policy, or their absence).
    """

    words: BackendWords  # the backend's, for the docstring
    any_dtype = "any floating dtype"  # what q, k, v may be where the spec names no dtype

    def __init__(
        self,
        shape: KernelShape,
        patterns,
        *,
        tables,
        default_head_pattern: Sequence[int] | None,
        dtype: str | None,
        runtime: segments.RuntimeInputs,
        kv_cache: "chunks.KvCache | None",
        select: "select_policy.Selection | None",
    ):
        self.shape, self.patterns, self.tables = shape, tuple(patterns), tables
        self.default_head_pattern, self.dtype = default_head_pattern, dtype
        if kv_cache is not None and (runtime.any or select is not None):
            # A chunked call has no path for them: every call would drop them silently.
            raise ValueError(
                "runtime.kv_cache: a chunked call takes no run-time segments, text lengths "
                "or selection (the spec reader refuses them beside kv_cache)"
            )
        self.runtime, self.kv_cache, self.select = runtime, kv_cache, select
        self.layouts, self.layout_of_pattern = distinct_layouts(self.patterns)
        # A chunked call's shape: with a rolling cache the kv side is the cache, not the
        # sequence (svgen.runtime.chunks).
        self.chunk_shape = shape if kv_cache is None else kv_cache.call_shape(shape)
        self.__doc__ = attention_doc(
            shape,
            dtype,
            [p.name for p in self.patterns],
            default_head_pattern,
            words=self.words,
            any_dtype=self.any_dtype,
            runtime=runtime,
            text_tokens=self.layouts[0].text_tokens,
            kv_cache=kv_cache,
            select=select,
        )
        segments.declared_signature(
            self, runtime, kv_cache is not None, None if select is None else select.policy.rule
        )

    def __call__(
        self,
        q,
        k,
        v,
        *,
        head_pattern=None,
        interpret=False,
        sm_scale=None,
        token_order="user",
        segment_ids=None,
        text_lengths=None,
        q_frame_offset=None,
        top_k=None,
        top_p=None,
        return_selection=False,
    ):
        amount = select_policy.call_amount(self.select, top_k, top_p)
        select_policy.check_return_selection(self.select, return_selection)
        if q_frame_offset is not None:
            # Before the chunk's own checks: a chunked module declares no run-time inputs
            # (__init__), so any given here is refused as the full-sequence call refuses it.
            segments.check_declared(self.runtime, segment_ids, text_lengths)
            return self._chunked(
                q, k, v, q_frame_offset, head_pattern, interpret, sm_scale, token_order
            )
        check_operands(q, k, v, self.shape, self.dtype, rebuild=self._rebuild)
        check_token_order(token_order)
        self._check_call_dtype(q)
        sm_scale = checked_sm_scale(sm_scale, self.shape.head_dim)
        call = StaticCall(
            head_pattern, interpret, sm_scale, token_order, segment_ids, text_lengths, amount
        )
        out, chosen = self._static_call(q, k, v, call)
        if not return_selection:
            return out
        return out, chosen.blocks.reshape(q.shape[:-2] + chosen.blocks.shape[-2:])

    def resolved(self, head_pattern, heads: int):
        """(static_pattern, head_pattern, head_layout) of a call: the head -> pattern
        assignment as NumPy when concrete (else None), as an int32 array, and each head's
        layout index."""
        static_pattern, head_pattern = resolve_head_pattern(
            head_pattern, self.default_head_pattern, heads, self.shape.heads, len(self.patterns)
        )
        return static_pattern, head_pattern, jnp.asarray(self.layout_of_pattern)[head_pattern]

    def to_kernel_order(self, x, *, head_pattern=None, interpret=False):
        """x [..., heads, seq, d] in the user's token order -> each head's kernel order."""
        mover = self._checked_mover(x, head_pattern, interpret)
        return x if mover is None else mover(x, to_kernel=True)

    def from_kernel_order(self, y, *, head_pattern=None, interpret=False):
        """The inverse of to_kernel_order."""
        mover = self._checked_mover(y, head_pattern, interpret)
        return y if mover is None else mover(y, to_kernel=False)

    # ------------------------------------------------------------------ for the backends
    _rebuild: dict | None = None  # dtype name -> how to build a kernel for it (check_dtypes)

    def _check_call_dtype(self, q) -> None:
        """A backend's own dtype rule, past the spec's (none by default)."""

    def _checked_mover(self, x, head_pattern, interpret):
        check_order_operand(x, self.shape)
        static_pattern, _, head_layout = self.resolved(head_pattern, x.shape[-3])
        return self._order_mover(static_pattern, head_layout, interpret)

    def _chunked(self, q, k, v, q_frame_offset, head_pattern, interpret, sm_scale, token_order):
        """A KV-cache chunk's call: q holds one chunk's rows, k and v the whole sequence's."""
        kv_cache = self.kv_cache
        if kv_cache is None:
            raise TypeError(
                "q_frame_offset: this module was compiled without `runtime: {kv_cache: "
                "{chunk_frames: C}}` in its spec; add it and run svgen compile again"
            )
        check_dtypes(q, k, v, self.dtype, rebuild=self._rebuild)
        self._check_call_dtype(q)
        chunks.check_chunk_operands(q, k, v, kv_cache, self.shape.seq_len, self.shape.head_dim)
        check_token_order(token_order)  # frame-major only: the user's order is the kernel's
        sm_scale = checked_sm_scale(sm_scale, self.shape.head_dim)
        position, valid = chunks.chunk_position(q_frame_offset, kv_cache)
        requested = head_pattern
        _, head_pattern, _ = self.resolved(head_pattern, q.shape[-3])
        flat = [x.reshape((-1,) + x.shape[-2:]) for x in (q, k, v)]
        defined = chunks.defined_rows(requested, valid, len(self.patterns), flat[0].shape[0])
        out = self._chunk_call(*flat, head_pattern, position, defined, interpret, sm_scale)
        return out.reshape(q.shape)

    def _static_call(self, q, k, v, call: StaticCall):
        raise NotImplementedError

    def _chunk_call(self, q, k, v, head_pattern, position, defined, interpret, sm_scale):
        raise NotImplementedError

    def _order_mover(self, static_pattern, head_layout, interpret):
        raise NotImplementedError
