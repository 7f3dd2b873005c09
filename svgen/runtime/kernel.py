"""The invariant part of every svgen kernel: block-sparse flash attention over piece tables.

A generated module supplies only what depends on its spec: per candidate pattern its visited
tiles (runs), its token layout, `boundary_mask(q, k)` over token coordinates and the query
coordinates that mask reads; and the default assignment of heads to patterns. Everything here is shared, so diffs between generated files show only
spec-dependent code.

Two levels of tiles
-------------------
A *tile* (block_q x block_kv) is what one grid step brings into VMEM: few, large steps, so the
per-step bookkeeping (table reads, index maps, DMA issue) is amortized. A tile is cut into
*compute blocks* (compute_q x compute_kv): what one QK^T / PV matmul pair works on. Tiles and
compute blocks are both classified; a tile is
  FULL      every compute block FULL: one straight-line body, no mask, no branch;
  BOUNDARY  anything else: each compute block runs by its own kind (FULL without a mask,
            BOUNDARY with keep(q, k) computed from coordinates, EMPTY not at all), read from
            the tile's `blocks` word (2 bits per compute block, row-major);
  EMPTY     only a q tile with nothing visited: one step that writes zeros.

Grid and tables
---------------
The visited tiles of a pattern, sorted by q tile, are grouped into *pieces*: up to `slots`
consecutive kv tiles of one q tile, one kind and one `blocks` word. A grid step (.., piece,
slot) visits kv tile kv_start + slot of a piece. Two ways to walk the heads:

  per head  grid (batch*heads, max pieces over patterns, slots): head h walks local pieces
            0..max; with one pattern every head has exactly that many;
  flat      grid (batch, total pieces of all heads, slots), with several patterns on a chip
            of one TensorCore: the heads' pieces one after another, so each head walks only
            its own pattern's pieces (per head, a head with a shorter pattern would step
            through the longest one's count, doing nothing). The grid's middle size is
            dynamic when head_pattern is traced. On chips with two TensorCores (v7x) the
            per-head walk stays: its head axis is what the cores split.

Scalar prefetch (SMEM) holds:

    head_pattern[heads]          the pattern of each head (a traced argument)
    head_first_piece[heads]      where the head's pattern's pieces start in `entries`
    head_num_pieces[heads]       (both gathered from per-pattern tables by the wrapper)
    head_first_step[heads]       flat: the head's first grid step (exclusive cumsum of counts)
    step_head[heads * max]       flat: the head of each grid step (int8, int16 past 127 heads)
    step_piece[heads * max]      flat: the piece of each grid step (int16, int32 past 32767)
    entries[all pieces]          q_block << 17 | kv_start << 2 | kind     (kind: TileKind)
    lengths[all pieces]          only when slots > 1 (int8, or int16 past 127)
    blocks[all pieces]           only with several compute blocks per tile (int8/16/32)

One copy of each pattern's table, however many heads use it. Steps past a piece's length (or,
per head, past the head's pattern's pieces) are skipped and repeat the last blocks, so they
fetch nothing.

Per step (names of the phases as in the code):
  init      first step of a q tile: reset the running max and the accumulator, and decode the
            query coordinates the head's pattern's mask reads (see below);
  full      a FULL tile: online-softmax update of every compute block, no mask;
  mixed     a BOUNDARY tile: per compute block, by its kind (one branch per pattern);
  finalize  last step of a q tile: write acc / l, or 0 where no key was allowed (never NaN).

Arithmetic (why each choice; measured on libtpu's v6e schedule, see `svgen cost`):
  * init scales the q tile by sm_scale * log2(e) once into VMEM, so scores are already in
    base 2 and the kernel uses exp2: no per-score multiply, and no HBM pass over q for it;
  * q, k, v are not padded to whole tiles (a pass over each in HBM): the last tile's blocks
    reach past the arrays, their extra query rows are discarded, and the one kv tile that
    holds the end of the keys masks the rest and zeroes their V rows (whatever the DMA
    left there);
  * at head_dim 128 the PV matmul fills half of a 256-wide MXU pass, so V is widened to
    [V | 1] in VMEM: the second half of the product is the row sum l, lane-replicated, for
    free, and the accumulator carries it ([acc | l]);
  * m (and l when it is not on the MXU) are lane-replicated [rows, 128]: full vregs;
  * a BOUNDARY block's mask is a few full-block VALU ops (compare, combine, select) on
    coordinates of its rows and keys. Key coordinates are decoded per block in row form
    [1, ckv] (cheap: ckv/128 vregs). Query coordinates are decoded once per q tile, in init
    (row form, then transposed), and kept lane-replicated in VMEM [coords, block_q, 128]: a
    block reads them as full vregs instead of decoding [cq, 1] columns (cq/8 vregs per op)
    for every block (temporal-major decode: 2,977 bundles per 1024 x 512 BOUNDARY block
    before, 1,846 after, FULL 1,274).

Cube DMA (tiled layouts, `CubeDma`)
-----------------------------------
In a tiled layout whose cubes divide the video, with no text tokens and tiles of exactly one
cube, every tile is a strided box of the user's own [frames, height, width, d] array. The
forward kernel then reads and writes those boxes directly (4-D blocks, the cube's (frame, row,
column) group from the tile index, the VMEM block viewed as [cube tokens, d]), and the wrapper
makes no permutation at all: the user's array goes in and the output comes out in the user's
order, with no HBM pass over q, k, v or o. The box DMA costs about 75 bundles per step more
than a contiguous block (v6e, 384-token cubes). The backward pass permutes its operands into
the cube order as for any other layout.

Other layouts (`_layout_mover`)
-------------------------------
Where the heads use identity layouts and one temporal-major layout, the wrapper moves q, k, v
into kernel order and o back with the permute kernel (svgen.runtime.permute: one read and one
write of each tensor, frame-major heads copied whole, the head -> layout code traced); any
other mix of layouts is permuted by XLA, layout by layout, selected per head.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime import chunks, permute, segments
from svgen.runtime.coords import QueryCoords, TokenCoords
from svgen.runtime.segments import block_shifts, same_segment
from svgen.runtime.video_frames import ShiftedFrames
from svgen.runtime.interpret import settled
from svgen.runtime.layout import TokenLayout
from svgen.runtime.kinds import TileKind
from svgen.runtime.refine import SEGMENT_BOUNDARY
from svgen.runtime import select as select_policy
from svgen.runtime.select import PADDED
from svgen.runtime.vmem import kernel_vmem
from svgen.runtime.tables import (  # noqa: F401  (the table format, re-exported)
    Q_BLOCK_SHIFT,
    KV_BLOCK_SHIFT,
    KV_BLOCK_MASK,
    KIND_MASK,
    MAX_BLOCKS,
    BITS_PER_BLOCK,
    VARIANT_BITS,
    VARIANT_MASK,
    LANES,
    RUN_COLUMNS,
    pack_pieces,
    as_runs,
    split_runs,
    blocks_dtype,
    step_head_dtype,
    piece_index_dtype,
    walks_flat,
    PieceTables,
    KernelShape,
    transposed_tables,
)

LOG2_E = 1.4426950408889634
# attention(..., token_order=...): q, k, v and o in the user's token order, or already in each
# head's kernel order (what attention.to_kernel_order gives; nothing is permuted).
TOKEN_ORDERS = ("user", "kernel")
# What a spec's attention.dtype may name (svgen.spec.DTYPES: runtime/ never imports the spec
# reader; a test checks that they agree), for the advice of a dtype mismatch.
SPEC_DTYPES = ("bfloat16", "float32")

# Finite "minus infinity": exp2(MASK_VALUE - m) underflows to 0 without inf - inf = NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# The log-sum-exp saved for the backward pass of a row with no allowed key: exp2(s - it) = 0
# for every score, so the row gets no probability and no gradient.
EMPTY_ROW_LSE = -MASK_VALUE

BoundaryMask = Callable[[object, object], jax.Array]


@dataclasses.dataclass(frozen=True)
class Pattern:
    """One candidate pattern of a generated module."""

    name: str
    runs: object  # (q_block, kv_start, length, kind[, blocks]) rows
    layout: TokenLayout
    boundary_mask: BoundaryMask  # keep(q, k) from coordinates (coords.TokenCoords attributes)
    query_coords: tuple[str, ...] = ()  # the attributes of q that boundary_mask reads
    # runtime.per_video_frames: the superset and frame tree (svgen.runtime.video_frames)
    video_frames: object = None
    # Residual masks (svgen.analysis.residuals): variant j + 1 of a BOUNDARY compute block
    # runs residual_masks[j]; run_variants holds per run its VARIANT_BITS per compute block.
    residual_masks: tuple[BoundaryMask, ...] = ()
    run_variants: object = None


# _StepView.single_pattern_pieces of a grid exactly as long as every row's pieces.
EXACT_GRID = -1


def _q_block(entry):
    return lax.shift_right_logical(entry, Q_BLOCK_SHIFT)


def _kv_block(entry):
    return lax.shift_right_logical(entry, KV_BLOCK_SHIFT) & KV_BLOCK_MASK


@dataclasses.dataclass(frozen=True)
class _StepView:
    """Reads of the SMEM tables for one grid step, in the kernel body and the index maps.

    refs: head_pattern, head_first_piece, head_num_pieces[, head_first_step, step_head,
    step_piece], entries[, lengths][, blocks] (see the module docstring). Every read is a
    short chain of SMEM loads from the grid indices: the scalar work of a step.
    """

    refs: tuple
    heads: int
    outer: object  # grid index 0: batch*heads (per head) or batch (flat)
    step: object  # grid index 1: the head's local piece (per head) or the global step (flat)
    # The piece count when there is one pattern: static, or EXACT_GRID (every row walks the
    # same pieces, from the first, and the grid is exactly as long: a one-pattern chunked
    # call), where no SMEM read is needed for it.
    single_pattern_pieces: int | None
    has_lengths: bool
    has_blocks: bool
    flat: bool
    # Run-time tables (svgen.runtime.segments): first piece and piece count per row (batch *
    # heads) instead of per head, and no static piece count.
    per_row: bool = False

    @property
    def head(self):
        """The head (0..heads-1) this step works for."""
        if self.flat:
            return self.refs[4][self.step].astype(jnp.int32)
        return self.outer % self.heads

    @property
    def row(self):
        """The step's row of the [batch*heads, seq, d] operands."""
        return self.outer * self.heads + self.head if self.flat else self.outer

    @property
    def pattern(self):
        if self.single_pattern_pieces is not None:
            return 0
        return self.refs[0][self.head]

    @property
    def count(self):
        if self.single_pattern_pieces == EXACT_GRID:
            return pl.num_programs(1)
        if self.single_pattern_pieces is not None:
            return self.single_pattern_pieces
        return self.refs[2][self.outer if self.per_row else self.head]

    @property
    def first_piece(self):
        if self.single_pattern_pieces is not None:
            return 0
        return self.refs[1][self.outer if self.per_row else self.head]

    @property
    def piece(self):
        """Index into `entries` of this step's piece (per head: clamped to the head's last)."""
        if self.flat:  # one load: the wrapper resolved (head, local piece) per step
            return self.refs[5][self.step].astype(jnp.int32)
        if self.single_pattern_pieces == EXACT_GRID:
            return self.step
        return self.first_piece + jnp.minimum(self.step, self.count - 1)

    @property
    def in_range(self):
        """The step is one of the head's pieces (per head: past them it only repeats)."""
        return (
            True
            if self.flat or self.single_pattern_pieces == EXACT_GRID
            else self.step < self.count
        )

    @property
    def is_first_piece(self):
        """The head's first piece."""
        return self.step == (self.refs[3][self.head] if self.flat else 0)

    @property
    def is_last_piece(self):
        if self.flat:
            return self.step == self.refs[3][self.head] + self.count - 1
        return self.step == self.count - 1

    @property
    def _entries_at(self) -> int:
        return 6 if self.flat else 3

    def entry(self, offset: int = 0):
        """The entry of this step's piece, or of the one `offset` pieces away (clamped to
        the table; read only where the head has such a piece)."""
        entries = self.refs[self._entries_at]
        piece = self.piece + offset
        if offset < 0:
            piece = jnp.maximum(piece, 0)
        elif offset > 0:
            piece = jnp.minimum(piece, entries.shape[0] - 1)
        return entries[piece]

    @property
    def length(self):
        if not self.has_lengths:
            return 1
        return self.refs[self._entries_at + 1][self.piece].astype(jnp.int32)

    @property
    def blocks(self):
        """The tile's `blocks` word (2 bits per compute block), sign extension masked off."""
        word = self.refs[self._entries_at + 1 + self.has_lengths][self.piece]
        bits = 8 * word.dtype.itemsize
        word = word.astype(jnp.int32)
        return word if bits == 32 else word & ((1 << bits) - 1)

    @property
    def q_block(self):
        return _q_block(self.entry())

    def kv_block(self, slot):
        # Slots past the piece's end repeat its last kv tile: the pipeline fetches nothing.
        if not self.has_lengths:
            return _kv_block(self.entry())
        return _kv_block(self.entry()) + jnp.minimum(slot, self.length - 1)


def grid_step(
    table_refs,
    heads: int,
    single: int | None,
    has_lengths: bool,
    has_blocks: bool,
    flat: bool,
    per_row: bool = False,
):
    """This grid step as the tables say, for the forward and the backward kernels alike:
    (view, kind, row tile, column tile, active, first step of the row tile, last step of
    it). Steps past a piece's length are inactive; the row tile's first step initializes
    its accumulators and its last writes them out."""
    view = _StepView(
        table_refs,
        heads,
        pl.program_id(0),
        pl.program_id(1),
        single,
        has_lengths,
        has_blocks,
        flat,
        per_row,
    )
    slot = pl.program_id(2)
    entry = view.entry()
    row_tile = _q_block(entry)
    length = view.length
    active = view.in_range & (slot < length)
    is_first = active & (slot == 0) & (view.is_first_piece | (_q_block(view.entry(-1)) != row_tile))
    is_last = (
        active
        & (slot == length - 1)
        & (view.is_last_piece | (_q_block(view.entry(+1)) != row_tile))
    )
    return view, entry & KIND_MASK, row_tile, view.kv_block(slot), active, is_first, is_last


def _lanes(x, width: int):
    """A lane-replicated [rows, 128] array as [rows, width] (a multiple of 128, or less)."""
    if width <= LANES:
        return x[:, :width]
    return jnp.tile(x, (1, width // LANES))


@dataclasses.dataclass(frozen=True)
class _Block:
    """One compute block of the current tile: its rows and columns inside the VMEM blocks."""

    qi: int
    ki: int
    shape: KernelShape

    @property
    def rows(self):
        return pl.ds(self.qi * self.shape.cq, self.shape.cq)

    @property
    def cols(self):
        return pl.ds(self.ki * self.shape.ckv, self.shape.ckv)

    @property
    def bit(self) -> int:
        return BITS_PER_BLOCK * (self.qi * self.shape.kv_blocks_per_tile + self.ki)


class _QueryBlockCoords:
    """The query coordinates of one compute block, read from the per-q-tile VMEM copy as
    [cq, ckv] (lane-replicated, tiled across the keys: full vregs, no broadcast)."""

    def __init__(self, coords_ref, names: tuple[str, ...], block: _Block):
        self._ref, self._names, self._block = coords_ref, names, block

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._names:
            raise AttributeError(
                f"query coordinate {name!r} was not decoded for this mask (decoded: {self._names})"
            )
        value = self._ref[self._names.index(name), self._block.rows, :]
        if name == "is_text":
            value = value != 0
        return _lanes(value, self._block.shape.ckv)


def _decode_query_coords(
    coords_ref,
    names: tuple[str, ...],
    layout: TokenLayout,
    q_block,
    shape: "KernelShape",
    q_first=None,
):
    """Decode a q tile's query coordinates (row form) into coords_ref [n, block_q, 128].
    q_first: a chunked call's first query token in the video (svgen.runtime.chunks)."""
    pos = q_block * shape.block_q + lax.broadcasted_iota(jnp.int32, (1, shape.block_q), 1)
    if q_first is not None:
        pos = pos + q_first
    q = QueryCoords(pos, layout)
    for index, name in enumerate(names):
        value = getattr(q, name).astype(jnp.int32)  # [block_q, 1]
        coords_ref[index] = jnp.broadcast_to(value, (shape.block_q, LANES))


def _both(condition, in_mode):
    """condition & in_mode, with no extra op where in_mode is True (a kernel without the
    bounded twin traces exactly the ops it always had)."""
    return condition if in_mode is True else condition & in_mode


# Bounded max (attention.softmax: bounded): a q tile runs without a running max when every
# real row's bound R = |q_row| * max_k |k| (in the kernel's base-2 score units) is at most
# this. Then a row's best score s* >= -R (Cauchy-Schwarz), so its largest probability
# exp2(s* - R) >= 2^-80: a normal f32 and bf16 number with 2^46 of range left below it for
# the products with v and the terms 2^-24 under it, so the row keeps the precision of the
# online softmax and never sums to 0 (which would read as a row with no key). Scores never
# exceed R by more than rounding, so nothing overflows. Past it the tile runs online.
BOUND_LIMIT = 40.0


def key_bound(k):
    """f32 [rows, 1, 128]: per row (batch x head) of k [rows, seq, d] (or the cube DMA's
    [rows, frames, height, width, d]) the largest key norm, lane-replicated: what a bounded
    kernel reads per row. One XLA reduction over k, which reads it once."""
    k32 = k.astype(jnp.float32)
    norms = jnp.sqrt(jnp.sum(k32 * k32, axis=-1))
    largest = jnp.max(norms.reshape(norms.shape[0], -1), axis=1)
    return jnp.broadcast_to(largest[:, None, None], (k.shape[0], 1, LANES))


def _row_bounds(q_scaled, key_bound_ref, mode_ref, q_block, q_rows: int, shape: KernelShape):
    """A bounded kernel's init: each row's bound R = |q_row| * max |k| (lane-replicated
    [block_q, 128]) and the tile's mode (mode_ref[0] = 1 when every real row's R is at most
    BOUND_LIMIT); returns the rows' initial m: R in a bounded tile, MASK_VALUE (the online
    softmax's start) otherwise. Rows past q_rows (garbage past the array) count as 0."""
    q = q_scaled[...].astype(jnp.float32)
    norms = jnp.sqrt(jnp.sum(q * q, axis=1, keepdims=True))  # [block_q, 1]
    bound = norms * key_bound_ref[...]  # [block_q, 128]
    if q_rows:
        row = q_block * shape.block_q + lax.broadcasted_iota(jnp.int32, bound.shape, 0)
        bound = jnp.where(row < q_rows, bound, 0.0)
    # NaN or inf in q or k: not within the limit, so online (which shows them as it must).
    within = jnp.max(bound) <= BOUND_LIMIT
    mode_ref[0] = within.astype(jnp.int32)
    return jnp.where(within, bound, MASK_VALUE)


def _softmax_step(state, q, k, v, keep, shape: KernelShape, bounded: bool = False):
    """One softmax update of (m, acc[, l]) with a compute block's keys.

    q is pre-scaled into base 2; keep is None (FULL: no mask) or a bool [cq, ckv].
    bounded: m is the row's score bound, fixed for the q tile (see `BOUND_LIMIT`): no row
    max, no rescale of acc and l, and the next QK^T need not wait for this block's max.
    """
    m_prev, acc_prev, l_prev = state
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    scores = lax.dot_general(
        q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32, precision=precision
    )
    if keep is not None:
        scores = jnp.where(keep, scores, MASK_VALUE)
    m_next = m_prev if bounded else jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
    # A row with no allowed key so far has m_next == MASK_VALUE and exp2(0) = 1 on its
    # masked entries; the first allowed key rescales that away (alpha = 0), and a row
    # that never gets one is zeroed in finalize. So no select on the probabilities.
    # (Bounded: m is a finite bound, so masked entries give exp2(MASK_VALUE - m) = 0.)
    probs = jnp.exp2(scores - _lanes(m_next, shape.ckv))
    alpha = None if bounded else jnp.exp2(m_prev - m_next)
    if shape.row_sum_on_mxu:
        v = jnp.concatenate([v, jnp.ones((v.shape[0], LANES), v.dtype)], axis=1)
        l_next = None
    elif bounded:
        l_next = l_prev + jnp.sum(probs, axis=1, keepdims=True)
    else:
        l_next = alpha * l_prev + jnp.sum(probs, axis=1, keepdims=True)
    pv = lax.dot_general(
        probs.astype(v.dtype),
        v,
        (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=precision,
    )
    if bounded:
        return m_next, acc_prev + pv, l_next
    acc_next = _lanes(alpha, shape.acc_width) * acc_prev + pv
    return m_next, acc_next, l_next


def _attention_kernel(
    *refs,
    shape: KernelShape,
    heads: int,
    num_tables: int,
    patterns: tuple["_PatternCode", ...],
    single: int | None,
    has_lengths: bool,
    has_blocks: bool,
    flat: bool,
    q_scale: float,
    with_lse: bool = False,
    segments: bool = False,
    chunked: int = 0,
    selected: bool = False,
    q_rows: int = 0,
    with_modes: bool = False,
    ring_sink: int | None = None,
    has_variants: bool = False,
):
    """has_variants: static tables whose last scalar operand holds each piece's residual-mask
    variants (VARIANT_BITS per compute block; svgen.analysis.residuals): a BOUNDARY block of
    a pattern with residual masks runs the one its bits name.
    selected: a selection's per-row tables (svgen.runtime.select), whose PADDED blocks
    (kind 3) run unmasked but for the keys past seq_len.
    segments: run-time tables; the inputs then end with the query and key ids (with
    per-video frames, each token's frame shift in their second row), read by
    SEGMENT_BOUNDARY blocks only (each transposes its [1, cq] query ids: 473 bundles per
    1024 x 1024 block, against 899 per q tile for a lane-replicated copy made in init, which
    every q tile would pay; v6e, svgen cost). chunked: a KV-cache chunk's call over that
    many rows (batch * heads): per-row tables too; the last scalar operand holds per row the
    chunk's first token in the video, then per row whether its output is defined.
    ring_sink: a chunk's call against a rolling cache whose sink ends at this token: the
    last scalar operand then also holds per row the ring's wrap and its two key shifts
    (KvCache.ring_scalars, svgen.runtime.chunks), and shape.seq_len is the cache's length.
    q_rows: the rows of q (shape.bounded_softmax: rows past them are left out of the bound).
    with_modes: a last output, per row and q tile the tile's softmax mode (1: bounded), for
    `attention.softmax_modes` (a diagnostic; the kernels a model runs have no such output).
    shape.bounded_softmax: an input after v holds each row's key-norm bound (`key_bound`),
    and every FULL / BOUNDARY path has a bounded twin, chosen per q tile (see `BOUND_LIMIT`).
    """
    bounded_kernel = shape.bounded_softmax
    num_inputs = 3 + bounded_kernel + 2 * segments
    (
        # prefetched scalars (SMEM): head_pattern, first_piece, num_pieces, entries, ...
        table_refs,
        # inputs (VMEM blocks): q, k, v[, key bound [1, 128]][, query ids [1, block_q], key
        # ids [1, block_kv]]
        (q_ref, k_ref, v_ref, *id_refs),
        # outputs: o[, lse (base 2, for the backward pass)]
        outputs,
        # scratch, carried across the steps of one q tile: m, [acc | l] (or acc and l), the
        # scaled q tile[, query coordinates]
        scratch,
    ) = (
        refs[:num_tables],
        refs[num_tables : num_tables + num_inputs],
        refs[num_tables + num_inputs : num_tables + num_inputs + 1 + with_lse + with_modes],
        refs[num_tables + num_inputs + 1 + with_lse + with_modes :],
    )
    o_ref = outputs[0]
    key_bound_ref = id_refs.pop(0) if bounded_kernel else None
    if len(q_ref.shape) == 4:  # cube DMA: each [a, b, c, d] box read as [cube tokens, d]
        q_ref, k_ref, v_ref, o_ref = (_BoxRows(ref) for ref in (q_ref, k_ref, v_ref, o_ref))
    m_scratch, acc_scratch, *rest = scratch
    l_scratch = None if shape.row_sum_on_mxu else rest.pop(0)
    q_scaled = rest.pop(0)
    # bounded kernels: the q tile's mode (1: bounded max), an SMEM scalar set in init.
    mode_ref = rest.pop() if bounded_kernel else None
    coords_ref = rest.pop(0) if rest else None
    view, kind, q_block, kv_block, active, is_first, is_last = grid_step(
        table_refs,
        heads,
        single,
        has_lengths,
        has_blocks,
        flat,
        per_row=bool(segments or chunked or selected),
    )
    # A chunked call's last scalar operand (svgen.runtime.chunks).
    q_first = table_refs[-1][view.row] if chunked else None
    blocks = [
        _Block(qi, ki, shape)
        for qi in range(shape.q_blocks_per_tile)
        for ki in range(shape.kv_blocks_per_tile)
    ]

    @pl.when(is_first)
    def init():
        # q scaled once per q tile by sm_scale * log2(e): scores come out in base 2 (exp2,
        # no per-score multiply), and the wrapper makes no pass over q for it.
        q_scaled[...] = (q_ref[...].astype(jnp.float32) * q_scale).astype(q_scaled.dtype)
        if bounded_kernel:
            m_scratch[...] = _row_bounds(q_scaled, key_bound_ref, mode_ref, q_block, q_rows, shape)
        else:
            m_scratch[...] = jnp.full(m_scratch.shape, MASK_VALUE, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)
        if l_scratch is not None:
            l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        for index, p in enumerate(patterns):
            if not p.query_coords:
                continue
            decode = functools.partial(
                _decode_query_coords, coords_ref, p.query_coords, p.layout, q_block, shape, q_first
            )
            if len(patterns) == 1:
                decode()
            else:
                pl.when(view.pattern == index)(decode)

    def load(rows):
        return (
            m_scratch[rows, :],
            acc_scratch[rows, :],
            None if l_scratch is None else l_scratch[rows, :],
        )

    def store(rows, state, bounded: bool = False):
        if not bounded:  # a bounded tile's m is its fixed bound
            m_scratch[rows, :] = state[0]
        acc_scratch[rows, :] = state[1]
        if l_scratch is not None:
            l_scratch[rows, :] = state[2]

    def keep_of(block: _Block, pattern: "_PatternCode", padding: bool, segmented: bool):
        k_pos = (
            kv_block * shape.block_kv
            + block.ki * shape.ckv
            + lax.broadcasted_iota(jnp.int32, (1, shape.ckv), 1)
        )
        k_video = k_pos
        if ring_sink is not None:  # a rolling cache's slot -> the video token it holds
            k_video = chunks.slot_keys(k_pos, ring_sink, table_refs[-1], chunked, view.row)
        q = _QueryBlockCoords(coords_ref, pattern.query_coords, block)
        k = TokenCoords(k_video, pattern.layout)
        shifts = block_shifts(id_refs, block.rows, block.cols) if segmented else None
        if shifts is not None:  # per-video frames: counted from each token's video segment
            q, k = ShiftedFrames(q, shifts[0]), ShiftedFrames(k, shifts[1])
        keep = jnp.broadcast_to(pattern.boundary_mask(q, k), (shape.cq, shape.ckv))
        if segmented:  # the block spans run-time segments: only pairs of one segment
            keep = keep & same_segment(id_refs, block.rows, block.cols)
        # Padding keys are never attended, whatever the predicate says about them.
        return keep & (k_pos < shape.seq_len) if padding else keep

    def update(
        block: _Block,
        state,
        pattern: "_PatternCode | None",
        padding: bool = False,
        segmented: bool = False,
        bounded: bool = False,
    ):
        keep = None if pattern is None else keep_of(block, pattern, padding, segmented)
        v = v_ref[block.cols, :]
        if padding:
            # Keys past the sequence lie outside the operands: the DMA leaves whatever was
            # in VMEM there. Their probabilities are 0, but 0 * NaN is not: zero those rows.
            row = (
                kv_block * shape.block_kv
                + block.ki * shape.ckv
                + lax.broadcasted_iota(jnp.int32, (shape.ckv, 1), 0)
            )
            v = jnp.where(row < shape.seq_len, v, jnp.zeros_like(v))
        return _softmax_step(
            state, q_scaled[block.rows, :], k_ref[block.cols, :], v, keep, shape, bounded
        )

    def masked(
        block: _Block, pattern: "_PatternCode", segmented: bool = False, bounded: bool = False
    ):
        """A BOUNDARY block. Only one block column of one kv tile holds padding keys (and
        never a FULL block: the tables make it BOUNDARY); the test costs a full-block VALU
        op and a vreg store per vreg (1,846 bundles against 1,520 without, temporal-major
        1024 x 512), so the others run without it. segmented: a SEGMENT_BOUNDARY block of
        run-time tables (it also tests the segment ids)."""

        def run(padding: bool):
            state = update(block, load(block.rows), pattern, padding, segmented, bounded)
            store(block.rows, state, bounded)

        if shape.padding_kv_tile is None or block.ki != shape.padding_block_column:
            run(False)
            return
        pl.when(kv_block != shape.padding_kv_tile)(functools.partial(run, False))
        pl.when(kv_block == shape.padding_kv_tile)(functools.partial(run, True))

    def boundary(block: _Block, pattern: "_PatternCode", bounded: bool):
        """A BOUNDARY block: its residual mask where the tables name one (a branch per
        variant, the whole mask first), else the whole mask."""
        if not (has_variants and pattern.residual_masks):
            masked(block, pattern, bounded=bounded)
            return
        word = table_refs[-1][view.piece].astype(jnp.int32)
        shift = VARIANT_BITS * (block.qi * shape.kv_blocks_per_tile + block.ki)
        variant = lax.shift_right_logical(word, shift) & VARIANT_MASK
        for j in range(len(pattern.residual_masks) + 1):
            pl.when(variant == j)(
                functools.partial(masked, block, pattern.variant(j), bounded=bounded)
            )

    def body_paths(bounded: bool, in_mode):
        """The FULL and BOUNDARY paths of a step, for q tiles of one softmax mode (in_mode:
        True, or the bounded kernel's traced mode test)."""

        @pl.when(_both(active & (kind == TileKind.FULL), in_mode))
        def full():
            # Straight-line code over all compute blocks: the state stays in values, so the
            # scheduler overlaps one block's softmax with the next block's QK^T.
            for qi in range(shape.q_blocks_per_tile):
                row_blocks = [b for b in blocks if b.qi == qi]
                state = load(row_blocks[0].rows)
                for block in row_blocks:
                    state = update(block, state, None, bounded=bounded)
                store(row_blocks[0].rows, state, bounded)

        for index, pattern in enumerate(patterns):
            is_pattern = True if len(patterns) == 1 else view.pattern == index

            @pl.when(_both(active & (kind == TileKind.BOUNDARY) & is_pattern, in_mode))
            def mixed():
                if not has_blocks:  # one compute block per tile: it is BOUNDARY
                    boundary(blocks[0], pattern, bounded)
                    return
                word = view.blocks
                for block in blocks:
                    block_kind = lax.shift_right_logical(word, block.bit) & KIND_MASK

                    @pl.when(block_kind == TileKind.FULL)
                    def _(block=block):
                        state = update(block, load(block.rows), None, bounded=bounded)
                        store(block.rows, state, bounded)

                    pl.when(block_kind == TileKind.BOUNDARY)(
                        functools.partial(boundary, block, pattern, bounded)
                    )
                    if segments:  # only run-time tables have such blocks
                        pl.when(block_kind == SEGMENT_BOUNDARY)(
                            functools.partial(masked, block, pattern, True, bounded)
                        )
                    elif selected and block.ki == shape.padding_block_column:
                        pl.when(block_kind == PADDED)(
                            functools.partial(masked, block, _every_key(pattern), bounded=bounded)
                        )

            if segments and not has_blocks:
                # One compute block per tile: the tile's kind says whether it spans segments.
                pl.when(_both(active & (kind == SEGMENT_BOUNDARY) & is_pattern, in_mode))(
                    functools.partial(masked, blocks[0], pattern, True, bounded)
                )

        if selected and not has_blocks and shape.padding_kv_tile is not None:
            # A selected tile of one compute block holding the end of the keys.
            pl.when(_both(active & (kind == PADDED), in_mode))(
                functools.partial(masked, blocks[0], _every_key(patterns[0]), bounded=bounded)
            )

    if bounded_kernel:
        # Every path twice: the bounded one first, then the online fallback (the phase order
        # svgen.cost reads). The mode is one SMEM load per step.
        body_paths(True, mode_ref[0] != 0)
        body_paths(False, mode_ref[0] == 0)
    else:
        body_paths(False, True)

    @pl.when(is_last)
    def finalize():
        # Rows that saw no allowed key (m still MASK_VALUE) are 0, never NaN.
        seen = m_scratch[...] > 0.5 * MASK_VALUE
        l = (
            acc_scratch[:, shape.head_dim : shape.head_dim + LANES]
            if l_scratch is None
            else l_scratch[...]
        )
        if bounded_kernel:
            # A bounded tile's m is its bound, never MASK_VALUE: a row with no allowed key
            # has l == 0 there (every exp2 underflowed to 0), and only there (BOUND_LIMIT).
            seen = seen & (l > 0.0)
        inv = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)
        if chunked:
            # NaN rows where a traced offset was no chunk start or a traced head_pattern no
            # pattern, written here, once per q tile: any elementwise pass over the chunk's
            # o after the kernel costs ~45 bundles in every grid step of it (v6e, svgen
            # cost: 327 against 282 per skipped step).
            inv = jnp.where(table_refs[-1][chunked + view.row] != 0, inv, jnp.nan)
        o_ref[...] = (acc_scratch[:, : shape.head_dim] * _lanes(inv, shape.head_dim)).astype(
            o_ref.dtype
        )
        if with_lse:  # lane-major [1, block_q]: what the backward kernels broadcast
            lse = jnp.where(seen, m_scratch[...] + jnp.log2(jnp.where(seen, l, 1.0)), EMPTY_ROW_LSE)
            outputs[1][...] = jnp.transpose(lse[:, :1])
        if with_modes:
            outputs[-1][...] = jnp.full(outputs[-1].shape, mode_ref[0], jnp.int32)


@dataclasses.dataclass(frozen=True)
class CubeDma:
    """A tile is one cube, a box of the user's [frames, height, width, d] array (see the
    module docstring): the kernel's q, k, v and o are that 4-D view of each head."""

    frames: int
    height: int
    width: int
    cube: tuple[int, int, int]

    @property
    def groups(self) -> tuple[int, int, int]:
        a, b, c = self.cube
        return self.frames // a, self.height // b, self.width // c

    @property
    def view(self) -> tuple[int, int, int]:
        return self.frames, self.height, self.width

    def box(self, tile):
        """The (frame, row, column) group of cube `tile` (cubes in (frame, row, column) group
        order): the block index of its box. lax.div / lax.rem: non-negative, and no `sign`
        (which does not lower for TPU from a CPU host)."""
        _, rows, cols = self.groups
        return lax.div(tile, rows * cols), lax.rem(lax.div(tile, cols), rows), lax.rem(tile, cols)


class _BoxRows:
    """A cube DMA block [a, b, c, d] read and written as [cube tokens, d] values, as the
    kernel body reads its blocks: `x[...]`, `x[pl.ds(start, size), :]` (static), `x[...] = y`.
    The value reshape merges whole (8, 128) tiles (see _CUBE_COLS_MULTIPLE), so it moves no
    data: on v6e it compiles to the same bundles as a ref reshape, which Pallas's TPU
    interpreter does not run."""

    def __init__(self, ref):
        self._ref = ref
        self.shape = (math.prod(ref.shape[:-1]), ref.shape[-1])
        self.dtype = ref.dtype

    def __getitem__(self, index):
        rows = self._ref[...].reshape(self.shape)
        if index is Ellipsis:
            return rows
        row_slice, cols = index
        if cols != slice(None) or not isinstance(row_slice, pl.Slice):
            raise NotImplementedError(f"cube DMA blocks are read by row ranges, got {index}")
        return rows[row_slice.start : row_slice.start + row_slice.size]

    def __setitem__(self, index, value):
        if index is not Ellipsis:
            raise NotImplementedError(f"cube DMA blocks are written whole, got {index}")
        self._ref[...] = value.reshape(self._ref.shape)


# The sublane tile of the box's last spatial axis: a [cube tokens, d] view of a 4-D VMEM block
# merges whole (8, 128) tiles only when the cube's column count is a multiple of 8.
_CUBE_COLS_MULTIPLE = 8


def cube_dma(layouts: Sequence[TokenLayout], shape: KernelShape) -> CubeDma | None:
    """The cube DMA of a kernel whose heads all use `layouts`, or None where it does not
    apply (then the wrapper permutes q, k, v into kernel order and o back)."""
    if len(layouts) != 1 or not layouts[0].is_tiled or layouts[0].is_identity:
        return None  # (an identity layout's tiles are contiguous already: plain blocks)
    lay = layouts[0]
    a, b, c = lay.cube
    cube_tokens = a * b * c
    fits = (
        lay.text_tokens == 0
        and lay.frames % a == 0
        and lay.height % b == 0
        and lay.width % c == 0
        and c % _CUBE_COLS_MULTIPLE == 0
        and shape.block_q == shape.block_kv == cube_tokens
    )
    return CubeDma(lay.frames, lay.height, lay.width, lay.cube) if fits else None


@dataclasses.dataclass(frozen=True)
class _PatternCode:
    """What the kernel body needs of a pattern: its mask, layout and decoded query coords,
    and the residual masks its BOUNDARY blocks may run instead of the mask."""

    boundary_mask: BoundaryMask
    layout: TokenLayout
    query_coords: tuple[str, ...]
    residual_masks: tuple[BoundaryMask, ...] = ()

    def variant(self, j: int) -> "_PatternCode":
        """The pattern as its variant j runs it (0: the whole mask)."""
        mask = self.boundary_mask if j == 0 else self.residual_masks[j - 1]
        return _PatternCode(mask, self.layout, self.query_coords)


def _every_key(pattern: _PatternCode) -> _PatternCode:
    """The mask of a selected block (svgen.runtime.select): every key, the kernel's padding
    test dropping those past seq_len."""
    return _PatternCode(_keep_every_key, pattern.layout, ())


def _keep_every_key(q, k):
    return k.pos >= 0


def _vmem_limit(shape: KernelShape, dtype, query_coords: int, ids: bool = False) -> int | None:
    """The module's limit, never below what this call's buffers need (the compiler's bound
    on query coordinates covers them; this keeps a hand-built KernelShape safe too). ids:
    run-time segments, whose [1, tile] id blocks take 8 sublanes, double-buffered."""
    if shape.vmem_limit_bytes is None and not ids:
        return None
    need = kernel_vmem(
        shape.block_q,
        shape.block_kv,
        shape.cq,
        shape.ckv,
        shape.head_dim,
        jnp.dtype(dtype).name,
        query_coords,
    )
    if ids:
        need = dataclasses.replace(
            need, pipeline=need.pipeline + 2 * 8 * 4 * (shape.block_q + shape.block_kv)
        )
    return max(shape.vmem_limit_bytes or 0, need.limit())


def _head_operands(tables: PieceTables, head_pattern, static_pattern):
    """The per-head scalar-prefetch operands and the grid's middle size (see the module
    docstring); static_pattern: head_pattern as NumPy when it is not traced."""
    heads = int(head_pattern.shape[0])
    # Per head, where its pattern's pieces are: one SMEM read per lookup instead of two.
    head_first = jnp.asarray(tables.first_piece)[head_pattern]
    head_count = jnp.asarray(tables.num_pieces)[head_pattern]
    operands = (head_pattern, head_first, head_count)
    if not tables.flat:
        return operands, tables.max_pieces
    first_step = (jnp.cumsum(head_count) - head_count).astype(jnp.int32)
    bound = heads * tables.max_pieces  # the most steps any assignment can have
    step_head = jnp.repeat(
        jnp.arange(heads, dtype=jnp.int32), head_count, total_repeat_length=bound
    )
    # Per step, its piece in `entries`: one SMEM load instead of a chain of them.
    step_piece = head_first[step_head] + jnp.arange(bound, dtype=jnp.int32) - first_step[step_head]
    step_piece = jnp.clip(step_piece, 0, tables.entries.shape[0] - 1)
    if static_pattern is not None:
        steps = int(tables.num_pieces[static_pattern].sum())
    else:  # a dynamic grid size: Mosaic reads it at run time
        steps = jnp.sum(head_count)
    return operands + (
        first_step,
        step_head.astype(step_head_dtype(heads)),
        step_piece.astype(piece_index_dtype(tables)),
    ), steps


def _flat_attention(
    q,
    k,
    v,
    head_pattern,
    static_pattern,
    tables: PieceTables,
    patterns,
    *,
    shape,
    interpret,
    q_scale: float,
    with_lse: bool = False,
    cubes: CubeDma | None = None,
    call=None,
    chunk=None,
    selection=None,
    with_modes: bool = False,
    ring_sink: int | None = None,
):
    """q, k, v: [batch*heads, seq_len, head_dim], each head in its pattern's order, or with
    `cubes` [batch*heads, frames, height, width, head_dim] in the user's order. Not padded
    to whole tiles: the last tile's blocks reach past the arrays (the DMA reads what exists;
    rows past seq_len are discarded queries and masked keys), so no HBM pass pads them.
    with_lse: also return each row's log-sum-exp of its base-2 scores, f32 [rows, 1,
    padded_seq_len] (what the backward pass needs).
    call: run-time segments, (CallTables, query ids, key ids [batch*heads, 1, seq]): the
    call's tables replace `tables` (which still say slots and the walk), per-head walk.
    chunk: a KV-cache chunk's call (svgen.runtime.chunks), (CallTables, per-row scalars,
    exact): q holds the chunk's rows only, k and v the whole sequence's, or with ring_sink
    a rolling cache's (shape.seq_len its length; see _attention_kernel).
    selection: a selection's per-row CallTables (svgen.runtime.select), per-head walk.
    with_modes (shape.bounded_softmax): also return int32 [rows, 1, q tiles * 128], each q
    tile's softmax mode (1: it ran with the bound) in its 128 lanes."""
    if with_modes and not shape.bounded_softmax:
        raise ValueError(
            "softmax modes: the kernel was compiled without attention.softmax: bounded"
        )
    heads = int(head_pattern.shape[0])
    per_row = call is not None or chunk is not None or selection is not None
    flat = tables.flat and not per_row
    if selection is not None:
        operands = selection.scalar_operands(head_pattern)
        steps, single, id_inputs = selection.steps, None, ()
    elif chunk is not None:
        chunk_tables, q_first, exact = chunk
        operands = chunk_tables.scalar_operands(head_pattern) + (q_first,)
        single = EXACT_GRID if exact else None
        steps, id_inputs = chunk_tables.steps, ()
    elif call is None:
        head_operands, steps = _head_operands(tables, head_pattern, static_pattern)
        operands = head_operands + tuple(jnp.asarray(t) for t in tables.piece_operands())
        if tables.variants is not None:  # the last scalar operand (see _attention_kernel)
            operands += (jnp.asarray(tables.variants),)
        single = tables.max_pieces if len(patterns) == 1 else None
        id_inputs = ()
    else:
        call_tables, q_ids, kv_ids = call
        operands = call_tables.scalar_operands(head_pattern)
        steps, single, id_inputs = call_tables.steps, None, (q_ids, kv_ids)
    has_lengths, has_blocks = tables.lengths is not None, tables.blocks is not None
    query_coords = max(len(p.query_coords) for p in patterns)
    kernel = functools.partial(
        _attention_kernel,
        shape=shape,
        heads=heads,
        num_tables=len(operands),
        patterns=tuple(patterns),
        single=single,
        has_lengths=has_lengths,
        has_blocks=has_blocks,
        flat=flat,
        q_scale=q_scale,
        with_lse=with_lse,
        segments=call is not None,
        chunked=q.shape[0] if chunk is not None else 0,
        selected=selection is not None,
        q_rows=q.shape[1] if q.ndim == 3 else 0,
        with_modes=with_modes,
        ring_sink=ring_sink,
        has_variants=tables.variants is not None and not per_row,
    )

    def view(outer, step, table_refs):
        return _StepView(
            table_refs,
            heads,
            outer,
            step,
            single,
            has_lengths,
            has_blocks,
            flat,
            per_row=per_row,
        )

    def block_index(row, tile):
        return (row, tile, 0) if cubes is None else (row, *cubes.box(tile), 0)

    def q_index_map(outer, step, slot, *table_refs):
        at = view(outer, step, table_refs)
        return block_index(at.row, at.q_block)

    def kv_index_map(outer, step, slot, *table_refs):
        at = view(outer, step, table_refs)
        return block_index(at.row, at.kv_block(slot))

    def row_index_map(outer, step, slot, *table_refs):
        return view(outer, step, table_refs).row, 0, 0

    def lse_index_map(outer, step, slot, *table_refs):
        at = view(outer, step, table_refs)
        return at.row, 0, at.q_block

    def mode_index_map(outer, step, slot, *table_refs):
        at = view(outer, step, table_refs)
        return at.row, 0, at.q_block

    def kv_ids_index_map(outer, step, slot, *table_refs):
        at = view(outer, step, table_refs)
        return at.row, 0, at.kv_block(slot)

    d = shape.head_dim
    q_block = (None, shape.block_q, d) if cubes is None else (None, *cubes.cube, d)
    kv_block = (None, shape.block_kv, d) if cubes is None else q_block
    scratch = [
        pltpu.VMEM((shape.block_q, LANES), jnp.float32),
        pltpu.VMEM((shape.block_q, shape.acc_width), jnp.float32),
    ]
    if not shape.row_sum_on_mxu:
        scratch.append(pltpu.VMEM((shape.block_q, LANES), jnp.float32))
    scratch.append(pltpu.VMEM((shape.block_q, d), q.dtype))
    if query_coords:
        scratch.append(pltpu.VMEM((query_coords, shape.block_q, LANES), jnp.int32))
    bound_inputs, bound_specs = (), []
    if shape.bounded_softmax:
        scratch.append(pltpu.SMEM((1,), jnp.int32))  # the q tile's mode (last: see the kernel)
        bound_inputs = (key_bound(k),)
        bound_specs = [pl.BlockSpec((None, 1, LANES), row_index_map)]
    id_specs = []
    if call is not None:
        id_rows = id_inputs[0].shape[1]  # 2: ids and frame shifts (per-video frames)
        id_specs = [
            pl.BlockSpec((None, id_rows, shape.block_q), lse_index_map),
            pl.BlockSpec((None, id_rows, shape.block_kv), kv_ids_index_map),
        ]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(operands),
        grid=(q.shape[0] // heads if flat else q.shape[0], steps, tables.slots),
        in_specs=[
            pl.BlockSpec(q_block, q_index_map),
            pl.BlockSpec(kv_block, kv_index_map),
            pl.BlockSpec(kv_block, kv_index_map),
        ]
        + bound_specs
        + id_specs,
        out_specs=[pl.BlockSpec(q_block, q_index_map)]
        + ([pl.BlockSpec((None, 1, shape.block_q), lse_index_map)] if with_lse else [])
        + ([pl.BlockSpec((None, 1, LANES), mode_index_map)] if with_modes else []),
        scratch_shapes=scratch,
    )
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)] + (
        [jax.ShapeDtypeStruct((q.shape[0], 1, _lse_length(q, shape, chunk)), jnp.float32)]
        if with_lse
        else []
    )
    if with_modes:
        q_tiles = -(-q.shape[1] // shape.block_q)
        out_shape.append(jax.ShapeDtypeStruct((q.shape[0], 1, q_tiles * LANES), jnp.int32))
    outputs = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(shape, q.dtype, query_coords, ids=call is not None),
        ),
        interpret=interpret,
        name="svgen_attention",  # the kernel's name in profiles and libtpu dumps
    )(*operands, q, k, v, *bound_inputs, *id_inputs)
    outputs = [settled(x, interpret) for x in outputs]
    return tuple(outputs) if with_lse or with_modes else outputs[0]


def _lse_length(q, shape: KernelShape, chunk) -> int:
    """The lse rows: the padded sequence, or whole q tiles of a chunked call's rows (q is
    [rows, chunk tokens, d] then; with cube DMA it is 5-D, never chunked)."""
    if chunk is None:
        return shape.padded_seq_len
    return -(-q.shape[1] // shape.block_q) * shape.block_q


def _per_head_layout(x, layouts: list[TokenLayout], head_layout, to_kernel: bool):
    """Apply each head's layout permutation to x [..., heads, seq, d]."""
    move = (
        (lambda lay, y: lay.to_kernel(y, jnp))
        if to_kernel
        else (lambda lay, y: lay.from_kernel(y, jnp))
    )
    if len(layouts) == 1:
        return move(layouts[0], x)
    out = move(layouts[0], x)
    for index, lay in enumerate(layouts[1:], start=1):
        out = jnp.where((head_layout == index)[:, None, None], move(lay, x), out)
    return out


def make_attention(
    *,
    shape: KernelShape,
    patterns: Sequence[Pattern],
    slots: int,
    default_head_pattern: Sequence[int] | None,
    dtype: str | None = None,
    runtime: segments.RuntimeInputs = segments.RuntimeInputs(),
    kv_cache: chunks.KvCache | None = None,
    select: "select_policy.Selection | None" = None,
):
    """The public `attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None,
    token_order="user"[, segment_ids=None][, text_lengths=None][, q_frame_offset=None])`.

    q, k, v are [heads, seq, head_dim] or [batch, heads, seq, head_dim] in the user's token
    order; the output has the shape and dtype of q. `head_pattern` (int [heads], may be traced)
    picks each head's pattern; it defaults to the spec's static assignment. `dtype`: the spec's
    (q, k, v must have it; None accepts any floating dtype).

    token_order="kernel": q, k, v are already in each head's kernel order and o comes back in
    it, so nothing is permuted around the kernel. `attention.to_kernel_order(x,
    head_pattern=...)` and `attention.from_kernel_order(y, ...)` move [..., heads, seq, d]
    arrays between the orders: a model that keeps its activations in kernel order between
    layers (token-wise layers do not care about the order) pays those passes once, not per
    attention call.

    runtime: the spec's run-time inputs (svgen.runtime.segments); a call that gives none of
    them runs the static tables, exactly as a module without them.
    kv_cache: the spec's KV-cache chunks (svgen.runtime.chunks): a call with q_frame_offset
    attends one chunk of queries against the whole sequence's keys and values.
    select: the spec's selection policy (svgen.runtime.select): every call chooses blocks
    of the candidate region from its q and k (top_k= / top_p= override the spec's amount).
    """
    tables = PieceTables.from_runs(
        [p.runs for p in patterns],
        slots,
        shape.compute_blocks,
        walks_flat(len(patterns), shape.tensor_cores),
        [p.run_variants if p.residual_masks else None for p in patterns],
    )
    layouts: list[TokenLayout] = []
    for p in patterns:
        if p.layout not in layouts:
            layouts.append(p.layout)
    # NumPy here: importing a generated module must not start a JAX backend.
    layout_of_pattern = np.asarray([layouts.index(p.layout) for p in patterns], np.int32)
    codes = [
        _PatternCode(p.boundary_mask, p.layout, tuple(p.query_coords), tuple(p.residual_masks))
        for p in patterns
    ]
    cubes = cube_dma(layouts, shape)
    # Temporal-major heads: one Pallas pass per tensor (svgen.runtime.permute) instead of
    # XLA's reshape + transpose (4-5x the HBM traffic; bench/wrapper_cost.py). Never beside
    # cube DMA, which is for a tiled layout.
    permute_kernel = permute.applies(layouts)

    layout_index = tuple(int(i) for i in layout_of_pattern)

    @functools.cache
    def call_tables(transposed: bool) -> segments.SegmentTables:
        """The static side of run-time tables, built on the first call that needs them."""
        runs = [p.runs for p in patterns]
        # The dk/dv walk's pieces are as long as its static tables' (its grid's last axis).
        walk_slots = dkv_tables().slots if transposed else slots
        video = tuple(p.video_frames for p in patterns) if runtime.per_video_frames else ()
        return segments.SegmentTables.build(
            runs,
            layout_index,
            shape,
            walk_slots,
            transposed,
            video=video,
            layouts=tuple(p.layout for p in patterns),
        )

    @functools.cache
    def dkv_tables() -> PieceTables:
        """Built on the first differentiated call, so that importing a module stays cheap."""
        return transposed_tables([p.runs for p in patterns], shape, shape.heads)

    def differentiable(
        q, k, v, head_pattern, static_pattern, interpret, q_scale, sm_scale, cubes, ids, chosen
    ):
        """The kernel in kernel order (cube DMA: the user's 4-D view), with its VJP: the
        backward kernels of svgen.runtime.backward (head_pattern is not differentiated).
        ids: run-time segments (segments.CallIds [batch, layouts, seq]) or None."""

        def id_rows(hp, ids):
            return segments.kernel_id_rows(ids, jnp.asarray(layout_of_pattern)[hp])

        def forward_call(hp, ids):
            if ids is None:
                return None
            return (call_tables(False).tables(ids, hp), *id_rows(hp, ids))

        def backward_calls(hp, ids):
            if ids is None:
                return None
            # Both walks' tables: the dq kernel's (unused when dq is fused into the dk/dv
            # walk; XLA drops what nothing reads) and the dk/dv kernel's.
            call_tables(True).check_smem(ids.query.shape[0], shape.heads)
            tables_of = (call_tables(t).tables(ids, hp) for t in (False, True))
            return (*tables_of, *id_rows(hp, ids))

        def selection_call(chosen):
            return None if chosen is None else select.forward_walk.tables(chosen.blocks)

        def run(q, k, v, hp, ids, chosen):
            return _flat_attention(
                q,
                k,
                v,
                hp,
                static_pattern,
                tables,
                codes,
                shape=shape,
                interpret=interpret,
                q_scale=q_scale,
                cubes=cubes,
                call=forward_call(hp, ids),
                selection=selection_call(chosen),
            )

        def forward(q, k, v, hp, ids, chosen):
            o, lse = _flat_attention(
                q,
                k,
                v,
                hp,
                static_pattern,
                tables,
                codes,
                shape=shape,
                interpret=interpret,
                q_scale=q_scale,
                with_lse=True,
                cubes=cubes,
                call=forward_call(hp, ids),
                selection=selection_call(chosen),
            )
            return o, (q, k, v, hp, ids, chosen, o, lse)

        def backward_rule(residuals, do):
            from svgen.runtime import backward

            q, k, v, hp, ids, chosen, o, lse = residuals
            if cubes is not None:  # the backward kernels read tiles in cube order
                q, k, v, o, do = (
                    _cube_order(x, layouts[0], to_kernel=True) for x in (q, k, v, o, do)
                )
            q_scaled = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
            dq, dk, dv = backward.backward(
                q_scaled,
                k,
                v,
                o,
                lse,
                do,
                hp,
                static_pattern,
                forward_tables=tables,
                dkv_tables=dkv_tables(),
                patterns=codes,
                shape=shape,
                sm_scale=sm_scale,
                interpret=interpret,
                calls=backward_calls(hp, ids) if chosen is None else selection_calls(chosen),
            )
            if cubes is not None:
                dq, dk, dv = (_cube_order(x, layouts[0], to_kernel=False) for x in (dq, dk, dv))
            no_ids = None if ids is None else jax.tree.map(_no_cotangent, ids)
            not_chosen = None if chosen is None else jax.tree.map(_no_cotangent, chosen)
            return dq, dk, dv, _no_cotangent(hp), no_ids, not_chosen

        def selection_calls(chosen):
            # The selection is a constant of the gradient: the backward walks visit the same
            # blocks (the dq kernel's tables unused when dq is fused; XLA drops them).
            walk = select.transposed_walk(dkv_tables().slots)
            return select.dq_walk.tables(chosen.blocks), walk.tables(chosen.blocks)

        core = jax.custom_vjp(run)
        core.defvjp(forward, backward_rule)
        return core(q, k, v, head_pattern, ids, chosen)

    def resolved(head_pattern, heads: int):
        static_pattern, head_pattern = resolve_head_pattern(
            head_pattern, default_head_pattern, heads, shape.heads, len(patterns)
        )
        return static_pattern, head_pattern, jnp.asarray(layout_of_pattern)[head_pattern]

    def call_ids(segment_ids, text_lengths, batch: int | None):
        """The call's ids per layout (segments.CallIds [batch, layouts, seq]), or None when
        it gives no run-time input."""
        ids = segments.call_ids(runtime, segment_ids, text_lengths, batch, layouts)
        if ids is not None:
            call_tables(False).check_smem(batch or 1, shape.heads)
        return ids

    # A rolling cache's call: the kv side is the cache, and masked blocks map its slots to
    # video keys (svgen.runtime.chunks).
    chunk_shape = shape if kv_cache is None else kv_cache.call_shape(shape)
    ring_sink = None if kv_cache is None else kv_cache.ring_sink

    @functools.cache
    def chunk_tables() -> PieceTables:
        """Every chunk position's tables, built on the first chunked call."""
        return kv_cache.tables(slots, shape.compute_blocks)

    def chunk_core(q, k, v, head_pattern, position, defined, interpret, q_scale, sm_scale):
        """A chunked call in kernel order: q [rows, chunk tokens, d] (rows = batch * heads),
        position int32 [] (the chunk of every row) or [rows], defined bool [rows]. jax.vmap
        folds its axis into the rows (each element may have its own position); the VJP runs
        the fused dk/dv walk over the chunk positions' transposed tables."""
        heads = int(head_pattern.shape[0])

        def chunk_operands(table, position, hp, defined, rows):
            call, exact = kv_cache.call_tables(table, position, hp, rows // heads)
            scalars = [position * kv_cache.rows, defined.astype(jnp.int32)]
            scalars += kv_cache.ring_scalars(position)
            per_row = [jnp.broadcast_to(x, (rows,)).astype(jnp.int32) for x in scalars]
            return call, jnp.concatenate(per_row), exact

        def forward(q, k, v, hp, position, defined, with_lse=False):
            chunk = chunk_operands(chunk_tables(), position, hp, defined, q.shape[0])
            return _flat_attention(
                q,
                k,
                v,
                hp,
                None,
                tables,
                codes,
                shape=chunk_shape,
                interpret=interpret,
                q_scale=q_scale,
                with_lse=with_lse,
                chunk=chunk,
                ring_sink=ring_sink,
            )

        batchable = chunks.rows_folded(forward)

        def forward_rule(q, k, v, hp, position, defined):
            o, lse = forward(q, k, v, hp, position, defined, with_lse=True)
            return o, (q, k, v, hp, position, defined, o, lse)

        def backward_rule(residuals, do):
            from svgen.runtime import backward

            q, k, v, hp, position, defined, o, lse = residuals
            q_scaled = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
            dkv = kv_cache.transposed_tables(chunk_shape)
            dq, dk, dv = backward.backward(
                q_scaled,
                k,
                v,
                o,
                lse,
                do,
                hp,
                None,
                forward_tables=tables,
                dkv_tables=dkv,
                patterns=codes,
                shape=chunk_shape,
                sm_scale=sm_scale,
                interpret=interpret,
                chunk=chunk_operands(dkv, position, hp, defined, q.shape[0]),
                ring_sink=ring_sink,
            )
            return dq, dk, dv, _no_cotangent(hp), _no_cotangent(position), _no_cotangent(defined)

        core = jax.custom_vjp(batchable)
        core.defvjp(forward_rule, backward_rule)
        return core(q, k, v, head_pattern, position, defined)

    def chunked(q, k, v, q_frame_offset, head_pattern, interpret, sm_scale, token_order):
        if kv_cache is None:
            raise TypeError(
                "q_frame_offset: this module was compiled without `runtime: {kv_cache: "
                "{chunk_frames: C}}` in its spec; add it and run svgen compile again"
            )
        _check_dtypes(q, k, v, dtype)
        chunks.check_chunk_operands(q, k, v, kv_cache, shape.seq_len, shape.head_dim)
        check_token_order(token_order)  # frame-major only: the user's order is the kernel's
        sm_scale = checked_sm_scale(sm_scale, shape.head_dim)
        position, valid = chunks.chunk_position(q_frame_offset, kv_cache)
        requested = head_pattern
        static_pattern, head_pattern, _ = resolved(head_pattern, q.shape[-3])
        flat = [x.reshape((-1,) + x.shape[-2:]) for x in (q, k, v)]
        defined = chunks.defined_rows(requested, valid, len(patterns), flat[0].shape[0])
        out = chunk_core(
            *flat,
            head_pattern,
            position,
            defined,
            interpret,
            float(sm_scale) * LOG2_E,
            float(sm_scale),
        )
        return out.reshape(q.shape)

    def attention(
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
    ):
        amount = select_policy.call_amount(select, top_k, top_p)
        if q_frame_offset is not None:
            return chunked(q, k, v, q_frame_offset, head_pattern, interpret, sm_scale, token_order)
        _check_operands(q, k, v, shape, dtype)
        check_token_order(token_order)
        sm_scale = checked_sm_scale(sm_scale, shape.head_dim)
        ids = call_ids(segment_ids, text_lengths, q.shape[0] if q.ndim == 4 else None)
        requested = head_pattern
        static_pattern, head_pattern, head_layout = resolved(head_pattern, q.shape[-3])
        lead = q.shape[:-2]
        in_kernel_order = token_order == "kernel"
        # In kernel order every tile is a contiguous run already: plain blocks, no cube DMA.
        # Cube DMA reads and writes the user's array: nothing to move either.
        box_dma = None if in_kernel_order else cubes
        mover = None
        if not in_kernel_order and box_dma is None:
            mover = _layout_mover(
                layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
            )

        def to_kernel(x):
            if box_dma is not None:
                return x.reshape((-1, *box_dma.view, shape.head_dim))
            if mover is not None:
                x = mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        qk, kk = to_kernel(q), to_kernel(k)
        out = differentiable(
            qk,
            kk,
            to_kernel(v),
            head_pattern,
            static_pattern,
            interpret,
            float(sm_scale) * LOG2_E,
            float(sm_scale),
            box_dma,
            ids,
            chosen_blocks(qk, kk, box_dma, sm_scale, amount),
        )
        out = out.reshape(lead + (shape.seq_len, shape.head_dim))
        out = out if mover is None else mover(out, to_kernel=False)
        return poison_unknown_patterns(out, requested, len(patterns))

    def softmax_modes(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None):
        """int32 [..., heads, q tiles]: for a call attention(q, k, v, head_pattern=...,
        sm_scale=...) (no run-time inputs), 1 where the q tile ran with the bounded max, 0
        where it fell back to the online softmax (spec `attention.softmax: bounded`; q tiles
        in each head's kernel order). A diagnostic: it runs the kernel once more."""
        _check_operands(q, k, v, shape, dtype)
        sm_scale = checked_sm_scale(sm_scale, shape.head_dim)
        static_pattern, head_pattern, head_layout = resolved(head_pattern, q.shape[-3])
        mover = _layout_mover(
            layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
        )

        def to_kernel(x):
            x = x if mover is None else mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        _, modes = _flat_attention(
            *(to_kernel(x) for x in (q, k, v)),
            head_pattern,
            static_pattern,
            tables,
            codes,
            shape=shape,
            interpret=interpret,
            q_scale=float(sm_scale) * LOG2_E,
            with_modes=True,
        )
        return modes[:, 0, ::LANES].reshape(q.shape[:-2] + (-1,))

    def chosen_blocks(q, k, box_dma, sm_scale, amount):
        """The call's selection (svgen.runtime.select.Selected), or None without a policy:
        scored from q, k in kernel order (cube DMA's 5-D user view moved into it)."""
        if select is None:
            return None
        if box_dma is not None:
            q, k = (_cube_order(x, layouts[0], to_kernel=True) for x in (q, k))
        select.check_smem(q.shape[0])
        return select.select(q, k, float(sm_scale), amount)

    def order_mover(x, head_pattern, interpret):
        """The mover of [..., heads, seq, d] arrays between the user's and the kernel order
        (the permute kernel where it applies, else XLA; never cube DMA, which is a way of
        reading the user's order, not an order), or None where the orders are the same."""
        check_order_operand(x, shape)
        static_pattern, _, head_layout = resolved(head_pattern, x.shape[-3])
        return _layout_mover(
            layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
        )

    def to_kernel_order(x, *, head_pattern=None, interpret=False):
        """x [..., heads, seq, d] in the user's token order -> each head's kernel order."""
        mover = order_mover(x, head_pattern, interpret)
        return x if mover is None else mover(x, to_kernel=True)

    def from_kernel_order(y, *, head_pattern=None, interpret=False):
        """The inverse of to_kernel_order."""
        mover = order_mover(y, head_pattern, interpret)
        return y if mover is None else mover(y, to_kernel=False)

    attention.__doc__ = attention_doc(
        shape,
        dtype,
        [p.name for p in patterns],
        default_head_pattern,
        backend="TPU",
        runtime=runtime,
        text_tokens=layouts[0].text_tokens,
        kv_cache=kv_cache,
        select=select,
    )
    segments.declared_signature(
        attention, runtime, kv_cache is not None, None if select is None else select.policy.rule
    )
    attention.to_kernel_order = to_kernel_order
    if shape.bounded_softmax:
        attention.softmax_modes = softmax_modes
    attention.from_kernel_order = from_kernel_order
    attention.tables = tables
    attention.runtime = runtime
    attention.kv_cache = kv_cache
    attention.select = select
    attention.cube_dma = cubes
    attention.permute_kernel = permute_kernel
    return attention


def _no_cotangent(x):
    """The cotangent of an integer input (head_pattern, run-time ids): none."""
    return np.zeros(x.shape, jax.dtypes.float0)


def attention_doc(
    shape: KernelShape,
    dtype: str | None,
    pattern_names: Sequence[str],
    default_head_pattern: Sequence[int] | None,
    *,
    backend: str,
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
    if backend == "TPU":
        interpret = (
            "True (or a pltpu.InterpretParams) runs the kernel in Pallas's TPU interpreter, on\n"
            "    the CPU; False compiles it for the TPU."
        )
        grads = "Differentiable in q, k and v (jax.grad: svgen's backward kernels)."
    else:
        interpret = (
            "True runs the kernel in Pallas's interpreter, on the CPU; False compiles it\n"
            "    with Triton for the GPU."
        )
        grads = "Forward only: no gradient yet on GPU."
    extra = "".join(f", {name}=None" for name in runtime.arguments())
    if kv_cache is not None:
        extra += ", q_frame_offset=None"
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
    if select is not None:
        policy = select.policy
        extra += f", {policy.rule}=None"
        if policy.rule == "top_k":
            amount = f"int [] (may be traced): kv blocks per compute block row (None: {int(policy.default)})"
        else:
            amount = (
                f"float [] in 0 .. 1 (may be traced): the mass to reach (None: {policy.default})"
            )
        runtime_lines += f"""{policy.rule}: {amount}, clamped to
    {policy.min_blocks} .. {policy.max_blocks}. Each call scores the candidate region's compute blocks
    ({shape.cq} x {shape.ckv} tokens) by mean-pooled q . k and attends the chosen ones whole, on
    top of the mask (svgen.runtime.select); a NaN or +inf score always selects its block. One
    compile for every value; gradients hold the selection fixed.
"""
    if kv_cache is not None and kv_cache.rolling:
        c, rows, s, w = (
            kv_cache.chunk_frames,
            kv_cache.rows,
            kv_cache.sink_frames,
            kv_cache.window_frames,
        )
        runtime_lines += f"""q_frame_offset: int32 [] (may be traced), a multiple of {c} in 0 .. {kv_cache.frames - c}: a chunked call
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
    elif kv_cache is not None:
        c, rows = kv_cache.chunk_frames, kv_cache.rows
        chunk_grads = (
            "jax.grad gives dq of the chunk and\n    dk, dv of the whole cache."
            if backend == "TPU"
            else "Forward only."
        )
        runtime_lines += f"""q_frame_offset: int32 [] (may be traced), a multiple of {c} in 0 .. {kv_cache.frames - c}: a chunked call
    (KV cache). q is then [heads, {rows}, {d}] or [batch, heads, {rows}, {d}], the queries of
    frames q_frame_offset .. + {c - 1}; k and v the cache of the whole video, [.., heads, {n}, {d}],
    frame t at tokens t * {kv_cache.frame_tokens} ..; frames after the chunk are never attended
    (they must only be finite). The mask is the full sequence's, in absolute frames: chunk by
    chunk, o equals the full-sequence call's rows. A traced offset that is no chunk start
    gives NaN outputs; a concrete one raises. {chunk_grads}
"""
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
Returns o, of q's shape and dtype; a query whose mask keeps no key gets zeros.
{grads}
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


def _layout_mover(
    layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
):
    """How arrays [..., heads, seq, d] go between the user's order and each head's kernel
    order: `mover(x, to_kernel)`, or None where nothing moves. The permute kernel moves
    temporal-major heads (nothing at all when a static assignment gives every head an
    identity layout); otherwise XLA permutes each layout."""
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

    def by_xla(x, to_kernel):
        return _per_head_layout(x, layouts, head_layout, to_kernel)

    return by_xla


def _cube_order(x, layout: TokenLayout, to_kernel: bool):
    """Cube DMA's [rows, frames, height, width, d] (the user's order) to [rows, seq_len, d]
    in the layout's kernel order, or back (the backward pass's operands and gradients)."""
    if to_kernel:
        return layout.to_kernel(x.reshape(x.shape[0], -1, x.shape[-1]), jnp)
    y = layout.from_kernel(x, jnp)
    return y.reshape(y.shape[0], layout.frames, layout.height, layout.width, y.shape[-1])


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


def _check_operands(
    q, k, v, shape: KernelShape, dtype: str | None = None, rebuild: dict | None = None
) -> None:
    """q, k, v as the kernel takes them. `rebuild`: dtype name -> how to build a kernel for
    it other than from a spec (the GPU's float16), for the advice of a dtype mismatch."""
    _check_dtypes(q, k, v, dtype, rebuild)
    if q.ndim not in (3, 4) or q.shape[-2:] != (shape.seq_len, shape.head_dim):
        raise ValueError(_shape_message("q", q.shape, shape))
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v shapes differ: {q.shape}, {k.shape}, {v.shape}")


def _check_dtypes(q, k, v, dtype: str | None = None, rebuild: dict | None = None) -> None:
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
