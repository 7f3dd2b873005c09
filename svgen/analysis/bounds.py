"""Sound tile classification of user predicates by interval arithmetic over coordinate boxes.

A user `expr` has no closed-form key intervals, so it is bounded per tile instead: the
positions of a tile are split into a few exact coordinate boxes (a partial row, partial
frame, whole frames, ...; in a tiled layout runs of rows, frames, cubes, row groups and frame
groups of the cube order; text tokens in a box of their own), and the predicate is evaluated
with interval arithmetic over every (q box, kv box) pair. A tile pair is proven TRUE when no
box pair can be false, proven FALSE when none can be true; anything else stays undecided and
runs as a BOUNDARY tile, where the kernel evaluates the predicate exactly.

Interval arithmetic over-approximates (each symbol varies independently), so "proven" is
always sound; it is exact for the common monotone shapes (|f_q - f_k| <= a, i_k < n, ...).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from svgen.spec.expr import FloorDiv, FloorMod
from svgen.core.layout import TokenLayout

_COORDS = ("f", "h", "w", "i", "is_text")


@dataclasses.dataclass(frozen=True)
class Boxes:
    """Coordinate boxes: for each coordinate c, boxes.lo[c] <= value <= boxes.hi[c]."""

    tile: np.ndarray  # int64 [n]: the tile each box belongs to (sorted)
    lo: dict[str, np.ndarray]
    hi: dict[str, np.ndarray]


def tile_boxes(layout: TokenLayout, block: int, tiles: range) -> Boxes:
    """Exact coordinate boxes covering the real positions of each tile in `tiles`."""
    rows = []
    for t in tiles:
        start, end = t * block, min((t + 1) * block, layout.seq_len)
        for box in _range_boxes(layout, start, end):
            rows.append((t,) + box)
    arr = np.array(rows, dtype=np.int64).reshape(-1, 1 + 2 * len(_COORDS))
    lo = {c: arr[:, 1 + 2 * j] for j, c in enumerate(_COORDS)}
    hi = {c: arr[:, 2 + 2 * j] for j, c in enumerate(_COORDS)}
    return Boxes(arr[:, 0], lo, hi)


def _range_boxes(layout: TokenLayout, start: int, end: int):
    """Boxes (f_lo, f_hi, h_lo, h_hi, w_lo, w_hi, i_lo, i_hi, t_lo, t_hi) of kernel positions
    [start, end); i is the nominal position."""
    v0, n = layout.video_start, layout.video_tokens
    t0, p = layout.text_start, layout.text_tokens
    ts, te = max(start, t0), min(end, t0 + p)
    if ts < te:
        yield (0, 0, 0, 0, 0, 0, ts, te - 1, 1, 1)
    vs, ve = max(start, v0) - v0, min(end, v0 + n) - v0
    if layout.is_tiled:  # runs of the cube order: contiguous, so nominal = kernel positions
        for a, b in _tiled_pieces(layout, vs, ve):
            f0, h0, w0 = (int(x) for x in layout.tiled_coordinates(a))
            f1, h1, w1 = (int(x) for x in layout.tiled_coordinates(b - 1))
            yield (f0, f1, h0, h1, w0, w1, a + v0, b - 1 + v0, 0, 0)
        return
    if not layout.is_temporal_major:
        for a, b in _video_pieces(layout, vs, ve):
            f0, h0, w0 = _decode(layout, a)
            f1, h1, w1 = _decode(layout, b - 1)
            yield (f0, f1, h0, h1, w0, w1, a + v0, b - 1 + v0, 0, 0)
        return
    anchor_end = layout.anchor_frames * layout.tokens_per_frame
    for a, b in _video_pieces(layout, vs, min(ve, anchor_end)):
        f0, h0, w0 = _decode(layout, a)
        f1, h1, w1 = _decode(layout, b - 1)
        yield _with_nominal(layout, f0, f1, h0, h1, w0, w1)
    for f0, f1, p0, p1 in _main_pieces(layout, max(vs, anchor_end) - anchor_end, ve - anchor_end):
        for a, b in _video_pieces(layout, p0, p1 + 1):  # places of one "frame": rows/cols boxes
            _, h0, w0 = _decode(layout, a)
            _, h1, w1 = _decode(layout, b - 1)
            yield _with_nominal(layout, f0, f1, h0, h1, w0, w1)


def _with_nominal(layout: TokenLayout, f0, f1, h0, h1, w0, w1):
    big_t, v0, w = layout.frames, layout.video_start, layout.width
    return (
        f0,
        f1,
        h0,
        h1,
        w0,
        w1,
        v0 + (h0 * w + w0) * big_t + f0,
        v0 + (h1 * w + w1) * big_t + f1,
        0,
        0,
    )


def _main_pieces(layout: TokenLayout, ja: int, jb: int):
    """temporal_major main block offsets [ja, jb) as (f_lo, f_hi, p_lo, p_hi) boxes."""
    t, anchors = layout.main_frames, layout.anchor_frames
    if ja >= jb or t == 0:
        return
    pa, pb = ja // t, (jb - 1) // t
    fa, fb = anchors + ja % t, anchors + (jb - 1) % t
    if pa == pb:
        yield fa, fb, pa, pa
        return
    if fa > anchors:  # partial first place
        yield fa, layout.frames - 1, pa, pa
        pa += 1
    if fb < layout.frames - 1:  # partial last place
        yield anchors, fb, pb, pb
        pb -= 1
    if pa <= pb:
        yield anchors, layout.frames - 1, pa, pb


def _tiled_pieces(layout: TokenLayout, vs: int, ve: int):
    """Split tiled video offsets [vs, ve) into runs that are coordinate boxes: from each
    position, as many whole units as fit of the coarsest level whose unit starts there (frame
    groups; row groups, cubes, frames of a cube, rows of a cube within their parent unit;
    single tokens of a row)."""
    while vs < ve:
        for start, size, parent_end in _tiled_levels(layout, vs):
            if start != vs:
                continue
            limit = min(parent_end, ve)
            # Whole units before the parent's end all have the full size (only the last unit
            # of a parent is partial, and it ends at parent_end).
            end = parent_end if limit == parent_end else vs + (limit - vs) // size * size
            if end > vs:
                yield vs, end
                vs = end
                break


def _tiled_levels(layout: TokenLayout, v: int) -> list[tuple[int, int, int]]:
    """Per level of the tiled order, coarse to fine (frame group, row group, cube, frame of
    the cube, row of the cube, token): (first offset of v's unit, the size of a whole unit of
    that level, the end of v's parent unit)."""
    (a, b, c), big_h, big_w = layout.cube, layout.height, layout.width
    gf = v // (a * big_h * big_w)
    start = gf * a * big_h * big_w
    fa = min(a, layout.frames - gf * a)
    levels = [(start, a * big_h * big_w, layout.video_tokens)]
    end = start + fa * big_h * big_w
    gh = (v - start) // (fa * b * big_w)
    start += gh * fa * b * big_w
    hb = min(b, big_h - gh * b)
    levels.append((start, fa * b * big_w, end))
    end = start + fa * hb * big_w
    gw = (v - start) // (fa * hb * c)
    start += gw * fa * hb * c
    wc = min(c, big_w - gw * c)
    levels.append((start, fa * hb * c, end))
    end = start + fa * hb * wc
    start += (v - start) // (hb * wc) * (hb * wc)
    levels.append((start, hb * wc, end))
    end = start + hb * wc
    start += (v - start) // wc * wc
    levels.append((start, wc, end))
    levels.append((v, 1, start + wc))
    return levels


def _decode(layout: TokenLayout, v: int):
    s = layout.tokens_per_frame
    return v // s, (v % s) // layout.width, v % layout.width


def _video_pieces(layout: TokenLayout, vs: int, ve: int):
    """Split frame-major video indices [vs, ve) at row and frame boundaries into boxes."""
    w, s = layout.width, layout.tokens_per_frame
    while vs < ve:
        if vs % w:  # partial first row
            b = min(ve, (vs // w + 1) * w)
        elif vs % s:  # whole rows up to the end of this frame
            b = min((vs // s + 1) * s, ve // w * w)
            if b <= vs:
                b = ve
        else:  # whole frames, else whole rows, else the last partial row
            b = ve // s * s
            if b <= vs:
                b = ve // w * w
            if b <= vs:
                b = ve
        yield vs, b
        vs = b


def classify_predicate(
    expr: sympy.Basic, q_boxes: Boxes, k_boxes: Boxes, q_tiles: np.ndarray, k_tiles: np.ndarray
):
    """(proven_true, proven_false), bool [len(q_tiles), len(k_tiles)]."""
    env = {}
    for c in _COORDS:
        env[f"{c}_q"] = (q_boxes.lo[c][:, None], q_boxes.hi[c][:, None])
        env[f"{c}_k"] = (k_boxes.lo[c][None, :], k_boxes.hi[c][None, :])
    can_true, can_false = boolean_bounds(expr, env)
    shape = (q_boxes.tile.size, k_boxes.tile.size)
    can_true = np.broadcast_to(can_true, shape)
    can_false = np.broadcast_to(can_false, shape)
    q_starts = np.searchsorted(q_boxes.tile, q_tiles)
    k_starts = np.searchsorted(k_boxes.tile, k_tiles)

    def any_per_tile(a):
        a = np.logical_or.reduceat(a, q_starts, axis=0)
        return np.logical_or.reduceat(a, k_starts, axis=1)

    return ~any_per_tile(can_false), ~any_per_tile(can_true)


def integer_bounds(e, env):
    """(lo, hi) arrays bounding an integer expression."""
    if isinstance(e, sympy.Symbol):
        return env[e.name]
    if isinstance(e, sympy.Integer):
        v = np.int64(int(e))
        return v, v
    parts = [integer_bounds(a, env) for a in e.args]
    if isinstance(e, sympy.Add):
        return sum(p[0] for p in parts[1:]) + parts[0][0], sum(p[1] for p in parts[1:]) + parts[0][
            1
        ]
    if isinstance(e, sympy.Mul):
        lo, hi = parts[0]
        for plo, phi in parts[1:]:
            cands = [lo * plo, lo * phi, hi * plo, hi * phi]
            lo, hi = (
                np.minimum.reduce(np.broadcast_arrays(*cands)),
                np.maximum.reduce(np.broadcast_arrays(*cands)),
            )
        return lo, hi
    if isinstance(e, sympy.Abs):
        lo, hi = parts[0]
        abs_lo = np.where((lo <= 0) & (hi >= 0), 0, np.minimum(np.abs(lo), np.abs(hi)))
        return abs_lo, np.maximum(np.abs(lo), np.abs(hi))
    if isinstance(e, (sympy.Min, sympy.Max)):
        fn = np.minimum if isinstance(e, sympy.Min) else np.maximum
        lo, hi = parts[0]
        for plo, phi in parts[1:]:
            lo, hi = fn(lo, plo), fn(hi, phi)
        return lo, hi
    if isinstance(e, FloorDiv):
        (lo, hi), (d, _) = parts
        return lo // d, hi // d  # monotone in the numerator for a positive divisor
    if isinstance(e, FloorMod):
        (lo, hi), (d, _) = parts
        same_period = lo // d == hi // d
        return np.where(same_period, lo % d, 0), np.where(same_period, hi % d, d - 1)
    raise TypeError(f"unsupported integer expression {type(e).__name__}: {e}")


def boolean_bounds(e, env):
    """(can_be_true, can_be_false) arrays for a boolean expression."""
    if e is sympy.true:
        return np.bool_(True), np.bool_(False)
    if e is sympy.false:
        return np.bool_(False), np.bool_(True)
    if isinstance(e, sympy.And):
        parts = [boolean_bounds(a, env) for a in e.args]
        return (
            np.logical_and.reduce(np.broadcast_arrays(*(p[0] for p in parts))),
            np.logical_or.reduce(np.broadcast_arrays(*(p[1] for p in parts))),
        )
    if isinstance(e, sympy.Or):
        parts = [boolean_bounds(a, env) for a in e.args]
        return (
            np.logical_or.reduce(np.broadcast_arrays(*(p[0] for p in parts))),
            np.logical_and.reduce(np.broadcast_arrays(*(p[1] for p in parts))),
        )
    if isinstance(e, sympy.Not):
        t, f = boolean_bounds(e.args[0], env)
        return f, t
    (alo, ahi), (blo, bhi) = (integer_bounds(a, env) for a in e.args)
    if isinstance(e, sympy.Eq):
        return (alo <= bhi) & (blo <= ahi), ~((alo == ahi) & (blo == bhi) & (alo == blo))
    if isinstance(e, sympy.Ne):
        return ~((alo == ahi) & (blo == bhi) & (alo == blo)), (alo <= bhi) & (blo <= ahi)
    if isinstance(e, sympy.Lt):
        return alo < bhi, ahi >= blo
    if isinstance(e, sympy.Le):
        return alo <= bhi, ahi > blo
    if isinstance(e, sympy.Gt):
        return ahi > blo, alo <= bhi
    if isinstance(e, sympy.Ge):
        return ahi >= blo, alo < bhi
    raise TypeError(f"unsupported boolean expression {type(e).__name__}: {e}")
