"""Where coordinate boxes and nominal ranges of keys lie in kernel order, as interval sets
per query row.

`RowChunk` is a chunk of query rows laid out on one line (see `intervals`); `Bounds` the pair
of interval sets a row-set function returns (svgen.analysis.rowsets). The two builders here
know every token order (frame_major; temporal_major with its anchor frames first; tiled
cubes), so a primitive's row sets name its boxes and ranges and never an order:
  * `video_box_keys`: keys (f, h, w) in a box of frames (optionally strided), rows and
    columns, per query row;
  * `nominal_keys`: keys whose position in the nominal (frame-major) order lies in a range.
Every interval built is charged to `svgen.spec.limits.ROW_SET_WORK` before it is allocated.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from svgen.analysis.intervals import IntervalSet, expand_ranges, repeat_each
from svgen.spec.limits import ROW_SET_WORK
from svgen.core.layout import TokenLayout


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


def _expand(counts: np.ndarray):
    """repeat_each, charged to the row-set budget: the intervals of a box are what a hostile
    window inflates."""
    return repeat_each(counts, ROW_SET_WORK)


def video_box_keys(
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


def nominal_keys(chunk: RowChunk, rows, start, end) -> IntervalSet:
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
