"""Per query row, the keys a mask allows, as interval sets (exact for built-in primitives).

For a chunk of query rows, `row_bounds(node, chunk)` returns two interval sets on the chunk's
line (see `intervals`): `lo`, keys certainly allowed, and `hi`, keys possibly allowed, with
lo <= keep <= hi. For built-in primitives and their unions, intersections and complements
lo == hi exactly: each primitive allows, per query row, a short union of key intervals in
kernel order (a frame window is one interval, a temporal column one interval per frame), and
the algebra of interval sets is closed. User predicates contribute sound bounds proven per
tile (`bounds`), which the same algebra then combines.

Nothing here is proportional to seq_len**2: the work is the number of intervals. That number
is what a hostile mask inflates (hundreds of windows, each a few dozen intervals per row, make
billions), so every step that builds intervals charges them to `svgen.spec.limits.ROW_SET_WORK`
before allocating, and `estimate_work` extrapolates a few sampled rows to the whole sequence
before the classification starts (svgen.spec.limits.MAX_ROW_SET_WORK).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from svgen import ir
from svgen.spec import primitives
from svgen.analysis import bounds as box_bounds
from svgen.analysis.intervals import IntervalSet, expand_ranges, ragged_arange, repeat_each
from svgen.spec.limits import ROW_SET_WORK, WorkOverLimit
from svgen.runtime.layout import TokenLayout


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


@dataclasses.dataclass(frozen=True)
class Bounds:
    lo: IntervalSet  # certainly allowed
    hi: IntervalSet  # possibly allowed

    @classmethod
    def exact(cls, s: IntervalSet) -> "Bounds":
        return cls(s, s)

    @property
    def is_exact(self) -> bool:
        return self.lo is self.hi


@dataclasses.dataclass
class RowChunk:
    """Query rows [first_row, first_row + num_rows) (all real), laid out on one line."""

    layout: TokenLayout
    block_q: int
    block_kv: int
    first_row: int
    num_rows: int

    @property
    def stride(self) -> int:
        return self.layout.seq_len + 1

    @functools.cached_property
    def positions(self) -> np.ndarray:
        return np.arange(self.first_row, self.first_row + self.num_rows, dtype=np.int64)

    @functools.cached_property
    def coords(self):
        return self.layout.coordinates(self.positions)

    @functools.cached_property
    def universe(self) -> IntervalSet:
        """Every real key of every row."""
        ROW_SET_WORK.charge(self.num_rows)
        base = np.arange(self.num_rows, dtype=np.int64) * self.stride
        return IntervalSet(base, base + self.layout.seq_len)

    @property
    def num_q_tiles(self) -> int:
        """q tiles the chunk's rows fall in (chunks start on a q tile, except in tests)."""
        return -(-(self.first_row % self.block_q + self.num_rows) // self.block_q)

    def q_tile_of(self, local_rows: np.ndarray) -> np.ndarray:
        """The chunk-relative q tile of local rows."""
        return (self.first_row + local_rows) // self.block_q - self.first_row // self.block_q

    def per_row(self, rows: np.ndarray, starts, ends) -> IntervalSet:
        """Intervals [starts, ends) of key positions for local rows `rows` (clipped)."""
        seq_len = self.layout.seq_len
        ROW_SET_WORK.charge(np.size(rows))
        starts = np.clip(starts, 0, seq_len)
        ends = np.clip(ends, 0, seq_len)
        base = rows.astype(np.int64) * self.stride
        return IntervalSet.normalized(base + starts, base + ends)


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
        _video_box_keys(
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
        _nominal_keys(chunk, rows, np.zeros(rows.size, np.int64), np.full(rows.size, node.tokens))
    )


def band_rows(node: ir.Band, chunk: RowChunk) -> Bounds:
    rows = np.arange(chunk.num_rows)
    nominal = chunk.coords.index
    return Bounds.exact(_nominal_keys(chunk, rows, nominal - node.width, nominal + node.width + 1))


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
        _video_box_keys(
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
        _video_box_keys(
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
        _video_box_keys(
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


def _expand(counts: np.ndarray):
    """repeat_each, charged to the row-set budget: the intervals of a box are what a hostile
    window inflates."""
    return repeat_each(counts, ROW_SET_WORK)


def _video_box_keys(
    chunk: RowChunk,
    rows,
    f_first,
    f_count,
    f_step,
    h_lo,
    h_hi,
    w_lo,
    w_hi,
    full_rows: bool,
    full_cols: bool,
) -> IntervalSet:
    """Keys (f, h, w) with f = f_first + j*f_step (j < f_count), h in [h_lo, h_hi],
    w in [w_lo, w_hi], as kernel-position intervals per row (all arguments per row)."""
    lay = chunk.layout
    f_count = np.maximum(f_count, 0)
    if lay.is_tiled:
        return _tiled_box(chunk, rows, f_first, f_count, f_step, h_lo, h_hi, w_lo, w_hi)
    if not lay.is_temporal_major:
        return _frame_major_box(
            chunk,
            lay.video_start,
            rows,
            f_first,
            f_count,
            f_step,
            h_lo,
            h_hi,
            w_lo,
            w_hi,
            full_rows,
            full_cols,
        )
    # Anchor frames (f < anchor_frames) sit first, frame-major; the rest temporal-major.
    anchors = lay.anchor_frames
    in_anchor = np.clip(-(-(anchors - f_first) // f_step), 0, f_count)
    anchor_part = _frame_major_box(
        chunk,
        lay.video_start,
        rows,
        f_first,
        in_anchor,
        f_step,
        h_lo,
        h_hi,
        w_lo,
        w_hi,
        full_rows,
        full_cols,
    )
    main_part = _temporal_major_box(
        chunk,
        rows,
        f_first + in_anchor * f_step,
        f_count - in_anchor,
        f_step,
        h_lo,
        h_hi,
        w_lo,
        w_hi,
        full_rows,
        full_cols,
    )
    return anchor_part.union(main_part)


def _frame_major_box(
    chunk: RowChunk,
    base: int,
    rows,
    f_first,
    f_count,
    f_step,
    h_lo,
    h_hi,
    w_lo,
    w_hi,
    full_rows: bool,
    full_cols: bool,
) -> IntervalSet:
    """The box in frame-major positions from `base`.

    Collapses whole rows (full_cols) and whole frames (full_rows, f_step == 1) into single
    intervals, so a frame window costs one interval per row and a temporal column one per frame.
    """
    lay = chunk.layout
    s, width = lay.tokens_per_frame, lay.width
    if full_cols and full_rows and f_step == 1:
        start = base + f_first * s
        return chunk.per_row(rows, start, start + f_count * s)
    h_count = np.ones_like(f_count) if full_cols else h_hi - h_lo + 1
    which, within = _expand(f_count * h_count)
    hc = h_count[which]
    frame = f_first[which] + (within // hc) * f_step
    if full_cols:
        start = base + frame * s + h_lo[which] * width
        end = base + frame * s + (h_hi[which] + 1) * width
    else:
        row = h_lo[which] + within % hc
        start = base + frame * s + row * width + w_lo[which]
        end = base + frame * s + row * width + w_hi[which] + 1
    return chunk.per_row(rows[which], start, end)


def _temporal_major_box(
    chunk: RowChunk,
    rows,
    f_first,
    f_count,
    f_step,
    h_lo,
    h_hi,
    w_lo,
    w_hi,
    full_rows: bool,
    full_cols: bool,
) -> IntervalSet:
    """The box among frames >= anchor_frames, at main_start + p*T' + (f - anchor_frames).

    A place p holds its frames contiguously: a temporal column is one interval; when the
    frames span the whole block, consecutive places merge too (rows of places per h).
    """
    lay = chunk.layout
    t, width, anchors = lay.main_frames, lay.width, lay.anchor_frames
    base = lay.main_start
    live = f_count > 0
    rows, f_first, f_count = rows[live], f_first[live], f_count[live]
    h_lo, h_hi, w_lo, w_hi = h_lo[live], h_hi[live], w_lo[live], w_hi[live]
    if f_step == 1:
        whole = (f_first == anchors) & (f_count == t)
        parts = [
            _whole_frame_places(
                chunk,
                rows[whole],
                h_lo[whole],
                h_hi[whole],
                w_lo[whole],
                w_hi[whole],
                full_rows,
                full_cols,
            )
        ]
        some = ~whole
        rows, f_first, f_count = rows[some], f_first[some], f_count[some]
        h_lo, h_hi, w_lo, w_hi = h_lo[some], h_hi[some], w_lo[some], w_hi[some]
    else:
        parts = []
    # One interval per place (f_step == 1) or one point per frame (strided).
    n_places = (h_hi - h_lo + 1) * (w_hi - w_lo + 1)
    per_place = np.ones_like(f_count) if f_step == 1 else f_count
    which, within = _expand(n_places * per_place)
    wc = (w_hi - w_lo + 1)[which]
    place_index = within // per_place[which]
    place = (h_lo[which] + place_index // wc) * width + w_lo[which] + place_index % wc
    if f_step == 1:
        start = base + place * t + f_first[which] - anchors
        end = start + f_count[which]
    else:
        frame = f_first[which] + (within % per_place[which]) * f_step
        start = base + place * t + frame - anchors
        end = start + 1
    parts.append(chunk.per_row(rows[which], start, end))
    return parts[0] if len(parts) == 1 else parts[0].union(parts[1])


def _whole_frame_places(chunk: RowChunk, rows, h_lo, h_hi, w_lo, w_hi, full_rows, full_cols):
    """All main frames of the places in the box: places of a row h are one interval."""
    lay = chunk.layout
    t, width, base = lay.main_frames, lay.width, lay.main_start
    if full_cols:
        return chunk.per_row(rows, base + h_lo * width * t, base + (h_hi + 1) * width * t)
    which, within = _expand(h_hi - h_lo + 1)
    h = h_lo[which] + within
    return chunk.per_row(
        rows[which], base + (h * width + w_lo[which]) * t, base + (h * width + w_hi[which] + 1) * t
    )


def _tiled_box(chunk: RowChunk, rows, f_first, f_count, f_step, h_lo, h_hi, w_lo, w_hi):
    """The box in a tiled layout, cube by cube (see TokenLayout's docstring for the order).

    The box meets each frame group in a run of frames (one frame when strided), each row
    group in a run of rows, and each cube in a sub-box: one interval when it holds whole
    frames of the cube, one per frame when whole rows, else one per (frame, row). A whole row
    group (all its frames, rows and columns) is one interval; touching intervals (whole
    cubes side by side, consecutive row groups) merge when the set is normalized.
    """
    lay = chunk.layout
    (a, b, c), big_w = lay.cube, lay.width
    # Frame pieces: (box, frame group, first and last frame), inside one frame group.
    if f_step == 1:
        last = f_first + f_count - 1
        live = np.flatnonzero(f_count > 0)
        box, gf = _expand_range(live, f_first[live] // a, last[live] // a)
        f0 = np.maximum(f_first[box], gf * a)
        f1 = np.minimum(last[box], gf * a + a - 1)
    else:
        box, j = _expand(f_count)
        f0 = f1 = f_first[box] + j * f_step
        gf = f0 // a
    # Row pieces: (frame piece, row group, first and last row), inside one row group.
    piece, gh = _expand_range(np.arange(box.size), h_lo[box] // b, h_hi[box] // b)
    box, gf, f0, f1 = box[piece], gf[piece], f0[piece], f1[piece]
    h0 = np.maximum(h_lo[box], gh * b)
    h1 = np.minimum(h_hi[box], gh * b + b - 1)
    fa = np.minimum(a, lay.frames - gf * a)
    hb = np.minimum(b, lay.height - gh * b)
    group_start = lay.video_start + gf * a * lay.tokens_per_frame + fa * gh * b * big_w
    whole = (
        (f0 == gf * a)
        & (f1 == gf * a + fa - 1)
        & (h0 == gh * b)
        & (h1 == gh * b + hb - 1)
        & (w_lo[box] == 0)
        & (w_hi[box] == big_w - 1)
    )
    parts = [
        chunk.per_row(rows[box[whole]], group_start[whole], (group_start + fa * hb * big_w)[whole])
    ]
    # The other row pieces, cube by cube.
    some = np.flatnonzero(~whole)
    piece, gw = _expand_range(some, w_lo[box[some]] // c, w_hi[box[some]] // c)
    box, fa, hb = box[piece], fa[piece], hb[piece]
    wc = np.minimum(c, big_w - gw * c)
    base = group_start[piece] + fa * hb * gw * c
    df0, df1 = f0[piece] - gf[piece] * a, f1[piece] - gf[piece] * a
    dh0, dh1 = h0[piece] - gh[piece] * b, h1[piece] - gh[piece] * b
    dc0 = np.maximum(w_lo[box], gw * c) - gw * c
    dc1 = np.minimum(w_hi[box], gw * c + wc - 1) - gw * c
    full_cols = (dc0 == 0) & (dc1 == wc - 1)
    full_slices = full_cols & (dh0 == 0) & (dh1 == hb - 1)
    per_frame = np.where(full_slices, 1, df1 - df0 + 1)
    per_row = np.where(full_cols, 1, dh1 - dh0 + 1)
    cube, k = _expand(per_frame * per_row)
    jf, jh = k // per_row[cube], k % per_row[cube]
    slices, cols = full_slices[cube], full_cols[cube]
    df_first = df0[cube] + np.where(slices, 0, jf)
    df_last = np.where(slices, df1[cube], df_first)
    dh_first = dh0[cube] + np.where(cols, 0, jh)
    dh_last = np.where(cols, dh1[cube], dh_first)
    hbc, wcc = hb[cube], wc[cube]
    start = base[cube] + (df_first * hbc + dh_first) * wcc + dc0[cube]
    end = base[cube] + (df_last * hbc + dh_last) * wcc + dc1[cube] + 1
    parts.append(chunk.per_row(rows[box[cube]], start, end))
    return parts[0].union(parts[1])


def _expand_range(owner, first, last):
    """(owner repeated, value) for every value in [first, last] of each owner, charged."""
    return expand_ranges(owner, first, last, ROW_SET_WORK)[:2]


def _nominal_keys(chunk: RowChunk, rows, start, end) -> IntervalSet:
    """Keys whose nominal position is in [start, end) (per row), as kernel positions (the
    same in a tiled layout: its nominal order is the kernel order)."""
    lay = chunk.layout
    if not lay.is_temporal_major:
        return chunk.per_row(rows, start, end)
    # Text keeps its positions; video nominal offsets u = p*T + f map to the anchor block
    # (f < anchor_frames: one run of places per anchor frame) and the main block (monotone).
    text = chunk.per_row(
        rows, np.maximum(start, lay.text_start), np.minimum(end, lay.text_start + lay.text_tokens)
    )
    v0, n, big_t = lay.video_start, lay.video_tokens, lay.frames
    ua = np.clip(start - v0, 0, n)
    ub = np.clip(end - v0, 0, n)
    parts = [text]
    anchors, t = lay.anchor_frames, lay.main_frames
    for f in range(anchors):
        p_lo = -(-(ua - f) // big_t)
        p_hi = (ub - 1 - f) // big_t  # inclusive
        parts.append(
            chunk.per_row(
                rows, v0 + f * lay.tokens_per_frame + p_lo, v0 + f * lay.tokens_per_frame + p_hi + 1
            )
        )
    if t > 0:
        first = np.where(ua % big_t >= anchors, ua, ua - ua % big_t + anchors)
        last = ub - 1
        last = np.where(last % big_t >= anchors, last, last - last % big_t - 1)

        def main_index(u):
            return (u // big_t) * t + u % big_t - anchors

        ok = (first <= last) & (ub > ua)
        parts.append(
            chunk.per_row(
                rows[ok],
                lay.main_start + main_index(first[ok]),
                lay.main_start + main_index(last[ok]) + 1,
            )
        )
    out = parts[0]
    for part in parts[1:]:
        out = out.union(part)
    return out


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
        _video_box_keys(
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
