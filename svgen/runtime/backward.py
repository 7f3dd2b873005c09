"""The backward pass of svgen's block-sparse attention: dq, dk, dv from the same tables.

Scores are in base 2 (q arrives scaled by sm_scale * log2(e), as in the forward pass), the
forward saves each row's log-sum-exp `lse` of them (lane-major, [rows, 1, padded_seq_len]),
and with p = exp2(s - lse), D = rowsum(dO * o):

    dv = p^T dO      dp = dO v^T      ds = p * (dp - D)      dq = ds k * sm_scale
    dk = ds^T q * sm_scale  (= ds^T q_scaled / log2(e))

Two kernels, each a `pallas_call` over its own tables:
  dq    walks the forward tables (per q tile, its kv tiles), accumulating dq of the q tile;
  dkv   walks the *transposed* tables (per kv tile, the q tiles that visit it), computing
        p^T and ds^T directly in [keys, queries] orientation so that lse and D broadcast as
        lane-major rows, accumulating dk and dv of the kv tile.
Both run FULL compute blocks without a mask and BOUNDARY ones with the pattern's own
`boundary_mask` (evaluated with the key coordinates as columns in dkv: keep^T).

The operands are zero-padded to whole tiles here (the backward is not where the HBM passes
matter most), and padded query rows carry lse = EMPTY_ROW_LSE: their probabilities are 0, so
padding contributes nothing and needs no test; padded key rows of dk, dv are cut off.
Rows with no allowed key have that lse too: zero gradient, never NaN.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime import chunks
from svgen.runtime.cube import BoxRows, PlaceBoxes, tile_positions
from svgen.runtime.coords import QueryCoords, TokenCoords, block_pieces, block_table_inputs
from svgen.core.kinds import TileKind
from svgen.runtime.refine import SEGMENT_BOUNDARY
from svgen.runtime.segments import block_shifts, same_segment
from svgen.runtime.softmax import LOG2_E
from svgen.runtime.steps import Block, lanes, walk_step
from svgen.runtime.tpu_call import IndexMaps, KernelCall, TableSource, shape_of
from svgen.runtime.variant import (
    BackwardVariant,
    PatternCode,
    block_table_bytes,
    block_table_shapes,
    or_chosen,
)
from svgen.runtime.video_frames import ShiftedFrames
from svgen.core.tables import (  # noqa: F401
    KIND_MASK,
    LANES,
    KernelShape,
    PieceTables,
    compute_block_kinds,
    runs_of_blocks,
    transposed_runs,
    transposed_shape,
    transposed_tables,
)


#: dq inside the dk/dv walk by default: chosen by `svgen cost --backward` (see docs/training.md).
FUSED_DQ = True


# ----------------------------------------------------------------------------- kernels
def _dot(a, b, contract_a: int, contract_b: int):
    """a . b over a's axis contract_a and b's contract_b (2-D each), f32 [a's other, b's other]."""
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    out = lax.dot_general(
        a,
        b,
        (((contract_a,), (contract_b,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=precision,
    )
    assert a.shape[contract_a] == b.shape[contract_b], (a.shape, b.shape)
    assert out.shape == (a.shape[1 - contract_a], b.shape[1 - contract_b]), out.shape
    return out


def backward_vmem_limit(shape, tables: int = 0) -> int | None:
    """The scoped VMEM limit of the dq and dk/dv kernels: twice the forward's (each holds a
    row and a column tile of q, k, v and dO plus f32 accumulators, about twice the forward
    kernel's buffers), at least BACKWARD_VMEM_FLOOR and at most BACKWARD_VMEM_CAP. Without
    it a v5e compiles them under its 16 MiB default, which the blog spec's 2048 x 4096 dk/dv
    kernel exceeds there (docs/measured.md). None (the compiler's default) for a
    hand-built shape without a forward limit."""
    if shape.vmem_limit_bytes is None:
        return None if not tables else BACKWARD_VMEM_FLOOR + tables
    limit = min(BACKWARD_VMEM_CAP, max(BACKWARD_VMEM_FLOOR, 2 * shape.vmem_limit_bytes))
    return limit + tables  # block masks given as data: their tables on top


# The floor is v6e's default scoped limit; the cap leaves room on v7x (64 MiB a core).
BACKWARD_VMEM_FLOOR = 32 * 1024 * 1024
BACKWARD_VMEM_CAP = 48 * 1024 * 1024


def _run_blocks(view, kind, active, blocks, shape, masks, update, segments: bool = False):
    """FULL tiles: every compute block unmasked; BOUNDARY tiles: each block by its kind,
    masked with the head's pattern's mask (update(block, mask_or_None, segmented)).
    segments: run-time tables, whose SEGMENT_BOUNDARY blocks (or tiles of one block) also
    test the segment ids (a selection's chosen ones keep every key of their segment:
    view.has_chosen)."""

    def across(block, mask, when):
        if view.has_chosen:  # one body: the chosen bit ORed into the mask (as the forward)
            mask = or_chosen(mask, view.chosen(block.index))
        pl.when(when)(functools.partial(update, block, mask, True))

    @pl.when(active & (kind == TileKind.FULL))
    def _():
        for block in blocks:
            update(block, None)

    for index, mask in enumerate(masks):
        is_pattern = True if len(masks) == 1 else view.pattern == index

        @pl.when(active & (kind == TileKind.BOUNDARY) & is_pattern)
        def _(mask=mask):
            if not view.has_blocks:
                update(blocks[0], mask)
                return
            word = view.blocks
            for block in blocks:
                block_kind = lax.shift_right_logical(word, block.bit) & KIND_MASK
                pl.when(block_kind == TileKind.FULL)(functools.partial(update, block, None))
                pl.when(block_kind == TileKind.BOUNDARY)(functools.partial(update, block, mask))
                if segments:
                    across(block, mask, block_kind == SEGMENT_BOUNDARY)

        if segments and not view.has_blocks:
            across(blocks[0], mask, active & (kind == SEGMENT_BOUNDARY) & is_pattern)


def _dq_kernel(*refs, variant: BackwardVariant):
    """dq of each q tile: refs in the order of variant.operands() (svgen.runtime.variant)."""
    r = variant.unpack(refs)  # never place boxes: their backward fuses dq (_box_backward)
    shape, walk, patterns, sm_scale = (
        variant.shape,
        variant.walk,
        variant.patterns,
        variant.sm_scale,
    )
    q_ref, k_ref, v_ref, do_ref, lse_ref, d_ref = r.q, r.k, r.v, r.do, r.lse, r.delta
    id_refs, dq_ref, acc, lse_col, d_col = r.id_refs, r.dq, r.acc, r.lse_col, r.delta_col
    view, kind, q_tile, kv_tile, active, is_first, is_last = walk_step(r.tables, walk)
    blocks = [
        Block(qi, ki, shape)
        for qi in range(shape.q_blocks_per_tile)
        for ki in range(shape.kv_blocks_per_tile)
    ]

    @pl.when(is_first)
    def _():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)
        # lse and D as lane-replicated columns, once per q tile.
        lse_col[...] = jnp.broadcast_to(jnp.transpose(lse_ref[...]), lse_col.shape)
        d_col[...] = jnp.broadcast_to(jnp.transpose(d_ref[...]), d_col.shape)

    def update(block, pattern, segmented=False):
        q, do = q_ref[block.rows, :], do_ref[block.rows, :]
        k, v = k_ref[block.cols, :], v_ref[block.cols, :]
        p = jnp.exp2(_dot(q, k, 1, 1) - lanes(lse_col[block.rows, :], shape.ckv))
        if pattern is not None:
            shifts = block_shifts(id_refs, block.rows, block.cols) if segmented else None
            keep = _keep(pattern, q_tile, kv_tile, block, variant, shifts, r.block_tables)
            if segmented:  # the block spans run-time segments: only pairs of one segment
                keep = keep & same_segment(id_refs, block.rows, block.cols)
            p = jnp.where(keep, p, 0.0)
        ds = p * (_dot(do, v, 1, 1) - lanes(d_col[block.rows, :], shape.ckv))
        acc[block.rows, :] += _dot(ds.astype(k.dtype), k, 1, 0)

    _run_blocks(view, kind, active, blocks, shape, patterns, update, segments=bool(id_refs))

    @pl.when(is_last)
    def _():
        dq_ref[...] = (acc[...] * sm_scale).astype(dq_ref.dtype)


# One function on purpose (~90 lines): a Pallas kernel body (dk, dv), pl.when branches over
# the same refs and carried accumulators.
def _dkv_kernel(*refs, variant: BackwardVariant):
    """dk, dv of each kv tile: refs in the order of variant.operands(); variant.shape is
    transposed: rows (block_q, cq) are keys, columns queries.

    fused_dq: also dq, accumulated in HBM (f32, unscaled): each step with work reads its
    query tile's dq (the DMA overlaps the step's matmuls), adds ds^T k of its blocks and
    writes it back before the next step, so the steps of one walk (sequential on a
    TensorCore; other cores walk other rows) never race. One pass of the scores instead of
    two: 5 matmuls per block against the separate kernels' 3 + 4.

    walk.per_row: per-row tables (run-time segments, a selection, a chunk); id_rows:
    run-time segments' key and query ids. chunked: a KV-cache chunk's walk (per-row tables;
    the last table holds each row's first query token in the video, svgen.runtime.chunks).
    ring: (sink end, rows) of a chunk's walk against a rolling cache: the last table then
    also holds the ring's wrap and key shifts per row, which map the cache's slots to video
    keys in masked blocks (chunks.slot_keys)."""
    r = _box_rows(variant, variant.unpack(refs), ("k", "v", "dk", "dv"), ("q", "do"))
    shape, walk, patterns, fused_dq = (
        variant.shape,
        variant.walk,
        variant.patterns,
        variant.fused_dq,
    )
    k_ref, v_ref, q_ref, do_ref, lse_ref, d_ref = r.k, r.v, r.q, r.do, r.lse, r.delta
    id_refs, dk_ref, dv_ref, dk_acc, dv_acc = r.id_refs, r.dk, r.dv, r.dk_acc, r.dv_acc
    dq_hbm, dq_step, dq_buf, dq_sems = r.dq_hbm, r.dq_step, r.dq_buf, r.dq_sems
    view, kind, kv_tile, q_tile, active, is_first, is_last = walk_step(r.tables, walk)
    q_first = r.tables[-1][view.row] if variant.chunked else None
    key_map = None
    if variant.ring is not None:  # a rolling cache's slots -> video keys, in masked blocks
        sink, rows = variant.ring
        key_map = functools.partial(
            chunks.slot_keys, sink=sink, scalars=r.tables[-1], rows=rows, row=view.row
        )
    blocks = [
        Block(ki, qi, shape)
        for ki in range(shape.q_blocks_per_tile)
        for qi in range(shape.kv_blocks_per_tile)
    ]

    @pl.when(is_first)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    def update(block, pattern, segmented=False):
        k, v = k_ref[block.rows, :], v_ref[block.rows, :]
        q, do = q_ref[block.cols, :], do_ref[block.cols, :]
        lse, dd = lse_ref[:, block.cols], d_ref[:, block.cols]  # [1, cq]: lane-major rows
        p_t = jnp.exp2(_dot(k, q, 1, 1) - lse)
        if pattern is not None:
            shifts = block_shifts(id_refs, block.rows, block.cols) if segmented else None
            keep_t = _keep_t(
                pattern, kv_tile, q_tile, block, variant, q_first, key_map, shifts, r.block_tables
            )
            if segmented:  # across run-time segments: only pairs of one (keys are rows here)
                keep_t = keep_t & same_segment(id_refs, block.rows, block.cols)
            p_t = jnp.where(keep_t, p_t, 0.0)
        dv_acc[block.rows, :] += _dot(p_t.astype(do.dtype), do, 1, 0)
        ds_t = (p_t * (_dot(v, do, 1, 1) - dd)).astype(q.dtype)
        dk_acc[block.rows, :] += _dot(ds_t, q, 1, 0)
        if fused_dq:  # dq of the block's queries: ds k, from ds^T with keys contracted
            dq_step[block.cols, :] += _dot(ds_t, k, 0, 0)

    if fused_dq:
        work = active & (kind != TileKind.EMPTY)
        if variant.col_box is None:
            size = shape.block_kv
            queries = pl.ds(pl.multiple_of(q_tile * size, size), size)
            tile_in_hbm = dq_hbm.at[view.row, queries, :]
        else:  # the q tile's box of the [rows, frames, places, d] buffer
            size = variant.col_places
            places = pl.ds(pl.multiple_of(q_tile * size, size), size)
            tile_in_hbm = dq_hbm.at[view.row, :, places, :]
        read = pltpu.make_async_copy(tile_in_hbm, dq_buf, dq_sems.at[0])
        write = pltpu.make_async_copy(dq_buf, tile_in_hbm, dq_sems.at[1])

        @pl.when(work)
        def _():
            read.start()
            dq_step[...] = jnp.zeros(dq_step.shape, jnp.float32)

    _run_blocks(view, kind, active, blocks, shape, patterns, update, segments=bool(id_refs))

    if fused_dq:

        @pl.when(work)
        def _():
            read.wait()
            dq_buf[...] += dq_step[...].reshape(dq_buf.shape)
            write.start()
            write.wait()  # before the next step reads a tile (maybe this one)

    @pl.when(is_last)
    def _():
        # q arrived scaled by sm_scale * log2(e): dk = ds^T q * sm_scale.
        dk_ref[...] = (dk_acc[...] * (1.0 / LOG2_E)).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _box_rows(variant: BackwardVariant, r, row_names, col_names):
    """The refs with place boxes' [frames, n, d] blocks read and written as [tile rows, d]
    (cube.BoxRows) on the sides of the walk whose tiles are boxes."""
    boxed = {}
    for names, box in ((row_names, variant.row_box), (col_names, variant.col_box)):
        if box is not None:
            boxed.update({n: BoxRows(getattr(r, n)) for n in names if getattr(r, n) is not None})
    return dataclasses.replace(r, **boxed) if boxed else r


def _positions(tile, size: int, index: int, width: int, places: int = 0):
    """Kernel positions of compute block `index` (of `width`) of a tile of `size`, row form;
    places: the tile is a place box of that many places (cube.tile_positions)."""
    return tile_positions(tile, size, places, (1, width), 1, index * width)


def _keep(pattern, q_tile, kv_tile, block, variant, shifts=None, tables=None):
    """keep [cq, ckv] of a dq block (queries decoded in row form, read as columns).
    shifts: per-video frames' (query [cq, 1], key [1, ckv]) frame shifts."""
    shape = variant.shape
    q_pos = _positions(q_tile, shape.block_q, block.qi, shape.cq, variant.row_places)
    q = QueryCoords(q_pos, pattern.layout)
    k = TokenCoords(
        _positions(kv_tile, shape.block_kv, block.ki, shape.ckv, variant.col_places),
        pattern.layout,
        block_pieces(tables, block, shape),
    )
    if shifts is not None:
        q, k = ShiftedFrames(q, shifts[0]), ShiftedFrames(k, shifts[1])
    return jnp.broadcast_to(pattern.boundary_mask(q, k), (shape.cq, shape.ckv))


def _keep_t(
    pattern, kv_tile, q_tile, block, variant, q_first=None, key_map=None, shifts=None, tables=None
):
    """keep^T [ckv, cq] of a dkv block: the same mask with keys as columns, queries as rows
    (shape is transposed: block.qi indexes keys). q_first: a chunked call's first query
    token in the video; key_map: a rolling cache's slot -> video key map. shifts: per-video
    frames' (key [ckv, 1], query [1, cq]) frame shifts."""
    shape = variant.shape
    k_pos = _positions(kv_tile, shape.block_q, block.qi, shape.cq, variant.row_places)
    pieces = block_pieces(tables, block, shape, transposed=True)
    k = QueryCoords(k_pos if key_map is None else key_map(k_pos), pattern.layout, pieces)
    q_pos = _positions(q_tile, shape.block_kv, block.ki, shape.ckv, variant.col_places)
    q = TokenCoords(q_pos if q_first is None else q_pos + q_first, pattern.layout)
    if shifts is not None:
        k, q = ShiftedFrames(k, shifts[0]), ShiftedFrames(q, shifts[1])
    return jnp.broadcast_to(pattern.boundary_mask(q, k), (shape.cq, shape.ckv))


# ----------------------------------------------------------------------------- the call
@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: its sources and ids may be traced
class BackwardCall:
    """The backward kernels of one forward call, as svgen.runtime.kernel asks for them.

    forward_tables, dkv_tables  the module's piece tables of the dq walk (the forward's)
                and of the dk/dv walk (transposed): they say each walk's slots, and are its
                pieces where its source is static;
    dq_source, dkv_source  where each walk's tables come from
                (svgen.runtime.tpu_call.TableSource): the module's, run-time segments', a
                selection's, or (the dk/dv walk) a KV-cache chunk's: q, o and do then hold
                the chunk's rows, k and v the whole sequence's, and dq, dk, dv come back so
                (always the fused walk); ring_sink: the chunk's cache is rolling
                (shape.seq_len is the cache's; see _dkv_kernel);
    ids         run-time (query ids, key ids) [rows, id rows, seq_len] in kernel order;
    boxes       place boxes (svgen.runtime.cube): q, k, v, o, do are the user's [rows,
                frames, places, d] arrays and lse is in the forward's box order; the kernels
                read their tiles as boxes (dq fused into the dk/dv walk, whose HBM buffer is
                boxed too), and dq, dk, dv come back in the user's order;
    pattern_calls  the fused dk/dv walk once per pattern (ProgramLimits.pattern_calls),
                where it walks the module's own tables flat.
    """

    forward_tables: PieceTables
    dkv_tables: PieceTables
    patterns: tuple[PatternCode, ...]
    shape: KernelShape
    sm_scale: float
    interpret: object
    dq_source: TableSource = TableSource()
    dkv_source: TableSource = TableSource()
    ids: tuple = ()
    ring_sink: int | None = None
    boxes: PlaceBoxes | None = None
    pattern_calls: bool = False

    @property
    def fused_dq(self) -> bool:
        """dq inside the dk/dv walk: FUSED_DQ (read when traced), and always in a chunk's."""
        return FUSED_DQ or self.dkv_source.kind == "chunk"

    @property
    def per_pattern(self) -> bool:
        """The fused dk/dv walk once per pattern: asked for, and possible (the walk is flat
        over the module's own tables)."""
        own_tables = self.dkv_source.kind == "static" and self.dkv_tables.flat
        return self.pattern_calls and self.fused_dq and own_tables


def backward(q_scaled, k, v, o, lse, do, head_pattern, static_pattern, call: BackwardCall):
    """dq, dk, dv [rows, seq_len, d] (kernel order; see BackwardCall for chunks and boxes) of
    the forward call that gave o and lse. q_scaled: its q scaled by sm_scale * log2(e), as
    the forward kernel scales it. static_pattern: head_pattern as NumPy where not traced."""
    if call.boxes is not None:
        return _box_backward(q_scaled, k, v, o, lse, do, head_pattern, static_pattern, call)
    shape, sm_scale = call.shape, call.sm_scale
    pad = shape.padded_seq_len - shape.seq_len
    q_len = q_scaled.shape[1]
    q_pad = lse.shape[-1] - q_len  # whole q tiles
    zero = functools.partial(jnp.pad, pad_width=((0, 0), (0, pad), (0, 0)))
    zero_q = functools.partial(jnp.pad, pad_width=((0, 0), (0, q_pad), (0, 0)))
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)  # D = rowsum
    delta = jnp.pad(delta, ((0, 0), (0, q_pad)))[:, None, :]
    qp, kp, vp, dop = zero_q(q_scaled), zero(k), zero(v), zero_q(do)
    ids = tuple(jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in call.ids)
    walks = _Walks(call, head_pattern, static_pattern, qp, kp, vp, dop, lse, delta, ids)
    walk_dkv = walks.dkv
    cut = slice(0, shape.seq_len)
    if call.per_pattern:
        dk, dv, dq = _pattern_calls(walk_dkv, len(call.patterns), static_pattern)
        return (dq[:, :q_len] * sm_scale).astype(qp.dtype), dk[:, cut], dv[:, cut]
    if call.fused_dq:
        dk, dv, dq = walk_dkv(fused_dq=True)
        return (dq[:, :q_len] * sm_scale).astype(qp.dtype), dk[:, cut], dv[:, cut]
    dq = walks.dq()
    dk, dv = walk_dkv(fused_dq=False)
    return dq[:, cut], dk[:, cut], dv[:, cut]


def _pattern_calls(walk_dkv, patterns: int, static_pattern):
    """The fused dk/dv walk once per pattern (ProgramLimits.pattern_calls), each call walking
    the heads that chose it with that pattern's code only: dk and dv written row by row into
    the previous call's (aliased), dq accumulated in one HBM buffer. A pattern no head chose
    (static assignment) is not called; a traced one's call walks no steps."""
    carried = None
    for index in range(patterns):
        if static_pattern is not None and index not in static_pattern:
            continue
        carried = walk_dkv(fused_dq=True, only_pattern=index, carried=carried)
    return carried


def _box_backward(q_scaled, k, v, o, lse, do, head_pattern, static_pattern, call):
    """The backward pass of place boxes (BackwardCall.boxes): the operands padded with zero
    places up to whole boxes (as a plain call pads its sequence to whole tiles), D in the
    q boxes' order (the lse's), one fused dk/dv walk."""
    boxes = call.boxes
    frames, places = boxes.frames, boxes.places
    padded_places = call.shape.padded_seq_len // frames
    extra = padded_places - places
    pad = functools.partial(jnp.pad, pad_width=((0, 0), (0, 0), (0, extra), (0, 0)))
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)  # D = rowsum
    delta = boxes.to_box_order(jnp.pad(delta, ((0, 0), (0, 0), (0, extra))))
    kp, vp, qp, dop = (pad(x) for x in (k, v, q_scaled, do))
    walks = _Walks(call, head_pattern, static_pattern, qp, kp, vp, dop, lse, delta)
    dk, dv, dq = walks.dkv(fused_dq=True)
    cut = slice(0, places)
    dq = (dq[:, :, cut] * call.sm_scale).astype(q_scaled.dtype)
    return dq, dk[:, :, cut], dv[:, :, cut]


@dataclasses.dataclass(frozen=True)
class _Walks:
    """The backward's two walks over its operands padded to whole tiles (or boxes), with D
    = rowsum(dO * o): the dq walk of the forward tables (`dq`) and the dk/dv walk of the
    transposed ones (`dkv`), each one KernelCall (svgen.runtime.tpu_call). Each walk makes
    its inputs, then decodes its tables: the order its ops always ran in (another computes
    the same, but changes the lowered program's text)."""

    call: BackwardCall
    head_pattern: object
    static_pattern: object
    q: object  # q_scaled
    k: object
    v: object
    do: object
    lse: object
    delta: object
    ids: tuple = ()  # run-time (query ids, key ids), padded

    def dq(self):
        """dq of the dq walk (its finalize applies sm_scale)."""
        call = self.call
        inputs = dict(q=self.q, k=self.k, v=self.v, do=self.do, lse=self.lse, delta=self.delta)
        inputs.update(zip(("row_ids", "col_ids"), self.ids))
        inputs.update(block_table_inputs(call.patterns))
        tables = call.dq_source.decode(call.forward_tables, self.head_pattern, self.static_pattern)
        variant = BackwardVariant(
            "dq",
            call.shape,
            tuple(call.patterns),
            tables.walk,
            len(tables.operands),
            call.sm_scale,
            id_rows=self._id_rows,
        )
        outputs = {"dq": shape_of(self.q)}
        return self._run(_dq_kernel, variant, tables, inputs, outputs, "svgen_attention_dq")[0]

    def dkv(self, fused_dq: bool, only_pattern: int | None = None, carried=None) -> list:
        """(dk, dv), and with fused_dq also dq (f32, unscaled, accumulated in an HBM buffer
        aliased from zeros). only_pattern: the walk of that pattern's heads with its code
        only (fused_dq), `carried`: the previous such call's (dk, dv, dq), which this one
        writes its rows into and accumulates onto."""
        call, source = self.call, self.call.dkv_source
        patterns = call.patterns
        if only_pattern is not None:
            patterns, source = [patterns[only_pattern]], source.for_pattern(only_pattern)
        inputs = dict(k=self.k, v=self.v, q=self.q, do=self.do, lse=self.lse, delta=self.delta)
        inputs.update(zip(("col_ids", "row_ids"), self.ids))  # keys are the rows here
        inputs.update(block_table_inputs(patterns))
        outputs = {"dk": shape_of(self.k), "dv": shape_of(self.v)}
        if fused_dq:
            dq_in = jnp.zeros(self.q.shape, jnp.float32) if carried is None else carried[2]
            inputs["dq_zero"], outputs["dq_hbm"] = dq_in, shape_of(dq_in)
        if carried is not None:  # dk and dv: the other patterns' rows kept, this one's written
            inputs["dk_in"], inputs["dv_in"] = carried[:2]
        tables = source.decode(call.dkv_tables, self.head_pattern, self.static_pattern)
        variant = self._dkv_variant(tables, patterns, fused_dq, rows_aliased=carried is not None)
        name = "svgen_attention_dkv" + ("" if only_pattern is None else f"_pattern{only_pattern}")
        return self._run(_dkv_kernel, variant, tables, inputs, outputs, name)

    @property
    def _id_rows(self) -> int:
        return self.ids[0].shape[1] if self.ids else 0  # 2: ids and per-video frame shifts

    def _dkv_variant(self, tables, patterns, fused_dq: bool, rows_aliased: bool):
        call, boxes = self.call, self.call.boxes
        return BackwardVariant(
            "dkv",
            transposed_shape(call.shape),
            tuple(patterns),
            tables.walk,
            len(tables.operands),
            call.sm_scale,
            fused_dq=fused_dq,
            id_rows=self._id_rows,
            chunked=tables.kind == "chunk",
            ring=None if call.ring_sink is None else (call.ring_sink, self.k.shape[0]),
            row_box=None if boxes is None else boxes.kv_block,
            col_box=None if boxes is None else boxes.block,
            rows_aliased=rows_aliased,
        )

    def _run(self, body, variant: BackwardVariant, tables, inputs: dict, outputs: dict, name):
        """One walk's pallas_call: the grid of the forward kernel, the backward's VMEM limit."""
        call = self.call
        box = None if call.boxes is None else call.boxes.box
        maps = IndexMaps(tables.walk, box=box, row_first=False)
        table_bytes = block_table_bytes(
            block_table_shapes(variant.patterns), variant.shape.compute_blocks
        )
        limit = backward_vmem_limit(variant.shape, table_bytes)
        kernel = KernelCall(body, variant, tables, maps, limit, name, call.interpret)
        return kernel(self.q.shape[0], inputs, outputs)
