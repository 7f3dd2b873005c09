"""Block-sparse flash attention on GPU: a hand-written Pallas Triton forward kernel over the
same per-pattern runs as the TPU kernel (svgen.runtime.forward).

A generated module's `_PATTERNS` (runs, layout, boundary_mask, query_coords) and `SHAPE` are
everything this backend needs: `gpu_attention_of(module)` or `make_gpu_attention(patterns,
shape, ...)` builds `attention(q, k, v, *, head_pattern=None, interpret=False,
sm_scale=None, token_order="user")` with the calling convention of the TPU one (and its
docstring, `help(module.attention)`). Forward only (no VJP yet).

GPU tiles and runs
------------------
A Triton program holds its tiles in registers, so GPU tiles are small (64 or 128 queries x
64 keys). The GPU tables (`svgen.core.gpu_tables`: CSR per (pattern, q tile), EMPTY tiles
never listed) are derived from a module's runs, never by evaluating the mask again: each GPU
tile inherits the kind of the compute block it lies in, so GPU tiles must divide the compute
blocks. A GPU module (`svgen compile --target h100`) is classified at the GPU tiles
themselves (compute block = GPU tile: every GPU tile has its own exact kind); a TPU module's
runs work too (`gpu_attention_of(tpu_module)`, GPU tiles dividing its 128-multiple compute
blocks), but then every GPU tile of a BOUNDARY compute block is visited with the mask.

Why divisors only, and not also GPU tiles spanning several compute blocks (kind = FULL if all
FULL, EMPTY if all EMPTY, else BOUNDARY)? Because of aligned masks (`tiling.align`): there a
FULL or EMPTY compute block may disagree with boundary_mask (the aligned mask *is* the mask),
so a GPU tile straddling an aligned block and a BOUNDARY block would evaluate the exact
predicate over the aligned block and be wrong. With divisors the kernel computes exactly what
the runs say, block by block, for every spec.

Padding keys: the GPU kv tile that holds seq_len - 1 may reach past it. The compiler never
makes a compute block holding padding FULL, but the kernel does not rely on it: a FULL entry
on that tile still masks keys >= seq_len (a branch of its own, see below), and a BOUNDARY
entry always does.

Kernel
------
Grid (q tiles, batch * heads): one program per (q tile, head row). Q tiles vary fastest, so
programs running together share their head's K and V in L2, and any sequence fits (grid x
takes 2^31 - 1 q tiles, grid y 65,535 rows of batch * heads). A program reads its head's
pattern (head_pattern, an int32 [heads] input: traced assignments work, one pallas_call for
all heads) and its CSR row's [begin, end), and runs `lax.fori_loop(begin, end)` over the
entries with the online-softmax state (m, l, acc) in f32 registers. Every static choice of
a call (its tables' source, run-time ids, a chunk, a rolling cache) is one `GpuVariant`
(svgen.runtime.gpu_variant): the kernel unpacks its refs by the variant's operand names,
the call builder makes its BlockSpecs from the same operands, and the switch's branches are
the variant's, by name. Its phases are the functions below `_attention_kernel`:

  * q is loaded once, masked past seq_len, and pre-scaled by sm_scale * log2(e) (scores come
    out in base 2: exp2, as on TPU); f32 operands use Precision.HIGHEST, which the Triton
    lowering turns into IEEE dots (the default would be TF32);
  * K and V tiles are loaded at the loop's top level (not inside a branch, so Triton's
    pipeliner may prefetch them), masked past seq_len with zeros (0 * garbage would be NaN);
  * one `lax.switch` per entry picks the score transform: a FULL tile: the scores
    untouched, no mask at all; a FULL tile reaching past seq_len (a branch that exists only
    when seq_len is not a multiple of block_kv): only `k < seq_len`; a BOUNDARY tile under
    pattern p: its `boundary_mask(q_coords, k_coords)` and
    `k < seq_len`. With several patterns that is one branch per pattern, each evaluating only
    its own mask, selected by a scalar uniform over the program (head_pattern of the
    program's head), so nothing diverges; the Triton lowering turns the switch into a chain
    of scf.if;
  * coordinates: the query coordinates a pattern's mask reads (`Pattern.query_coords`) are
    decoded once per q tile, before the loop, as [block_q, 1] columns (TokenCoords on the
    positions as a column; the TPU's QueryCoords row-form-and-transpose trick is a vreg
    layout matter with no use here); key coordinates are decoded per BOUNDARY tile as
    [1, block_kv] rows with coords.TokenCoords. TokenCoords lowers to Triton as it is:
    lax.div / lax.rem (divsi / remsi on non-negative values), clamps (min/max),
    jnp.where (select), bitcast int32 -> uint32 and unsigned compares (coords.within);
  * finalize: rows whose running max never left MASK_VALUE saw no allowed key and are 0,
    never NaN; rows past seq_len are not stored (masked store).

Requirements: block_q, block_kv and head_dim powers of two, at least 16 (Triton tensor shapes
and tl.dot), the GPU tile dividing the compute block; dtypes float32, bfloat16, float16 (a
spec names float32 or bfloat16, and a generated GPU module's kernel takes that dtype only;
float16 runs through `gpu_attention_of(module, dtype="float16")`).
Tables, q, k, v and o are plain pallas_call operands (Triton has no scalar prefetch): the
tables as whole-array blocks read with scalar loads, q, k, v, o as one head's whole
[seq_len, head_dim] block each, sliced with pl.ds and masked loads / stores (a Triton block
past the array's end would read out of bounds, so no block is ever partial).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from svgen.runtime.coords import TokenCoords
from svgen.runtime.calls import (
    Attention,
    BackendWords,
    StaticCall,
    per_head_layout,
    poison_unknown_patterns,
)
from svgen.runtime.softmax import LOG2_E, MASK_VALUE
from svgen.runtime import chunks, gpu_variant, segments
from svgen.runtime import select as select_policy
from svgen.core.kinds import TileKind
from svgen.runtime.gpu_variant import GpuVariant
from svgen.runtime.segments import KEY_PADDING_ID, QUERY_PADDING_ID
from svgen.runtime.variant import PatternCode
from svgen.runtime.video_frames import ShiftedFrames
from svgen.core.gpu_tables import GpuTables, gpu_tile_kinds  # noqa: F401  (re-exported)
from svgen.core.tables import KIND_MASK, KV_BLOCK_SHIFT, KernelShape, Pattern

DTYPES = ("float32", "bfloat16", "float16")
# How to get a kernel for a dtype that no spec names (a spec's attention.dtype is float32 or
# bfloat16), for the advice of a dtype mismatch.
_REBUILD = {
    "float16": 'build one for it: svgen.runtime.gpu.gpu_attention_of(module, dtype="float16")'
}
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_KV = 64


# -- kernel ---------------------------------------------------------------------------------


class _QueryColumns:
    """A q tile's query coordinates, decoded before the loop as [block_q, 1] columns."""

    def __init__(self, values: dict):
        self._values = values

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(
                f"query coordinate {name!r} was not decoded for this mask "
                f"(decoded: {tuple(self._values)})"
            ) from None

    def once(self, function):
        """A query function's value, computed with the coordinates before the loop."""
        if function not in self._values:
            raise AttributeError(f"query function {function.__name__} was not decoded")
        return self._values[function]


_INT32_MAX = np.iinfo(np.int32).max
_INT32_MIN = np.iinfo(np.int32).min


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


class _Queries(NamedTuple):
    """A program's q tile: q pre-scaled [block_q, d], which rows are real (q_in), their video
    positions, and with run-time segments their ids and the range of those ids (lo == hi: one
    segment), with per-video frames their frame shifts."""

    q: jax.Array
    q_in: jax.Array
    video: jax.Array
    ids: jax.Array | None = None
    lo: jax.Array | None = None
    hi: jax.Array | None = None
    shift: jax.Array | None = None


class _Keys(NamedTuple):
    """One CSR entry's kv tile: its kind, first key, key positions, which are real (k_in), the
    K and V tiles, and with run-time segments their ids (and frame shifts)."""

    kind: jax.Array
    start: jax.Array
    pos: jax.Array
    k_in: jax.Array
    k: jax.Array
    v: jax.Array
    ids: jax.Array | None = None
    shift: jax.Array | None = None


def _attention_kernel(*refs, variant: GpuVariant):
    """One program: a (q tile, row) pair walking its CSR row's entries with the online
    softmax state (m, l, acc) in f32 registers; the phases are the functions below."""
    refs = variant.unpack(refs)
    q_tile, row = pl.program_id(0), pl.program_id(1)
    pattern, begin, end = _csr_range(variant, refs, q_tile, row)
    queries = _load_queries(variant, refs, q_tile, row)
    columns = _query_columns(variant, queries)
    precision = lax.Precision.HIGHEST if refs.q.dtype == jnp.float32 else None

    def body(index, state):
        keys = _load_keys(variant, refs, refs.entries[index])
        scores = _scores(variant, queries.q, keys.k, precision)
        branches = _score_transforms(variant, refs, row, columns, queries, keys)
        scores = lax.switch(_branch_of(variant, queries, keys, pattern), branches, scores)
        return _online_update(variant, state, scores, keys.v, precision)

    state = lax.fori_loop(begin, end, body, _initial_state(variant))
    _store(variant, refs, q_tile, queries.q_in, state)


def _csr_range(variant: GpuVariant, refs, q_tile, row):
    """(the program's pattern, the first and the end of its CSR row's entries)."""
    pattern = refs.head_pattern[lax.rem(row, variant.heads)] if len(variant.patterns) > 1 else 0
    if variant.per_row:  # a selection: offsets holds each (row, q tile)'s first, then its end
        csr_row = row * variant.num_q_tiles + q_tile
        return (
            pattern,
            refs.offsets[csr_row],
            refs.offsets[variant.per_row * variant.num_q_tiles + csr_row],
        )
    # A chunk's tables are its position's: the row's first table pattern comes first.
    table_pattern = pattern if refs.chunk is None else refs.chunk[row] + pattern
    csr_row = table_pattern * variant.num_q_tiles + q_tile
    return pattern, refs.offsets[csr_row], refs.offsets[csr_row + 1]


def _load_queries(variant: GpuVariant, refs, q_tile, row) -> _Queries:
    """The q tile, masked past q_len and pre-scaled by sm_scale * log2(e) (scores come out in
    base 2), with its video positions (a chunk's rows start at its first token) and ids."""
    block_q = variant.block_q
    pos = q_tile * block_q + lax.broadcasted_iota(jnp.int32, (block_q,), 0)
    q_in = pos < variant.q_len
    video = pos if refs.chunk is None else pos + refs.chunk[variant.chunk_rows + row]
    q = plgpu.load(refs.q.at[pl.ds(q_tile * block_q, block_q), :], mask=q_in[:, None], other=0.0)
    q = (q.astype(jnp.float32) * variant.q_scale).astype(refs.q.dtype)
    if not variant.segments:
        return _Queries(q, q_in, video)
    tile = pl.ds(q_tile * block_q, block_q)
    ids = plgpu.load(refs.q_ids.at[tile], mask=q_in, other=QUERY_PADDING_ID)
    lo = jnp.min(jnp.where(q_in, ids, _INT32_MAX))
    hi = jnp.max(jnp.where(q_in, ids, _INT32_MIN))
    shift = None
    if variant.frame_shifts:  # frames counted from each token's video segment
        shift = plgpu.load(refs.frame_shifts.at[tile], mask=q_in, other=0)
    return _Queries(q, q_in, video, ids, lo, hi, shift)


def _query_columns(variant: GpuVariant, queries: _Queries) -> list:
    """Per pattern, the query coordinates its mask reads, decoded once per q tile as
    [block_q, 1] columns (at the shifted frames with per-video frames)."""
    columns = []
    for p in variant.patterns:
        coords = TokenCoords(queries.video[:, None], p.layout)
        column = _QueryColumns(
            {c: c(coords) if callable(c) else getattr(coords, c) for c in p.query_coords}
        )
        shifted = queries.shift is not None
        columns.append(ShiftedFrames(column, queries.shift[:, None]) if shifted else column)
    return columns


def _load_keys(variant: GpuVariant, refs, entry) -> _Keys:
    """The entry's kv tile. K and V are loaded at the loop's top level, not inside a branch,
    so that Triton's pipeliner may prefetch them; masked past seq_len with zeros (0 * garbage
    would be NaN)."""
    block_kv = variant.block_kv
    kv_tile, kind = lax.shift_right_logical(entry, KV_BLOCK_SHIFT), entry & KIND_MASK
    start = kv_tile * block_kv
    pos = start + lax.broadcasted_iota(jnp.int32, (block_kv,), 0)
    k_in = pos < variant.seq_len
    tile = pl.ds(start, block_kv)
    k = plgpu.load(refs.k.at[tile, :], mask=k_in[:, None], other=0.0)
    v = plgpu.load(refs.v.at[tile, :], mask=k_in[:, None], other=0.0)
    keys = _Keys(kind, start, pos, k_in, k, v)
    if not variant.segments:
        return keys
    ids = plgpu.load(refs.k_ids.at[tile], mask=k_in, other=KEY_PADDING_ID)
    shift = None
    if variant.frame_shifts:
        shift = plgpu.load(refs.frame_shifts.at[tile], mask=k_in, other=0)
    return keys._replace(ids=ids, shift=shift)


def _scores(variant: GpuVariant, q, k, precision):
    """q k^T in f32 (f32 operands as IEEE dots: the default would be TF32)."""
    dims = (((1,), (1,)), ((), ()))
    scores = lax.dot_general(q, k, dims, preferred_element_type=jnp.float32, precision=precision)
    assert scores.shape == (variant.block_q, variant.block_kv), scores.shape
    return scores


def _score_transforms(variant: GpuVariant, refs, row, columns, queries, keys) -> list:
    """The switch's branches in the variant's order (GpuVariant.branches), each a function of
    the scores."""

    def masked(p: PatternCode, q_coords, scores):
        k_pos = keys.pos
        if variant.ring_sink is not None:  # a rolling cache's slots -> the video keys they hold
            k_pos = chunks.slot_keys(k_pos, variant.ring_sink, refs.chunk, variant.chunk_rows, row)
        k_coords = TokenCoords(k_pos[None, :], p.layout)
        if keys.shift is not None:
            k_coords = ShiftedFrames(k_coords, keys.shift[None, :])
        keep = p.boundary_mask(q_coords, k_coords)
        keep = jnp.broadcast_to(keep, scores.shape) & keys.k_in[None, :]
        return jnp.where(keep, scores, MASK_VALUE)

    plain = {
        gpu_variant.FULL: lambda scores: scores,
        gpu_variant.FULL_PADDING: lambda s: jnp.where(keys.k_in[None, :], s, MASK_VALUE),
    }
    for index, (p, c) in enumerate(zip(variant.patterns, columns)):
        plain[gpu_variant.boundary(index)] = functools.partial(masked, p, c)
    if variant.segments:
        same = queries.ids[:, None] == keys.ids[None, :]
        for name, branch in list(plain.items()):
            plain[gpu_variant.SEGMENT + name] = functools.partial(_same_segment, branch, same)
    return [plain[name] for name in variant.branches()]


def _same_segment(branch, same, scores):
    """A branch's scores, then only the pairs of one segment."""
    return jnp.where(same, branch(scores), MASK_VALUE)


def _branch_of(variant: GpuVariant, queries: _Queries, keys: _Keys, pattern):
    """The entry's branch index among GpuVariant.branches. int32 scalars, never Python ones:
    the Triton lowering of select_n gives a weak-typed literal operand the predicate's type
    (i1), which fails verification."""
    first_boundary = jnp.int32(variant.first_boundary)
    if variant.frame_shifts:  # the superset's kinds are not the mask's: every tile masked
        branch = first_boundary + pattern
    else:
        full = jnp.int32(0)
        if variant.pads_last_tile:  # the last kv tile holds padding keys
            full = jnp.where(keys.start + variant.block_kv > variant.seq_len, jnp.int32(1), full)
        branch = jnp.where(keys.kind == TileKind.BOUNDARY, first_boundary + pattern, full)
    if not variant.segments:
        return branch
    # A tile whose queries and keys are not all of one segment compares the ids.
    one_segment = jnp.bool_(False)
    if not variant.frame_shifts:
        k_lo = jnp.min(jnp.where(keys.k_in, keys.ids, _INT32_MAX))
        k_hi = jnp.max(jnp.where(keys.k_in, keys.ids, _INT32_MIN))
        one_segment = (queries.lo == queries.hi) & (k_lo == k_hi) & (queries.lo == k_lo)
    twin = jnp.int32(len(variant.branches()) // 2)
    return jnp.where(one_segment, branch, branch + twin)


def _initial_state(variant: GpuVariant):
    return (
        jnp.full((variant.block_q,), MASK_VALUE, jnp.float32),
        jnp.zeros((variant.block_q,), jnp.float32),
        jnp.zeros((variant.block_q, variant.head_dim), jnp.float32),
    )


def _online_update(variant: GpuVariant, state, scores, v, precision):
    """The online softmax's step. A row with no allowed key so far has m_next == MASK_VALUE
    and exp2(0) = 1 on its masked scores; the first allowed key rescales that away (alpha =
    0), and a row that never gets one is zeroed at the end (as in the TPU kernel)."""
    m_prev, l_prev, acc_prev = state
    m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1))
    probs = jnp.exp2(scores - m_next[:, None])
    alpha = jnp.exp2(m_prev - m_next)
    l_next = alpha * l_prev + jnp.sum(probs, axis=1)
    dims = (((1,), (0,)), ((), ()))
    pv = lax.dot_general(
        probs.astype(v.dtype), v, dims, preferred_element_type=jnp.float32, precision=precision
    )
    assert pv.shape == (variant.block_q, variant.head_dim), pv.shape
    return m_next, l_next, alpha[:, None] * acc_prev + pv


def _store(variant: GpuVariant, refs, q_tile, q_in, state) -> None:
    """o = acc / l; rows that saw no allowed key are 0, never NaN; rows past q_len are not
    stored (a masked store)."""
    m, l, acc = state  # noqa: E741 (the softmax's row sum: its name in every paper)
    seen = m > 0.5 * MASK_VALUE
    inv = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)
    tile = pl.ds(q_tile * variant.block_q, variant.block_q)
    plgpu.store(refs.o.at[tile, :], (acc * inv[:, None]).astype(refs.o.dtype), mask=q_in[:, None])


def _gpu_call(
    q,
    k,
    v,
    head_pattern,
    tables: GpuTables,
    patterns: tuple[PatternCode, ...],
    *,
    seq_len: int,
    q_scale: float,
    interpret,
    num_warps: int | None,
    num_stages: int | None,
    ids=None,
    chunk=None,
    selection=None,
    ring_sink: int | None = None,
):
    """The pallas_call of one GPU kernel, its BlockSpecs made from its variant's operands.
    selection: a selection's per-row CSR tables (offsets, entries), svgen.runtime.select.
    q, k, v: [batch*heads, seq_len, head_dim] in each head's kernel order; ids: run-time
    segments, (query ids, key ids[, frame shifts]) [batch*heads, seq_len] in the same order
    (per-video frames: `tables` are then the supersets'); chunk: a
    KV-cache chunk's call (q holds the chunk's rows, `tables` are the chunk positions'):
    int32 [2 * rows], per row its position's first table pattern, then its first token
    (with ring_sink, a rolling cache's: then its wrap and key shifts; seq_len the cache's)."""
    rows, q_len, d = q.shape
    source = "chunk" if chunk is not None else "selection" if selection is not None else None
    variant = GpuVariant(
        patterns=patterns,
        heads=int(head_pattern.shape[0]),
        rows=rows,
        seq_len=seq_len,
        q_len=q_len,
        head_dim=d,
        block_q=tables.block_q,
        block_kv=tables.block_kv,
        num_q_tiles=tables.num_q_tiles,
        q_scale=q_scale,
        tables=source or ("segments" if ids is not None else "static"),
        frame_shifts=ids is not None and len(ids) == 3,
        ring_sink=ring_sink,
    )
    offsets, entries = selection or (jnp.asarray(tables.row_offsets), jnp.asarray(tables.entries))
    values = (
        head_pattern,
        offsets,
        entries,
        q,
        k,
        v,
        *(ids or ()),
        *(() if chunk is None else (chunk,)),
    )
    inputs = [o for o in variant.operands() if o.role == "input"]
    assert len(inputs) == len(values), ([o.name for o in inputs], len(values))
    (output,) = [o for o in variant.operands() if o.role == "output"]
    if num_warps is None:
        num_warps = 4 if d <= 64 else 8
    return pl.pallas_call(
        functools.partial(_attention_kernel, variant=variant),
        grid=(tables.num_q_tiles, rows),
        in_specs=[_block_spec(o, x) for o, x in zip(inputs, values)],
        out_specs=_block_spec(output, q),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="svgen_gpu_attention",
    )(*values)


def _block_spec(operand, value) -> pl.BlockSpec:
    """An operand's BlockSpec over the grid (q tile, row) by its index map (GpuVariant)."""
    if operand.index_map == "whole":
        zeros = (0,) * value.ndim
        return pl.BlockSpec(value.shape, lambda i, r: zeros)
    if operand.index_map in ("q_rows", "head_rows"):
        return pl.BlockSpec(operand.block, lambda i, r: (r, 0, 0))
    if operand.index_map == "id_rows":
        return pl.BlockSpec(operand.block, lambda i, r: (r, 0))
    raise ValueError(f"GPU operand {operand.name}: unknown index map {operand.index_map!r}")


class GpuAttention(Attention):
    """`attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None,
    token_order="user")` on GPU, with `to_kernel_order` / `from_kernel_order` (as the TPU
    one's, svgen.runtime.kernel.TpuAttention; XLA moves the heads).

    patterns, shape: a generated module's `_PATTERNS` and `SHAPE` (the runs are read at
    SHAPE's tiling); block_q x block_kv: the GPU tile (powers of two >= 16); dtype: q, k, v
    must have it (None: float32, bfloat16 or float16; a spec names float32 or bfloat16, and
    float16 is reached only here). q, k, v are [heads, seq, head_dim] or
    [batch, heads, seq, head_dim] in the user's token order; the output has q's shape and
    dtype. `head_pattern` (int [heads], may be traced) defaults to `default_head_pattern`.
    `interpret=True` runs the kernel in Pallas's interpreter (CPU, no CUDA). runtime: the
    spec's run-time inputs (segment_ids, text_lengths, as on TPU; the GPU kernel keeps its
    static tables and compares the ids in the tiles that are not inside one segment).
    kv_cache: the spec's KV-cache chunks (svgen.runtime.chunks): with q_frame_offset, q holds
    one chunk's rows against the whole sequence's k and v, as on TPU (CSR tables of every
    chunk position, at this module's tiles). select: the spec's selection policy
    (svgen.runtime.select): each call chooses blocks of SHAPE's compute grain (the GPU
    tiles' classification tiles) from q and k, and the kernel walks per-row CSR tables.
    """

    words = BackendWords(
        name="GPU",
        interpret="True runs the kernel in Pallas's interpreter, on the CPU; False compiles "
        "it\n    with Triton for the GPU.",
        grads="Forward only: no gradient yet on GPU.",
        chunk_grads="Forward only.",
    )
    any_dtype = " or ".join(DTYPES)
    _rebuild = _REBUILD

    def __init__(
        self,
        patterns: Sequence[Pattern],
        shape: KernelShape,
        *,
        block_q: int = DEFAULT_BLOCK_Q,
        block_kv: int = DEFAULT_BLOCK_KV,
        default_head_pattern: Sequence[int] | None = None,
        dtype: str | None = None,
        num_warps: int | None = None,
        num_stages: int | None = 2,
        runtime: segments.RuntimeInputs = segments.RuntimeInputs(),
        kv_cache: chunks.KvCache | None = None,
        select: "select_policy.Selection | None" = None,
    ):
        sizes = (("block_q", block_q), ("block_kv", block_kv), ("head_dim", shape.head_dim))
        for name, size in sizes:
            if not _is_power_of_two(size) or size < 16:
                raise ValueError(f"{name} must be a power of two >= 16 on GPU, got {size}")
        if dtype is not None and jnp.dtype(dtype).name not in DTYPES:
            raise ValueError(f"GPU kernels run {', '.join(DTYPES)}; got dtype {dtype}")
        super().__init__(
            shape,
            patterns,
            tables=GpuTables.from_runs([p.runs for p in patterns], shape, block_q, block_kv),
            default_head_pattern=default_head_pattern,
            dtype=dtype,
            runtime=runtime,
            kv_cache=kv_cache,
            select=select,
        )
        self.block_q, self.block_kv = block_q, block_kv
        self.num_warps, self.num_stages = num_warps, num_stages
        self.codes = tuple(
            PatternCode(p.boundary_mask, p.layout, tuple(p.query_coords)) for p in self.patterns
        )

    # ------------------------------------------------------------------ tables built late
    @functools.cache
    def call_tables(self) -> GpuTables:
        """The tables of a call with run-time ids: with per-video frames each pattern's
        superset (the union of its mask over every segment start, svgen.runtime.video_frames),
        built on the first such call so that importing a module stays cheap."""
        if not self.runtime.per_video_frames:
            return self.tables
        supersets = [
            p.runs if p.video_frames is None else p.video_frames.runs for p in self.patterns
        ]
        return GpuTables.from_runs(supersets, self.shape, self.block_q, self.block_kv)

    @functools.cache
    def chunk_tables(self) -> GpuTables:
        """Every chunk position's CSR tables (position-major), built on the first chunked call."""
        kv_cache = self.kv_cache
        runs = [
            kv_cache.runs_at(c, p)
            for c in range(kv_cache.positions)
            for p in range(len(self.patterns))
        ]
        return GpuTables.from_runs(
            runs, self.chunk_shape, self.block_q, self.block_kv, q_len=kv_cache.rows
        )

    # ------------------------------------------------------------------ calls
    def _check_call_dtype(self, q) -> None:
        if jnp.dtype(q.dtype).name not in DTYPES:
            raise TypeError(f"GPU kernels run {', '.join(DTYPES)}; got q, k, v of {q.dtype}")

    def _order_mover(self, static_pattern, head_layout, interpret):
        """XLA moves each head by its layout (`interpret` is the TPU wrapper's argument)."""

        def move(x, to_kernel: bool):
            return per_head_layout(x, self.layouts, head_layout, to_kernel=to_kernel)

        return move

    def _call_ids(self, segment_ids, text_lengths, batch, head_layout):
        """The call's (query, key) ids [batch*heads, seq] in each head's order, or None."""
        ids = segments.call_ids(self.runtime, segment_ids, text_lengths, batch, self.layouts)
        if ids is None:
            return None
        rows = (ids.query, ids.key) + (() if ids.shift is None else (ids.shift,))
        return tuple(segments.head_rows(x, head_layout)[:, 0] for x in rows)

    def _static_call(self, q, k, v, call: StaticCall):
        _, head_pattern, head_layout = self.resolved(call.head_pattern, q.shape[-3])
        batch = q.shape[0] if q.ndim == 4 else None
        ids = self._call_ids(call.segment_ids, call.text_lengths, batch, head_layout)
        lead = q.shape[:-2]
        mover = None
        if not call.in_kernel_order:
            mover = self._order_mover(None, head_layout, call.interpret)

        def to_kernel(x):
            if mover is not None:
                x = mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        qk, kk = to_kernel(q), to_kernel(k)
        chosen = selection = None
        if self.select is not None:
            chosen = self.select.select(qk, kk, float(call.sm_scale), call.amount)
            selection = self.select.gpu_tables(
                chosen.blocks, self.tables.block_q, self.tables.block_kv
            )
        out = _gpu_call(
            qk,
            kk,
            to_kernel(v),
            head_pattern,
            self.call_tables() if ids is not None else self.tables,
            self.codes,
            seq_len=self.shape.seq_len,
            q_scale=float(call.sm_scale) * LOG2_E,
            interpret=call.interpret,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
            ids=ids,
            selection=selection,
        )
        out = out.reshape(lead + (self.shape.seq_len, self.shape.head_dim))
        if mover is not None:
            out = mover(out, to_kernel=False)
        return poison_unknown_patterns(out, call.head_pattern, len(self.patterns)), chosen

    def _chunk_call(self, q, k, v, head_pattern, position, defined, interpret, sm_scale):
        kv_cache = self.kv_cache

        def kernel_call(q, k, v, hp, position, defined):
            rows = q.shape[0]
            scalars = [position * len(self.patterns), position * kv_cache.rows]
            scalars += kv_cache.ring_scalars(position)
            per_row = [jnp.broadcast_to(x, (rows,)).astype(jnp.int32) for x in scalars]
            out = _gpu_call(
                q,
                k,
                v,
                hp,
                self.chunk_tables(),
                self.codes,
                seq_len=self.chunk_shape.seq_len,
                q_scale=float(sm_scale) * LOG2_E,
                interpret=interpret,
                num_warps=self.num_warps,
                num_stages=self.num_stages,
                chunk=jnp.concatenate(per_row),
                ring_sink=kv_cache.ring_sink,
            )
            return jnp.where(defined[:, None, None], out, jnp.asarray(jnp.nan, out.dtype))

        return chunks.rows_folded(kernel_call)(q, k, v, head_pattern, position, defined)


#: What a generated GPU module calls to build its `attention`.
make_gpu_attention = GpuAttention


def gpu_attention_of(module, **options):
    """make_gpu_attention for a generated module (its _PATTERNS, SHAPE, HEAD_PATTERN, DTYPE);
    options: block_q, block_kv, num_warps, num_stages, dtype."""
    options.setdefault("dtype", getattr(module, "DTYPE", None))
    runtime = getattr(module.attention, "runtime", None)
    if runtime is not None:
        options.setdefault("runtime", runtime)
    kv_cache = getattr(module.attention, "kv_cache", None)
    if kv_cache is not None:
        options.setdefault("kv_cache", kv_cache)
    select = getattr(module.attention, "select", None)
    if select is not None:
        options.setdefault("select", select)
    return make_gpu_attention(
        module._PATTERNS,
        module.SHAPE,
        default_head_pattern=getattr(module, "HEAD_PATTERN", None),
        **options,
    )
