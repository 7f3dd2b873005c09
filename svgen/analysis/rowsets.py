"""Per query row, the keys a mask allows, as interval sets (exact for built-in primitives).

For a chunk of query rows, `row_bounds(node, chunk)` returns two interval sets on the chunk's
line (see `intervals`): `lo`, keys certainly allowed, and `hi`, keys possibly allowed, with
lo <= keep <= hi. For built-in primitives and their unions, intersections and complements
lo == hi exactly: each primitive allows, per query row, a short union of key intervals in
kernel order (a frame window is one interval, a temporal column one interval per frame), and
the algebra of interval sets is closed. User predicates contribute sound bounds proven per
tile (`bounds`), which the same algebra then combines. Where boxes and ranges of keys lie in
each token order is `key_sets`' business; the functions here only name them.

Nothing here is proportional to seq_len**2: the work is the number of intervals. That number
is what a hostile mask inflates (hundreds of windows, each a few dozen intervals per row, make
billions), so every step that builds intervals charges them to `svgen.spec.limits.ROW_SET_WORK`
before allocating, and `estimate_work` extrapolates a few sampled rows to the whole sequence
before the classification starts (svgen.spec.limits.MAX_ROW_SET_WORK).
"""

from __future__ import annotations

import functools

import numpy as np

from svgen import ir
from svgen.spec import primitives
from svgen.analysis import bounds as box_bounds
from svgen.analysis.intervals import IntervalSet, ragged_arange
from svgen.spec.limits import ROW_SET_WORK, WorkOverLimit
from svgen.core.layout import TokenLayout
from svgen.analysis.key_sets import Bounds, RowChunk, nominal_keys, video_box_keys


# Rows `estimate_work` samples, spread evenly: per-row interval counts of the built-ins vary
# smoothly with the position (windows clipped at the edges), so a few stand for all.
SAMPLE_ROWS = 16


def estimate_work(node, layout: TokenLayout, block_q: int, block_kv: int, rows: int, limit: int):
    """The intervals `row_bounds` would build for rows [0, rows), extrapolated from
    SAMPLE_ROWS rows spread over them; None when that exceeds `limit` (the sampling stops
    as soon as it does, so a hostile mask costs about limit * SAMPLE_ROWS / rows here)."""
    samples = min(SAMPLE_ROWS, rows)
    scale = rows / samples
    try:
        with ROW_SET_WORK.budget(int(limit / scale)) as budget:
            for i in range(samples):
                first = int((i + 0.5) * rows / samples)
                row_bounds(node, RowChunk(layout, block_q, block_kv, first, 1))
    except WorkOverLimit:
        return None
    return int(budget.used * scale)


def row_bounds(node, chunk: RowChunk) -> Bounds:
    """The node's row sets, by the function `svgen.spec.primitives` declares for its class (so a
    primitive registered there needs no edit here)."""
    if isinstance(node, ir.Always):  # no spec key: simplification's constants
        return Bounds.exact(chunk.universe if node.value else IntervalSet.empty())
    primitive = primitives.by_node(type(node))
    if primitive is None or primitive.rows_function is None:
        raise TypeError(f"no row analysis for {type(node).__name__}")
    return primitive.rows_function(node, chunk)


def first_frame_rows(node: ir.FirstFrame, chunk: RowChunk) -> Bounds:
    lay = chunk.layout
    rows = np.arange(chunk.num_rows)  # every query, text included
    return Bounds.exact(
        video_box_keys(
            chunk,
            rows,
            np.zeros(rows.size, np.int64),
            np.full(rows.size, min(node.frames, lay.frames)),
            1,
            *_full_box(lay, rows.size),
        )
    )


def prefix_rows(node: ir.Prefix, chunk: RowChunk) -> Bounds:
    rows = np.arange(chunk.num_rows)
    return Bounds.exact(
        nominal_keys(chunk, rows, np.zeros(rows.size, np.int64), np.full(rows.size, node.tokens))
    )


def block_data_rows(node: ir.BlockData, chunk: RowChunk) -> Bounds:
    """Per row, the runs of kept blocks of its block row, as kernel positions [start * block,
    end * block): exact, one interval per run (at most half the blocks per row)."""
    offsets, starts, ends = _block_runs(node)
    block_row = chunk.positions // node.block
    counts = offsets[block_row + 1] - offsets[block_row]
    ROW_SET_WORK.charge(int(counts.sum()))
    rows = np.repeat(np.arange(chunk.num_rows), counts)
    # The runs of each row's block row, in order: its offset plus 0 .. count - 1.
    first = np.repeat(offsets[block_row] - np.cumsum(counts) + counts, counts)
    run = first + np.arange(rows.size)
    return Bounds.exact(chunk.per_row(rows, starts[run] * node.block, ends[run] * node.block))


@functools.lru_cache(maxsize=16)
def _block_runs(node: ir.BlockData):
    """(offsets [n + 1], starts, ends): the runs of ones of every row of the node's bits, in
    blocks, row r's at offsets[r] .. offsets[r + 1]."""
    bits = node.bits.astype(np.int8)
    edges = np.diff(np.pad(bits, ((0, 0), (1, 1))), axis=1)
    row_s, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)
    offsets = np.searchsorted(row_s, np.arange(bits.shape[0] + 1))
    return offsets, starts.astype(np.int64), ends.astype(np.int64)


def band_rows(node: ir.Band, chunk: RowChunk) -> Bounds:
    rows = np.arange(chunk.num_rows)
    nominal = chunk.coords.index
    return Bounds.exact(nominal_keys(chunk, rows, nominal - node.width, nominal + node.width + 1))


def text_rows(node: ir.Text, chunk: RowChunk) -> Bounds:
    lay = chunk.layout
    is_text = chunk.coords.is_text
    text_rows = np.flatnonzero(is_text)
    video_rows = np.flatnonzero(~is_text)
    everything = chunk.per_row(
        text_rows, np.zeros(text_rows.size), np.full(text_rows.size, lay.seq_len)
    )
    text_keys = chunk.per_row(
        video_rows,
        np.full(video_rows.size, lay.text_start),
        np.full(video_rows.size, lay.text_start + lay.text_tokens),
    )
    return Bounds.exact(everything.union(text_keys))


def causal_frames_rows(node: ir.CausalFrames, chunk: RowChunk) -> Bounds:
    lay = chunk.layout
    rows = np.flatnonzero(~chunk.coords.is_text)
    return Bounds.exact(
        video_box_keys(
            chunk,
            rows,
            np.zeros(rows.size, np.int64),
            chunk.coords.frame[rows] + 1,
            1,
            *_full_box(lay, rows.size),
        )
    )


def block_causal_rows(node: ir.BlockCausal, chunk: RowChunk) -> Bounds:
    """Video keys of frames [0, end of the query's chunk): one frame range per row, so the
    same intervals as causal_frames (one per row frame-major; per place temporal-major)."""
    lay = chunk.layout
    rows = np.flatnonzero(~chunk.coords.is_text)
    chunk_end = (chunk.coords.frame[rows] // node.frames + 1) * node.frames
    return Bounds.exact(
        video_box_keys(
            chunk,
            rows,
            np.zeros(rows.size, np.int64),
            np.minimum(chunk_end, lay.frames),
            1,
            *_full_box(lay, rows.size),
        )
    )


def cube_window_rows(node: ir.CubeWindow, chunk: RowChunk) -> Bounds:
    """The video keys of the cubes around the query's: one coordinate box per row."""
    lay = chunk.layout
    rows = np.flatnonzero(~chunk.coords.is_text)
    c = chunk.coords
    (f_lo, f_hi), (h_lo, h_hi), (w_lo, w_hi) = (
        _cube_range(getattr(c, name)[rows], size, radius, extent)
        for name, size, radius, extent in (
            ("frame", node.cube_frames, node.frames, lay.frames),
            ("row", node.cube_rows, node.rows, lay.height),
            ("col", node.cube_cols, node.cols, lay.width),
        )
    )
    return _frames_box(chunk, rows, (f_lo, f_hi), (h_lo, h_hi), (w_lo, w_hi), False, False)


def _frames_box(chunk: RowChunk, rows, frames, heights, widths, full_rows, full_cols) -> Bounds:
    """Exact row sets of per-row boxes of consecutive frames: inclusive (lo, hi) per axis."""
    (f_lo, f_hi), (h_lo, h_hi), (w_lo, w_hi) = frames, heights, widths
    return Bounds.exact(
        video_box_keys(
            chunk,
            rows,
            f_lo,
            f_hi - f_lo + 1,
            1,
            h_lo,
            h_hi,
            w_lo,
            w_hi,
            full_rows=full_rows,
            full_cols=full_cols,
        )
    )


def _cube_range(x: np.ndarray, size: int, radius: int, extent: int):
    """Inclusive [lo, hi] of the coordinates whose cube is within `radius` cubes of x's."""
    cube = x // size
    lo = np.maximum((cube - radius) * size, 0)
    hi = np.minimum((cube + radius + 1) * size - 1, extent - 1)
    return lo, hi


def _full_box(lay, n: int):
    """(h_lo, h_hi, w_lo, w_hi, full_rows, full_cols) of whole frames, for n rows."""
    return (
        np.zeros(n, np.int64),
        np.full(n, lay.height - 1),
        np.zeros(n, np.int64),
        np.full(n, lay.width - 1),
        True,
        True,
    )


def _window(center: np.ndarray, radius: int | None, size: int):
    """Inclusive [lo, hi] of |x - center| <= radius within [0, size)."""
    if radius is None:
        return np.zeros_like(center), np.full_like(center, size - 1)
    return np.maximum(center - radius, 0), np.minimum(center + radius, size - 1)


def _covers(radius: int | None, size: int) -> bool:
    return radius is None or radius >= size - 1


def spatial_window_rows(node: ir.SpatialWindow, chunk: RowChunk) -> Bounds:
    lay = chunk.layout
    rows = np.flatnonzero(~chunk.coords.is_text)
    c = chunk.coords
    return _frames_box(
        chunk,
        rows,
        _window(c.frame[rows], node.frames, lay.frames),
        _window(c.row[rows], node.rows, lay.height),
        _window(c.col[rows], node.cols, lay.width),
        full_rows=_covers(node.rows, lay.height),
        full_cols=_covers(node.cols, lay.width),
    )


def temporal_stride_rows(node: ir.TemporalStride, chunk: RowChunk) -> Bounds:
    lay = chunk.layout
    rows = np.flatnonzero(~chunk.coords.is_text)
    c = chunk.coords
    frame = c.frame[rows]
    f_lo, f_hi = _window(frame, node.frames, lay.frames)
    # Frames congruent to the query's frame modulo the stride, inside [f_lo, f_hi].
    f_first = frame - (frame - f_lo) // node.stride * node.stride
    f_count = (f_hi - f_first) // node.stride + 1
    h_lo, h_hi = _window(c.row[rows], node.rows, lay.height)
    w_lo, w_hi = _window(c.col[rows], node.cols, lay.width)
    return Bounds.exact(
        video_box_keys(
            chunk,
            rows,
            f_first,
            f_count,
            node.stride,
            h_lo,
            h_hi,
            w_lo,
            w_hi,
            full_rows=_covers(node.rows, lay.height),
            full_cols=_covers(node.cols, lay.width),
        )
    )


def predicate_rows(node: ir.Predicate, chunk: RowChunk) -> Bounds:
    lay = chunk.layout
    bq, bkv = chunk.block_q, chunk.block_kv
    q_tiles = np.arange(chunk.first_row // bq, (chunk.first_row + chunk.num_rows - 1) // bq + 1)
    k_tiles = np.arange(-(-lay.seq_len // bkv))
    proven_true, proven_false = box_bounds.classify_predicate(
        node.expr,
        box_bounds.tile_boxes(lay, bq, range(q_tiles[0], q_tiles[-1] + 1)),
        _kv_boxes(lay, bkv),
        q_tiles,
        k_tiles,
    )
    return Bounds(
        _tile_runs_to_rows(chunk, q_tiles, proven_true),
        _tile_runs_to_rows(chunk, q_tiles, ~proven_false),
    )


@functools.lru_cache(maxsize=8)
def _kv_boxes(layout: TokenLayout, block_kv: int):
    return box_bounds.tile_boxes(layout, block_kv, range(-(-layout.seq_len // block_kv)))


def _tile_runs_to_rows(chunk: RowChunk, q_tiles: np.ndarray, allowed: np.ndarray) -> IntervalSet:
    """Per row, the keys of the kv tiles `allowed[q tile of the row]`."""
    padded = np.zeros((allowed.shape[0], allowed.shape[1] + 2), bool)
    padded[:, 1:-1] = allowed
    edges = np.diff(padded.astype(np.int8), axis=1)
    tile_idx, run_start = np.nonzero(edges == 1)
    _, run_end = np.nonzero(edges == -1)
    bq, bkv = chunk.block_q, chunk.block_kv
    rows_of_tile = []
    for t in q_tiles:
        lo = max(t * bq, chunk.first_row) - chunk.first_row
        hi = min((t + 1) * bq, chunk.first_row + chunk.num_rows) - chunk.first_row
        rows_of_tile.append((lo, hi))
    rows_of_tile = np.array(rows_of_tile, np.int64)
    counts = rows_of_tile[tile_idx, 1] - rows_of_tile[tile_idx, 0]
    ROW_SET_WORK.charge(counts.sum())
    run = np.repeat(np.arange(tile_idx.size), counts)
    rows = rows_of_tile[tile_idx[run], 0] + ragged_arange(counts)
    return chunk.per_row(rows, run_start[run] * bkv, run_end[run] * bkv)


def any_of_rows(node: ir.AnyOf, chunk: RowChunk) -> Bounds:
    lo, loose = _Union(), _Union()
    for child in node.children:  # one part at a time: only the union and a batch are held
        part = row_bounds(child, chunk)
        lo.add(part.lo)
        if not part.is_exact:
            loose.add(part.hi)
    if loose.empty:
        return Bounds.exact(lo.result())
    # The union of every hi: the exact parts' hi are their lo, already in lo.
    low = lo.result()
    loose.add(low)
    return Bounds(low, loose.result())


# Parts of an any_of gathered before one normalization (see _Union).
UNION_BATCH = 1 << 16


class _Union:
    """The union of many interval sets, normalized in batches at least as large as the union
    so far: a fold of pairwise unions would renormalize the growing result once per part
    (quadratic in the parts of a wide any_of), and holding every part until the end would
    keep all of them in memory at once."""

    def __init__(self):
        self._done: IntervalSet | None = None
        self._batch: list[IntervalSet] = []
        self._size = 0

    @property
    def empty(self) -> bool:
        return self._done is None and not self._batch

    def add(self, part: IntervalSet) -> None:
        self._batch.append(part)
        self._size += len(part)
        done = 0 if self._done is None else len(self._done)
        if self._size > max(done, UNION_BATCH):
            self._flush()

    def _flush(self) -> None:
        sets = ([self._done] if self._done is not None else []) + self._batch
        ROW_SET_WORK.charge(sum(len(s) for s in sets))
        self._done = IntervalSet.normalized(
            np.concatenate([s.starts for s in sets]), np.concatenate([s.ends for s in sets])
        )
        self._batch, self._size = [], 0

    def result(self) -> IntervalSet:
        if self._done is None and len(self._batch) <= 1:
            return self._batch[0] if self._batch else IntervalSet.empty()
        if self._batch:
            self._flush()
        return self._done


def all_of_rows(node: ir.AllOf, chunk: RowChunk) -> Bounds:
    parts = [row_bounds(c, chunk) for c in node.children]
    ROW_SET_WORK.charge(sum(len(p.lo) + (0 if p.is_exact else len(p.hi)) for p in parts))
    lo = functools.reduce(IntervalSet.intersection, (p.lo for p in parts))
    if all(p.is_exact for p in parts):
        return Bounds.exact(lo)
    return Bounds(lo, functools.reduce(IntervalSet.intersection, (p.hi for p in parts)))


def not_rows(node: ir.Not, chunk: RowChunk) -> Bounds:
    inner = row_bounds(node.child, chunk)
    ROW_SET_WORK.charge(len(inner.lo) + (0 if inner.is_exact else len(inner.hi)))
    hi = inner.lo.complement_within(chunk.universe)
    if inner.is_exact:
        return Bounds.exact(hi)
    return Bounds(inner.hi.complement_within(chunk.universe), hi)
