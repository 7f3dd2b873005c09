"""The TPU forward kernel: block-sparse flash attention over piece tables (a Pallas TPU
kernel; the tables and the step reader are svgen.runtime.tables and svgen.runtime.steps).

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
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime import chunks
from svgen.runtime.coords import QueryCoords, TokenCoords
from svgen.runtime.cube import BoxRows, CubeDma
from svgen.runtime.interpret import settled
from svgen.runtime.kinds import TileKind
from svgen.runtime.layout import TokenLayout
from svgen.runtime.refine import SEGMENT_BOUNDARY
from svgen.runtime.straight import StraightWord
from svgen.runtime.segments import block_shifts, same_segment
from svgen.runtime.select import PADDED
from svgen.runtime.softmax import (
    EMPTY_ROW_LSE,
    MASK_VALUE,
    bounded_init,
    key_bound,
    softmax_step,
)
from svgen.runtime.steps import EXACT_GRID, Block, StepView, grid_step, head_operands, lanes
from svgen.runtime.tables import (
    KIND_MASK,
    LANES,
    variant_bits,
    variant_mask,
    BoundaryMask,
    KernelShape,
    PieceTables,
)
from svgen.runtime.video_frames import ShiftedFrames
from svgen.runtime.vmem import kernel_vmem


class _QueryBlockCoords:
    """The query coordinates of one compute block, read from the per-q-tile VMEM copy as
    [cq, ckv] (lane-replicated, tiled across the keys: full vregs, no broadcast)."""

    def __init__(self, coords_ref, names: tuple, block: Block):
        self._ref, self._names, self._block = coords_ref, names, block

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in self._names:
            raise AttributeError(
                f"query coordinate {name!r} was not decoded for this mask (decoded: {self._names})"
            )
        value = self._read(self._names.index(name))
        return value != 0 if name == "is_text" else value

    def once(self, function):
        """A query function's value (coords.TokenCoords.once), computed in init with the
        coordinates: one read, where computing it here would cost its ops on every block."""
        if function not in self._names:
            raise AttributeError(f"query function {function.__name__} was not decoded")
        return self._read(self._names.index(function))

    def _read(self, index: int):
        return lanes(self._ref[index, self._block.rows, :], self._block.shape.ckv)


def _decode_query_coords(
    coords_ref,
    names: tuple[str, ...],
    layout: TokenLayout,
    q_block,
    shape: "KernelShape",
    q_first=None,
):
    """Decode a q tile's query coordinates (row form) into coords_ref [n, block_q, 128]: a
    name, the coordinate; a function (a generated module's query function), its value,
    computed in row form too and transposed once. q_first: a chunked call's first query
    token in the video (svgen.runtime.chunks)."""
    pos = q_block * shape.block_q + lax.broadcasted_iota(jnp.int32, (1, shape.block_q), 1)
    if q_first is not None:
        pos = pos + q_first
    q = QueryCoords(pos, layout)
    rows = TokenCoords(pos, layout)
    for index, name in enumerate(names):
        if callable(name):
            value = jnp.transpose(jnp.broadcast_to(name(rows), pos.shape).astype(jnp.int32))
        else:
            value = getattr(q, name).astype(jnp.int32)  # [block_q, 1]
        coords_ref[index] = jnp.broadcast_to(value, (shape.block_q, LANES))


def _both(condition, in_mode):
    """condition & in_mode, with no extra op where in_mode is True (a kernel without the
    bounded twin traces exactly the ops it always had)."""
    return condition if in_mode is True else condition & in_mode


# One function on purpose (~290 lines): a Pallas kernel body. Its paths (init, FULL, BOUNDARY,
# residual, padding, finalize) are pl.when branches closing over the same refs and carried
# scratch; split into functions they would pass ~20 refs and flags each, and the branch
# structure libtpu schedules (svgen cost's paths) would no longer read top to bottom.
def _attention_kernel(
    *refs,
    shape: KernelShape,
    heads: int,
    num_tables: int,
    patterns: tuple["PatternCode", ...],
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
    has_straight: bool = False,
):
    """has_straight: static tables, so the BOUNDARY tiles of a pattern's straight words
    (PatternCode.straight_words, svgen.runtime.straight) run the word's straight-line body;
    any other word takes a branch per compute block.
    has_variants: static tables whose last scalar operand holds each piece's residual-mask
    variants (variant_bits per compute block; svgen.analysis.residuals): a BOUNDARY block of
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
        q_ref, k_ref, v_ref, o_ref = (BoxRows(ref) for ref in (q_ref, k_ref, v_ref, o_ref))
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
        Block(qi, ki, shape)
        for qi in range(shape.q_blocks_per_tile)
        for ki in range(shape.kv_blocks_per_tile)
    ]

    @pl.when(is_first)
    def init():
        # q scaled once per q tile by sm_scale * log2(e): scores come out in base 2 (exp2,
        # no per-score multiply), and the wrapper makes no pass over q for it.
        q_scaled[...] = (q_ref[...].astype(jnp.float32) * q_scale).astype(q_scaled.dtype)
        if bounded_kernel:
            m_scratch[...] = bounded_init(q_scaled, key_bound_ref, mode_ref, q_block, q_rows, shape)
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

    def keep_of(block: Block, pattern: "PatternCode", padding: bool, segmented: bool):
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
        block: Block,
        state,
        pattern: "PatternCode | None",
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
        return softmax_step(
            state, q_scaled[block.rows, :], k_ref[block.cols, :], v, keep, shape, bounded
        )

    def masked(
        block: Block, pattern: "PatternCode", segmented: bool = False, bounded: bool = False
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

    def boundary(block: Block, pattern: "PatternCode", bounded: bool):
        """A BOUNDARY block: its residual mask where the tables name one (a branch per
        variant, the whole mask first), else the whole mask."""
        if not (has_variants and pattern.residual_masks):
            masked(block, pattern, bounded=bounded)
            return
        word = table_refs[-1][view.piece].astype(jnp.int32)
        shift = variant_bits(shape.compute_blocks) * (
            block.qi * shape.kv_blocks_per_tile + block.ki
        )
        variant = lax.shift_right_logical(word, shift) & variant_mask(shape.compute_blocks)
        for j in range(len(pattern.residual_masks) + 1):
            pl.when(variant == j)(
                functools.partial(masked, block, pattern.variant(j), bounded=bounded)
            )

    def per_block(word, pattern: "PatternCode", bounded: bool):
        """Each compute block in a branch of its own, by its kind in the word."""
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
                    functools.partial(masked, block, every_key(pattern), bounded=bounded)
                )

    def straight(kinds: tuple[int, ...], pattern: "PatternCode | None", bounded: bool):
        """Straight-line code over a tile's compute blocks of these kinds (row-major): per row,
        its non-empty blocks one after another with the state in values, so the scheduler
        overlaps one block's softmax with the next block's QK^T; BOUNDARY ones masked by the
        whole mask. A FULL tile (every block FULL), and a BOUNDARY tile of a word with a body
        of its own (svgen.runtime.straight)."""
        for qi in range(shape.q_blocks_per_tile):
            row = [b for b in blocks if b.qi == qi and kinds[b.index] != TileKind.EMPTY]
            if not row:
                continue
            state = load(row[0].rows)
            for block in row:
                masked_by = pattern if kinds[block.index] == TileKind.BOUNDARY else None
                state = update(block, state, masked_by, bounded=bounded)
            store(row[0].rows, state, bounded)

    def body_paths(bounded: bool, in_mode):
        """The FULL and BOUNDARY paths of a step, for q tiles of one softmax mode (in_mode:
        True, or the bounded kernel's traced mode test)."""

        every_block_full = (TileKind.FULL,) * shape.compute_blocks
        pl.when(_both(active & (kind == TileKind.FULL), in_mode))(
            functools.partial(straight, every_block_full, None, bounded)
        )

        for index, pattern in enumerate(patterns):
            is_pattern = True if len(patterns) == 1 else view.pattern == index

            @pl.when(_both(active & (kind == TileKind.BOUNDARY) & is_pattern, in_mode))
            def mixed():
                if not has_blocks:  # one compute block per tile: it is BOUNDARY
                    boundary(blocks[0], pattern, bounded)
                    return
                word = view.blocks
                # A bounded kernel's online twin (the fallback, rarely run) keeps the branches:
                # each body costs compile time (svgen.runtime.straight).
                words = pattern.straight_words if has_straight and bounded == bounded_kernel else ()
                if not words:
                    per_block(word, pattern, bounded)
                    return
                chosen = []
                for straight_word in words:
                    this = word == _as_int32(straight_word.word)
                    if straight_word.avoid_padding_tile:
                        this = this & (kv_block != shape.padding_kv_tile)
                    kinds = straight_word.kinds(shape.compute_blocks)
                    pl.when(this)(functools.partial(straight, kinds, pattern, bounded))
                    chosen.append(this)
                pl.when(~functools.reduce(operator.or_, chosen))(
                    functools.partial(per_block, word, pattern, bounded)
                )

            if segments and not has_blocks:
                # One compute block per tile: the tile's kind says whether it spans segments.
                pl.when(_both(active & (kind == SEGMENT_BOUNDARY) & is_pattern, in_mode))(
                    functools.partial(masked, blocks[0], pattern, True, bounded)
                )

        if selected and not has_blocks and shape.padding_kv_tile is not None:
            # A selected tile of one compute block holding the end of the keys.
            pl.when(_both(active & (kind == PADDED), in_mode))(
                functools.partial(masked, blocks[0], every_key(patterns[0]), bounded=bounded)
            )

    if bounded_kernel:
        # Every path twice, each set in one branch on the tile's mode (one SMEM load a step),
        # so that a step tests only its own set's conditions: the bounded set first, then
        # the online fallback (the order svgen.perf.paths reads).
        bounded_mode = mode_ref[0] != 0
        pl.when(bounded_mode)(functools.partial(body_paths, True, True))
        pl.when(jnp.logical_not(bounded_mode))(functools.partial(body_paths, False, True))
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
        o_ref[...] = (acc_scratch[:, : shape.head_dim] * lanes(inv, shape.head_dim)).astype(
            o_ref.dtype
        )
        if with_lse:  # lane-major [1, block_q]: what the backward kernels broadcast
            lse = jnp.where(seen, m_scratch[...] + jnp.log2(jnp.where(seen, l, 1.0)), EMPTY_ROW_LSE)
            outputs[1][...] = jnp.transpose(lse[:, :1])
        if with_modes:
            outputs[-1][...] = jnp.full(outputs[-1].shape, mode_ref[0], jnp.int32)


@dataclasses.dataclass(frozen=True)
class PatternCode:
    """What the kernel body needs of a pattern: its mask, layout and decoded query coords,
    and the residual masks its BOUNDARY blocks may run instead of the mask."""

    boundary_mask: BoundaryMask
    layout: TokenLayout
    query_coords: tuple[str, ...]
    residual_masks: tuple[BoundaryMask, ...] = ()
    # The blocks words whose BOUNDARY tiles run a straight-line body (static tables only).
    straight_words: tuple[StraightWord, ...] = ()

    def variant(self, j: int) -> "PatternCode":
        """The pattern as its variant j runs it (0: the whole mask)."""
        mask = self.boundary_mask if j == 0 else self.residual_masks[j - 1]
        return PatternCode(mask, self.layout, self.query_coords)


def _as_int32(word: int) -> int:
    """A blocks word as the int32 the kernel reads (a 16-block word fills the sign bit)."""
    return word - (1 << 32) if word >= 1 << 31 else word


def every_key(pattern: PatternCode) -> PatternCode:
    """The mask of a selected block (svgen.runtime.select): every key, the kernel's padding
    test dropping those past seq_len."""
    return PatternCode(_keep_every_key, pattern.layout, ())


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
        shape.mxu_width,
    )
    if ids:
        need = dataclasses.replace(
            need, pipeline=need.pipeline + 2 * 8 * 4 * (shape.block_q + shape.block_kv)
        )
    return max(shape.vmem_limit_bytes or 0, need.limit())


# Long on purpose (~180 lines): the pallas_call's operands, block specs and scratch are one
# list whose order the kernel body unpacks; building it in one place keeps the two in step.
def flat_attention(
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
        per_head, steps = head_operands(tables, head_pattern, static_pattern)
        operands = per_head + tuple(jnp.asarray(t) for t in tables.piece_operands())
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
        has_straight=not per_row,
    )

    def view(outer, step, table_refs):
        return StepView(
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
