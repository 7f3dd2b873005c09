"""The TPU forward kernel: block-sparse flash attention over piece tables (a Pallas TPU
kernel; the tables and the step reader are svgen.core.tables and svgen.runtime.steps).

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

from svgen.runtime import chunks
from svgen.runtime.coords import QueryCoords, TokenCoords, block_pieces, block_table_inputs
from svgen.runtime.cube import BoxRows, tile_positions
from svgen.runtime.forward_call import ForwardCall
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.runtime.quantize import QK_PRODUCTS, quantized_operands
from svgen.runtime.refine import SEGMENT_BOUNDARY
from svgen.runtime.segments import block_shifts, same_segment
from svgen.runtime.select_walk import PADDED
from svgen.runtime.softmax import (
    EMPTY_ROW_LSE,
    MASK_VALUE,
    bounded_init,
    key_bound,
    softmax_step,
)
from svgen.runtime.steps import Block, StepView, lanes, walk_step
from svgen.runtime.tpu_call import IndexMaps, KernelCall
from svgen.core.tables import (
    KIND_MASK,
    LANES,
    variant_bits,
    variant_mask,
    KernelShape,
)
from svgen.runtime.variant import (
    ForwardVariant,
    KernelRefs,
    PatternCode,
    block_table_bytes,
    every_key,
    or_chosen,
)
from svgen.runtime.video_frames import ShiftedFrames
from svgen.core.vmem import kernel_vmem


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
    q_places: int = 0,
):
    """Decode a q tile's query coordinates (row form) into coords_ref [n, block_q, 128]: a
    name, the coordinate; a function (a generated module's query function), its value,
    computed in row form too and transposed once. q_first: a chunked call's first query
    token in the video (svgen.runtime.chunks). q_places: the tile's rows are a place box's
    (svgen.runtime.cube)."""
    pos = tile_positions(q_block, shape.block_q, q_places, (1, shape.block_q), 1)
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


# ------------------------------------------------------------------------------ the kernel
# The body is a sequence of pl.when branches (init, the FULL and BOUNDARY paths, finalize;
# svgen.runtime.variant.Branches says their order, which svgen.estimate.paths reads in libtpu's
# schedule). Each phase is a function of the step below; its variant holds every static
# choice, its refs are unpacked by name from the variant's operands.


@dataclasses.dataclass(frozen=True)
class _Step:
    """One grid step: the kernel's variant and refs, and where the tables put the step."""

    variant: ForwardVariant
    refs: KernelRefs
    view: StepView
    kind: object  # the tile's kind (TileKind, or kind 3: SEGMENT_BOUNDARY / PADDED)
    q_block: object
    kv_block: object
    active: object  # the step is inside its piece (its slot within the piece's length)
    is_first: object  # first step of its q tile
    is_last: object  # last step of its q tile
    q_first: object  # a chunk's call: the chunk's first query token in the video
    blocks: tuple[Block, ...]  # the tile's compute blocks, row-major

    @property
    def shape(self) -> KernelShape:
        return self.variant.shape


def _attention_kernel(*refs, variant: ForwardVariant):
    """The forward kernel: refs in the order of variant.operands() (svgen.runtime.variant)."""
    r = variant.unpack(refs)
    if variant.cube is not None:  # cube DMA: each [a, b, c, d] box read as [cube tokens, d]
        r = dataclasses.replace(r, q=BoxRows(r.q), k=BoxRows(r.k), v=BoxRows(r.v), o=BoxRows(r.o))
    walk, shape = variant.walk, variant.shape
    view, kind, q_block, kv_block, active, is_first, is_last = walk_step(r.tables, walk)
    step = _Step(
        variant,
        r,
        view,
        kind,
        q_block,
        kv_block,
        active,
        is_first,
        is_last,
        # A chunked call's last scalar operand (svgen.runtime.chunks).
        r.last_scalar[view.row] if variant.chunked else None,
        tuple(
            Block(qi, ki, shape)
            for qi in range(shape.q_blocks_per_tile)
            for ki in range(shape.kv_blocks_per_tile)
        ),
    )
    pl.when(is_first)(functools.partial(_init, step))
    if variant.bounded:
        # Every path twice, each set in one branch on the tile's mode (one SMEM load a step),
        # so that a step tests only its own set's conditions: the bounded set first, then
        # the online fallback (the order svgen.estimate.paths reads).
        bounded_mode = r.mode[0] != 0
        pl.when(bounded_mode)(functools.partial(_body_paths, step, True, True))
        pl.when(jnp.logical_not(bounded_mode))(functools.partial(_body_paths, step, False, True))
    else:
        _body_paths(step, False, True)
    pl.when(is_last)(functools.partial(_finalize, step))


def _init(step: _Step):
    """First step of a q tile: scale q, reset the softmax state, decode query coordinates."""
    variant, r, shape = step.variant, step.refs, step.shape
    # q scaled once per q tile by sm_scale * log2(e) (float QK^T; int8's scales carry it):
    # scores come out in base 2 (exp2, no per-score multiply), and the wrapper makes no
    # pass over q for it.
    QK_PRODUCTS[variant.qk].init(r, variant.q_scale)
    if variant.bounded:
        r.m[...] = bounded_init(
            r.q_scaled, r.key_bound, r.mode, step.q_block, variant.q_rows, shape
        )
    else:
        r.m[...] = jnp.full(r.m.shape, MASK_VALUE, jnp.float32)
    r.acc[...] = jnp.zeros(r.acc.shape, jnp.float32)
    if r.l is not None:
        r.l[...] = jnp.zeros(r.l.shape, jnp.float32)
    for index, p in enumerate(variant.patterns):
        if not p.query_coords:
            continue
        decode = functools.partial(
            _decode_query_coords,
            r.coords,
            p.query_coords,
            p.layout,
            step.q_block,
            shape,
            step.q_first,
            variant.box_q_places,
        )
        if len(variant.patterns) == 1:
            decode()
        else:
            pl.when(step.view.pattern == index)(decode)


def _load(step: _Step, rows):
    r = step.refs
    return r.m[rows, :], r.acc[rows, :], None if r.l is None else r.l[rows, :]


def _store(step: _Step, rows, state, bounded: bool = False):
    r = step.refs
    if not bounded:  # a bounded tile's m is its fixed bound
        r.m[rows, :] = state[0]
    r.acc[rows, :] = state[1]
    if r.l is not None:
        r.l[rows, :] = state[2]


def _key_positions(step: _Step, block: Block, shape: tuple[int, int]):
    """The block's key positions, int32 of `shape` ([1, ckv] or [ckv, 1])."""
    axis = 1 if shape[0] == 1 else 0
    offset = block.ki * step.shape.ckv
    places = step.variant.box_kv_places
    return tile_positions(step.kv_block, step.shape.block_kv, places, shape, axis, offset)


def _keep_of(step: _Step, block: Block, pattern: PatternCode, padding: bool, segmented: bool):
    """bool [cq, ckv]: the pairs of a BOUNDARY block the pattern keeps."""
    variant, r, shape = step.variant, step.refs, step.shape
    k_pos = _key_positions(step, block, (1, shape.ckv))
    k_video = k_pos
    if variant.ring_sink is not None:  # a rolling cache's slot -> the video token it holds
        k_video = chunks.slot_keys(
            k_pos, variant.ring_sink, r.last_scalar, variant.chunked, step.view.row
        )
    q = _QueryBlockCoords(r.coords, pattern.query_coords, block)
    k = TokenCoords(k_video, pattern.layout, block_pieces(r.block_tables, block, shape))
    shifts = block_shifts(r.id_refs, block.rows, block.cols) if segmented else None
    if shifts is not None:  # per-video frames: counted from each token's video segment
        q, k = ShiftedFrames(q, shifts[0]), ShiftedFrames(k, shifts[1])
    keep = jnp.broadcast_to(pattern.boundary_mask(q, k), (shape.cq, shape.ckv))
    if segmented:  # the block spans run-time segments: only pairs of one segment
        keep = keep & same_segment(r.id_refs, block.rows, block.cols)
    # Padding keys are never attended, whatever the predicate says about them.
    return keep & (k_pos < shape.seq_len) if padding else keep


def _update(
    step: _Step,
    block: Block,
    state,
    pattern: PatternCode | None,
    padding: bool = False,
    segmented: bool = False,
    bounded: bool = False,
):
    """One compute block's softmax update of `state`; pattern None: FULL, no mask."""
    r, shape = step.refs, step.shape
    keep = None if pattern is None else _keep_of(step, block, pattern, padding, segmented)
    v = r.v[block.cols, :]
    if padding:
        # Keys past the sequence lie outside the operands: the DMA leaves whatever was
        # in VMEM there. Their probabilities are 0, but 0 * NaN is not: zero those rows.
        row = _key_positions(step, block, (shape.ckv, 1))
        v = jnp.where(row < shape.seq_len, v, jnp.zeros_like(v))
    scores = QK_PRODUCTS[step.variant.qk].scores(r, block)
    return softmax_step(state, scores, v, keep, shape, bounded)


def _masked(
    step: _Step, block: Block, pattern: PatternCode, segmented: bool = False, bounded: bool = False
):
    """A BOUNDARY block. Only one block column of one kv tile holds padding keys (and never
    a FULL block: the tables make it BOUNDARY); the test costs a full-block VALU op and a
    vreg store per vreg (1,846 bundles against 1,520 without, temporal-major 1024 x 512), so
    the others run without it. segmented: a SEGMENT_BOUNDARY block of run-time tables (it
    also tests the segment ids)."""
    shape = step.shape

    def run(padding: bool):
        state = _update(step, block, _load(step, block.rows), pattern, padding, segmented, bounded)
        _store(step, block.rows, state, bounded)

    if shape.padding_kv_tile is None or block.ki != shape.padding_block_column:
        run(False)
        return
    pl.when(step.kv_block != shape.padding_kv_tile)(functools.partial(run, False))
    pl.when(step.kv_block == shape.padding_kv_tile)(functools.partial(run, True))


def _boundary(step: _Step, block: Block, pattern: PatternCode, bounded: bool):
    """A BOUNDARY block: its residual mask where the tables name one (a branch per variant,
    the whole mask first), else the whole mask."""
    shape = step.shape
    if not (step.variant.has_variants and pattern.residual_masks):
        _masked(step, block, pattern, bounded=bounded)
        return
    word = step.refs.last_scalar[step.view.piece].astype(jnp.int32)
    shift = variant_bits(shape.compute_blocks) * (block.qi * shape.kv_blocks_per_tile + block.ki)
    variant = lax.shift_right_logical(word, shift) & variant_mask(shape.compute_blocks)
    for j in range(len(pattern.residual_masks) + 1):
        pl.when(variant == j)(
            functools.partial(_masked, step, block, pattern.variant(j), bounded=bounded)
        )


def _full_block(step: _Step, block: Block, bounded: bool):
    state = _update(step, block, _load(step, block.rows), None, bounded=bounded)
    _store(step, block.rows, state, bounded)


def _per_block(step: _Step, word, pattern: PatternCode, bounded: bool):
    """Each compute block in a branch of its own, by its kind in the word."""
    variant = step.variant
    for block in step.blocks:
        block_kind = lax.shift_right_logical(word, block.bit) & KIND_MASK
        pl.when(block_kind == TileKind.FULL)(functools.partial(_full_block, step, block, bounded))
        pl.when(block_kind == TileKind.BOUNDARY)(
            functools.partial(_boundary, step, block, pattern, bounded)
        )
        if variant.segments:  # only run-time tables have such blocks
            _across_segments(step, block, block_kind == SEGMENT_BOUNDARY, pattern, bounded)
        elif variant.padded and block.ki == step.shape.padding_block_column:
            pl.when(block_kind == PADDED)(
                functools.partial(_masked, step, block, every_key(pattern), bounded=bounded)
            )


def _across_segments(step: _Step, block: Block, when, pattern: PatternCode, bounded: bool):
    """A SEGMENT_BOUNDARY block (when: its traced condition): the pattern's mask and the
    segment ids; with a selection across segments, a chosen block (the piece's chosen word)
    keeps every key of its segment instead: one body, whose mask ORs the chosen bit in
    (a second body per pattern took the moc_480p_packed kernel from 36,639 bundles to
    69,408, and 5.8 ms to 33.9 on a v5e: past the program size the chip runs well)."""
    if step.variant.selected:
        pattern = or_chosen(pattern, step.view.chosen(block.index))
    pl.when(when)(functools.partial(_masked, step, block, pattern, True, bounded))


def _straight(step: _Step, kinds: tuple[int, ...], pattern: PatternCode | None, bounded: bool):
    """Straight-line code over a tile's compute blocks of these kinds (row-major): per row, its
    non-empty blocks one after another with the state in values, so the scheduler overlaps one
    block's softmax with the next block's QK^T; BOUNDARY ones masked by the whole mask. A FULL
    tile (every block FULL), and a BOUNDARY tile of a word with a body of its own
    (svgen.core.straight)."""
    for qi in range(step.shape.q_blocks_per_tile):
        row = [b for b in step.blocks if b.qi == qi and kinds[b.index] != TileKind.EMPTY]
        if not row:
            continue
        state = _load(step, row[0].rows)
        for block in row:
            masked_by = pattern if kinds[block.index] == TileKind.BOUNDARY else None
            state = _update(step, block, state, masked_by, bounded=bounded)
        _store(step, row[0].rows, state, bounded)


def _mixed(step: _Step, pattern: PatternCode, bounded: bool):
    """A BOUNDARY tile of this pattern: its word's straight-line body where it has one, else
    a branch per compute block."""
    variant = step.variant
    if not variant.walk.has_blocks:  # one compute block per tile: it is BOUNDARY
        _boundary(step, step.blocks[0], pattern, bounded)
        return
    word = step.view.blocks
    # A bounded kernel's online twin (the fallback, rarely run) keeps the branches: each
    # body costs compile time (svgen.core.straight).
    straight_here = variant.has_straight and bounded == variant.bounded
    words = pattern.straight_words if straight_here else ()
    if not words:
        _per_block(step, word, pattern, bounded)
        return
    chosen = []
    for straight_word in words:
        this = word == _as_int32(straight_word.word)
        if straight_word.avoid_padding_tile:
            this = this & (step.kv_block != step.shape.padding_kv_tile)
        kinds = straight_word.kinds(step.shape.compute_blocks)
        pl.when(this)(functools.partial(_straight, step, kinds, pattern, bounded))
        chosen.append(this)
    pl.when(~functools.reduce(operator.or_, chosen))(
        functools.partial(_per_block, step, word, pattern, bounded)
    )


def _body_paths(step: _Step, bounded: bool, in_mode):
    """The FULL and BOUNDARY paths of a step, for q tiles of one softmax mode (in_mode: True,
    or the bounded kernel's traced mode test): the phases the variant's Branches declares
    (Branches.phases, the names svgen.runtime.branch_tree and the cost model read), each
    emitted by name in that order."""
    is_pattern = {}  # pattern index -> its test, made once and shared by its phases
    for name in step.variant.branches.phases():
        phase, _, index = name.rstrip("]").partition("[")
        _PHASES[phase](step, int(index or 0), is_pattern, bounded, in_mode)


def _full_phase(step: _Step, _, is_pattern, bounded: bool, in_mode):
    """A FULL tile: every compute block unmasked, straight-line."""
    every_block_full = (TileKind.FULL,) * step.shape.compute_blocks
    pl.when(_both(step.active & (step.kind == TileKind.FULL), in_mode))(
        functools.partial(_straight, step, every_block_full, None, bounded)
    )


def _pattern_test(step: _Step, index: int, is_pattern: dict):
    """Whether the step's head runs pattern `index` (True with one pattern)."""
    if index not in is_pattern:
        patterns = step.variant.patterns
        is_pattern[index] = True if len(patterns) == 1 else step.view.pattern == index
    return is_pattern[index]


def _mixed_phase(step: _Step, index: int, is_pattern, bounded: bool, in_mode):
    """A BOUNDARY tile of pattern `index`."""
    this = _pattern_test(step, index, is_pattern)
    pl.when(_both(step.active & (step.kind == TileKind.BOUNDARY) & this, in_mode))(
        functools.partial(_mixed, step, step.variant.patterns[index], bounded)
    )


def _segment_phase(step: _Step, index: int, is_pattern, bounded: bool, in_mode):
    """One compute block per tile across run-time segments: the tile's kind says so."""
    this = _pattern_test(step, index, is_pattern)
    across = _both(step.active & (step.kind == SEGMENT_BOUNDARY) & this, in_mode)
    _across_segments(step, step.blocks[0], across, step.variant.patterns[index], bounded)


def _padded_phase(step: _Step, _, is_pattern, bounded: bool, in_mode):
    """A selected tile of one compute block holding the end of the keys."""
    every = every_key(step.variant.patterns[0])
    pl.when(_both(step.active & (step.kind == PADDED), in_mode))(
        functools.partial(_masked, step, step.blocks[0], every, bounded=bounded)
    )


# Each phase of Branches.phases by its name (mixed[p], segment[p]: the pattern's index).
_PHASES = {
    "full": _full_phase,
    "mixed": _mixed_phase,
    "segment": _segment_phase,
    "padded": _padded_phase,
}


def _finalize(step: _Step):
    """Last step of a q tile: o = acc / l (0 where no key was allowed, never NaN), lse."""
    variant, r, shape = step.variant, step.refs, step.shape
    # Rows that saw no allowed key (m still MASK_VALUE) are 0, never NaN.
    seen = r.m[...] > 0.5 * MASK_VALUE
    l = r.acc[:, shape.head_dim : shape.head_dim + LANES] if r.l is None else r.l[...]  # noqa: E741
    if variant.bounded:
        # A bounded tile's m is its bound, never MASK_VALUE: a row with no allowed key
        # has l == 0 there (every exp2 underflowed to 0), and only there (BOUND_LIMIT).
        seen = seen & (l > 0.0)
    inv = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)
    if variant.chunked:
        # NaN rows where a traced offset was no chunk start or a traced head_pattern no
        # pattern, written here, once per q tile: any elementwise pass over the chunk's
        # o after the kernel costs ~45 bundles in every grid step of it (v6e, svgen
        # cost: 327 against 282 per skipped step).
        defined = r.last_scalar[variant.chunked + step.view.row]
        inv = jnp.where(defined != 0, inv, jnp.nan)
    r.o[...] = (r.acc[:, : shape.head_dim] * lanes(inv, shape.head_dim)).astype(r.o.dtype)
    if r.lse is not None:  # lane-major [1, block_q]: what the backward kernels broadcast
        lse = jnp.where(seen, r.m[...] + jnp.log2(jnp.where(seen, l, 1.0)), EMPTY_ROW_LSE)
        r.lse[...] = jnp.transpose(lse[:, :1])
    if r.modes is not None:
        r.modes[...] = jnp.full(r.modes.shape, r.mode[0], jnp.int32)


def _as_int32(word: int) -> int:
    """A blocks word as the int32 the kernel reads (a 16-block word fills the sign bit)."""
    return word - (1 << 32) if word >= 1 << 31 else word


def _vmem_limit(
    shape: KernelShape, dtype, query_coords: int, ids: bool = False, tables: int = 0
) -> int | None:
    """The module's limit, never below what this call's buffers need (the compiler's bound
    on query coordinates covers them; this keeps a hand-built KernelShape safe too). ids:
    run-time segments, whose [1, tile] id blocks take 8 sublanes, double-buffered. tables:
    the bytes of block masks given as data (svgen.runtime.variant.block_table_bytes)."""
    if shape.vmem_limit_bytes is None and not ids and not tables:
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
    if tables:
        need = dataclasses.replace(need, pipeline=need.pipeline + tables)
    return max(shape.vmem_limit_bytes or 0, need.limit())


# ------------------------------------------------------------------------------ the call
def flat_attention(q, k, v, head_pattern, static_pattern, call: ForwardCall, out=None):
    """o of the forward kernel, and the lse and softmax modes where `call` asks for them.
    q, k, v: [batch*heads, seq_len, head_dim], each head in its pattern's order, or with
    call.cubes the user's [batch*heads, frames, height, width, head_dim] (place boxes:
    [..., frames, places, head_dim]). Not padded to whole tiles: the last tile's blocks
    reach past the arrays (the DMA reads what exists; rows past seq_len are discarded
    queries and masked keys), so no HBM pass pads them. static_pattern: head_pattern as
    NumPy where it is not traced. out: an array of o's shape the call writes its rows into
    (aliased: the other rows keep what they hold), for a head run's call or a pattern's
    (ProgramLimits.pattern_calls; the other heads' rows of its lse are undefined)."""
    shape = call.shape
    if call.with_modes and not shape.bounded_softmax:
        raise ValueError(
            "softmax modes: the kernel was compiled without attention.softmax: bounded"
        )
    # The wrapper's ops in the order they always ran (tables, int8 operands, key bound, block
    # tables): another order computes the same but changes the lowered program's text.
    tables = call.source.decode(call.tables, head_pattern, static_pattern, variants=True)
    inputs = {"q": q, "k": k, "v": v}
    if shape.qk_int8:  # int8 QK^T: q and k quantized per compute block (svgen.runtime.quantize)
        assert call.cubes is None, "int8 QK^T reads kernel order (svgen.runtime.cube.cube_dma)"
        quantized = quantized_operands(q, k, shape, call.q_scale)
        inputs.update(zip(("q", "k", "q_scales", "k_scales"), quantized))
    variant = call.variant(tables, q, o_aliased=out is not None)
    if shape.bounded_softmax:
        inputs["key_bound"] = key_bound(inputs["k"])
    inputs.update(zip(("q_ids", "kv_ids"), call.ids))
    heads = int(head_pattern.shape[0])
    # The call's rows: q's, or a head run's (batch x its heads).
    rows = q.shape[0] if call.head_run is None else q.shape[0] // call.head_run[1] * heads
    out_shapes = call.out_shapes(q, rows)
    if out is not None:
        if call.interpret:  # Pallas's interpreter writes no partial block of an aliased output
            out = call.whole_blocks(out)
            out_shapes["o"] = jax.ShapeDtypeStruct(out.shape, out.dtype)
        inputs["o_in"] = out
    inputs.update(block_table_inputs(call.patterns))
    box = None if call.cubes is None else call.cubes.box
    maps = IndexMaps(tables.walk, box=box, row_of=call.row_map(heads))
    table_bytes = block_table_bytes(variant.block_tables, shape.compute_blocks)
    limit = _vmem_limit(shape, q.dtype, variant.query_coords, bool(call.ids), table_bytes)
    kernel = KernelCall(_attention_kernel, variant, tables, maps, limit, call.name, call.interpret)
    outputs = kernel(rows, inputs, out_shapes)
    if outputs[0].shape != q.shape:  # whole_blocks' padding off again
        outputs[0] = outputs[0][tuple(slice(0, n) for n in q.shape)]
    return tuple(outputs) if call.with_lse or call.with_modes else outputs[0]
