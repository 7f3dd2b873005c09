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
entries with the online-softmax state (m, l, acc) in f32 registers:

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

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from svgen.runtime.coords import TokenCoords
from svgen.runtime.calls import (
    Attention,
    StaticCall,
    per_head_layout,
    poison_unknown_patterns,
)
from svgen.runtime.softmax import LOG2_E, MASK_VALUE
from svgen.runtime import chunks, segments
from svgen.runtime import select as select_policy
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.runtime.segments import KEY_PADDING_ID, QUERY_PADDING_ID
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


@dataclasses.dataclass(frozen=True)
class _PatternCode:
    boundary_mask: object
    layout: TokenLayout
    query_coords: tuple[str, ...]


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


# One function on purpose (~160 lines): a Pallas Triton kernel body; its FULL and BOUNDARY
# loops close over the same refs and carried (m, l, acc), as in the TPU forward kernel.
def _attention_kernel(
    hp_ref,
    offsets_ref,
    entries_ref,
    q_ref,
    k_ref,
    v_ref,
    *refs,
    patterns: tuple[_PatternCode, ...],
    heads: int,
    seq_len: int,
    block_q: int,
    block_kv: int,
    num_q_tiles: int,
    q_scale: float,
    segments: bool = False,
    chunk_rows: int = 0,
    q_len: int | None = None,
    per_row: int = 0,
    ring_sink: int | None = None,
    per_video: bool = False,
):
    """per_video: per-video frames (svgen.runtime.video_frames): a third id input holds each
    token's frame shift, the tables are the patterns' supersets, and every visited tile runs
    its pattern's mask at the shifted frames with the ids compared (no FULL path yet).
    per_row: a selection's per-row CSR tables (svgen.runtime.select) over that many rows
    (batch * heads): offsets holds each (row, q tile)'s first entry, then its end.
    segments: run-time segment ids follow v (query and key ids of the program's row,
    svgen.runtime.segments); the static tables stay, and a tile whose queries and keys are
    not all of one segment runs its branch with the ids compared too. chunk_rows: a KV-cache
    chunk's call over that many rows (svgen.runtime.chunks): q and o hold q_len rows, and
    an int32 [2 * rows] input follows v: per row its chunk position's first table pattern,
    then its first query token in the video. ring_sink: against a rolling cache whose sink
    ends at this token (seq_len is the cache's length): the input then also holds per row
    the ring's wrap and two key shifts (KvCache.ring_scalars, svgen.runtime.chunks), which map the
    slots of a masked tile to video keys."""
    *id_refs, o_ref = refs
    chunk_ref = id_refs.pop(0) if chunk_rows else None
    q_len = q_len or seq_len
    q_tile, row = pl.program_id(0), pl.program_id(1)
    pattern = hp_ref[lax.rem(row, heads)] if len(patterns) > 1 else 0
    table_pattern = pattern if chunk_ref is None else chunk_ref[row] + pattern
    if per_row:
        csr_row = row * num_q_tiles + q_tile
        begin, end = offsets_ref[csr_row], offsets_ref[per_row * num_q_tiles + csr_row]
    else:
        csr_row = table_pattern * num_q_tiles + q_tile
        begin, end = offsets_ref[csr_row], offsets_ref[csr_row + 1]

    q_pos = q_tile * block_q + lax.broadcasted_iota(jnp.int32, (block_q,), 0)
    q_in = q_pos < q_len
    # The video position of each query (a chunk's rows start at its first token).
    q_video = q_pos if chunk_ref is None else q_pos + chunk_ref[chunk_rows + row]
    q = plgpu.load(q_ref.at[pl.ds(q_tile * block_q, block_q), :], mask=q_in[:, None], other=0.0)
    q = (q.astype(jnp.float32) * q_scale).astype(q_ref.dtype)
    precision = lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None
    if segments:  # the q tile's ids, and the one id all its rows share (if any)
        q_ids = plgpu.load(
            id_refs[0].at[pl.ds(q_tile * block_q, block_q)], mask=q_in, other=QUERY_PADDING_ID
        )
        q_lo = jnp.min(jnp.where(q_in, q_ids, _INT32_MAX))
        q_hi = jnp.max(jnp.where(q_in, q_ids, _INT32_MIN))
    if per_video:  # frames counted from each token's video segment
        q_shift = plgpu.load(id_refs[2].at[pl.ds(q_tile * block_q, block_q)], mask=q_in, other=0)

    # Query coordinates each pattern's mask reads, decoded once per q tile.
    columns = []
    for p in patterns:
        coords = TokenCoords(q_video[:, None], p.layout)
        column = _QueryColumns(
            {c: c(coords) if callable(c) else getattr(coords, c) for c in p.query_coords}
        )
        columns.append(ShiftedFrames(column, q_shift[:, None]) if per_video else column)

    def masked(p: _PatternCode, q_coords: _QueryColumns, k_pos, k_in, scores, k_shift=None):
        if ring_sink is not None:  # a rolling cache's slots -> the video keys they hold
            k_pos = chunks.slot_keys(k_pos, ring_sink, chunk_ref, chunk_rows, row)
        k_coords = TokenCoords(k_pos[None, :], p.layout)
        if k_shift is not None:
            k_coords = ShiftedFrames(k_coords, k_shift[None, :])
        keep = p.boundary_mask(q_coords, k_coords)
        keep = jnp.broadcast_to(keep, scores.shape) & k_in[None, :]
        return jnp.where(keep, scores, MASK_VALUE)

    def padding(k_in, scores):
        return jnp.where(k_in[None, :], scores, MASK_VALUE)

    def body(index, state):
        m_prev, l_prev, acc_prev = state
        entry = entries_ref[index]
        kv_tile = lax.shift_right_logical(entry, KV_BLOCK_SHIFT)
        kind = entry & KIND_MASK
        start = kv_tile * block_kv
        k_pos = start + lax.broadcasted_iota(jnp.int32, (block_kv,), 0)
        k_in = k_pos < seq_len
        k = plgpu.load(k_ref.at[pl.ds(start, block_kv), :], mask=k_in[:, None], other=0.0)
        v = plgpu.load(v_ref.at[pl.ds(start, block_kv), :], mask=k_in[:, None], other=0.0)
        k_shift = None
        if segments:
            k_ids = plgpu.load(
                id_refs[1].at[pl.ds(start, block_kv)], mask=k_in, other=KEY_PADDING_ID
            )
        if per_video:
            k_shift = plgpu.load(id_refs[2].at[pl.ds(start, block_kv)], mask=k_in, other=0)
        scores = lax.dot_general(
            q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32, precision=precision
        )
        # 0: FULL, no mask at all; [1: FULL holding padding keys;] then BOUNDARY, one branch
        # per pattern.
        branches = [lambda s: s]
        # int32 scalars, never Python ones: the Triton lowering of select_n gives a weak-typed
        # literal operand the predicate's type (i1), which fails verification.
        full = jnp.int32(0)
        if seq_len % block_kv:  # the last kv tile holds padding keys
            branches.append(functools.partial(padding, k_in))
            full = jnp.where(start + block_kv > seq_len, jnp.int32(1), full)
        branch = jnp.where(kind == TileKind.BOUNDARY, jnp.int32(len(branches)) + pattern, full)
        branches += [
            functools.partial(masked, p, c, k_pos, k_in, k_shift=k_shift)
            for p, c in zip(patterns, columns)
        ]
        if per_video:  # the superset's kinds are not the mask's: every tile masked
            branch = jnp.int32(len(branches) - len(patterns)) + pattern
        if segments:
            # Each branch again with the ids compared, for a tile not inside one segment.
            k_lo = jnp.min(jnp.where(k_in, k_ids, _INT32_MAX))
            k_hi = jnp.max(jnp.where(k_in, k_ids, _INT32_MIN))
            one_segment = (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)
            if per_video:
                one_segment = jnp.bool_(False)
            same = q_ids[:, None] == k_ids[None, :]
            branches += [functools.partial(_same_segment, b, same) for b in branches]
            branch = jnp.where(one_segment, branch, branch + jnp.int32(len(branches) // 2))
        scores = lax.switch(branch, branches, scores)
        m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1))
        # A row with no allowed key so far has m_next == MASK_VALUE and exp2(0) = 1 on its
        # masked scores; the first allowed key rescales that away (alpha = 0), and a row that
        # never gets one is zeroed at the end (as in the TPU kernel).
        probs = jnp.exp2(scores - m_next[:, None])
        alpha = jnp.exp2(m_prev - m_next)
        l_next = alpha * l_prev + jnp.sum(probs, axis=1)
        pv = lax.dot_general(
            probs.astype(v.dtype),
            v,
            (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
            precision=precision,
        )
        return m_next, l_next, alpha[:, None] * acc_prev + pv

    d = q_ref.shape[-1]
    state = (
        jnp.full((block_q,), MASK_VALUE, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
        jnp.zeros((block_q, d), jnp.float32),
    )
    m, l, acc = lax.fori_loop(begin, end, body, state)
    seen = m > 0.5 * MASK_VALUE  # rows that saw no allowed key are 0, never NaN
    inv = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)
    plgpu.store(
        o_ref.at[pl.ds(q_tile * block_q, block_q), :],
        (acc * inv[:, None]).astype(o_ref.dtype),
        mask=q_in[:, None],
    )


def _same_segment(branch, same, scores):
    """A branch's scores, then only the pairs of one segment."""
    return jnp.where(same, branch(scores), MASK_VALUE)


def _gpu_call(
    q,
    k,
    v,
    head_pattern,
    tables: GpuTables,
    patterns: tuple[_PatternCode, ...],
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
    """selection: a selection's per-row CSR tables (offsets, entries), svgen.runtime.select.
    q, k, v: [batch*heads, seq_len, head_dim] in each head's kernel order; ids: run-time
    segments, (query ids, key ids[, frame shifts]) [batch*heads, seq_len] in the same order
    (per-video frames: `tables` are then the supersets'); chunk: a
    KV-cache chunk's call (q holds the chunk's rows, `tables` are the chunk positions'):
    int32 [2 * rows], per row its position's first table pattern, then its first token
    (with ring_sink, a rolling cache's: then its wrap and key shifts; seq_len the cache's)."""
    rows, q_len, d = q.shape
    heads = int(head_pattern.shape[0])
    kernel = functools.partial(
        _attention_kernel,
        patterns=patterns,
        heads=heads,
        seq_len=seq_len,
        block_q=tables.block_q,
        block_kv=tables.block_kv,
        num_q_tiles=tables.num_q_tiles,
        q_scale=q_scale,
        segments=ids is not None,
        chunk_rows=0 if chunk is None else rows,
        q_len=q_len,
        per_row=0 if selection is None else rows,
        ring_sink=ring_sink,
        per_video=ids is not None and len(ids) == 3,
    )
    offsets = jnp.asarray(tables.row_offsets)
    entries = jnp.asarray(tables.entries)
    if selection is not None:
        offsets, entries = selection

    def whole(x):  # a table, the same block for every program
        return pl.BlockSpec(x.shape, lambda i, r: (0,))

    head_rows = pl.BlockSpec((None, seq_len, d), lambda i, r: (r, 0, 0))
    q_rows = pl.BlockSpec((None, q_len, d), lambda i, r: (r, 0, 0))
    id_rows = [pl.BlockSpec((None, seq_len), lambda i, r: (r, 0))] * len(ids or ())
    extra = () if chunk is None else (chunk,)
    if chunk is not None:
        id_rows = [whole(chunk)]
    if num_warps is None:
        num_warps = 4 if d <= 64 else 8
    return pl.pallas_call(
        kernel,
        grid=(tables.num_q_tiles, rows),
        in_specs=[whole(head_pattern), whole(offsets), whole(entries), q_rows]
        + [head_rows] * 2
        + id_rows,
        out_specs=q_rows,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="svgen_gpu_attention",
    )(head_pattern, offsets, entries, q, k, v, *(ids or ()), *extra)


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

    backend = "GPU"
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
            _PatternCode(p.boundary_mask, p.layout, tuple(p.query_coords)) for p in self.patterns
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
