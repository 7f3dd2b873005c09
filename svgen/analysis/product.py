"""Exact tile classification of per-axis masks, without per-row key sets.

Most built-ins restrict a (query, key) pair in two ways only: which token classes may meet
(text / video, for the query and for the key), and, per coordinate axis (frame, row,
column), a relation between the query's and the key's value on that axis alone:
`spatial_window` is |f_q - f_k| <= a and |h_q - h_k| <= b and |w_q - w_k| <= c,
`block_causal` is f_k // n <= f_q // n, `first_frame` is f_k < n. Over a product box of
queries times a product box of keys such a conjunction keeps exactly the product of its
per-axis pair counts, read in O(1) from a 2-D prefix sum of the axis's relation (an axis has
at most a few thousand values, so the table is small).

A mask combining them is a signed sum of conjunctions (inclusion-exclusion: 1[A or B] =
1[A] + 1[B] - 1[A]1[B], 1[not A] = 1 - 1[A]), and every compute block is an exact union of a
few product boxes (`bounds.tile_boxes`), so each block's kept pairs, hence its kind, and the
density come out exactly. Only blocks that some conjunction may reach from the query block
are counted (per query box, a hull of the keys each conjunction allows); the rest are EMPTY.

The work is O(counted blocks x boxes^2 x conjunctions), independent of how many key
intervals a row would need (at 1.74M tokens a 3-D window is ~175 per row in frame-major
order and ~1,000 in temporal-major order, a frame window 14,400 per row temporal-major),
and two shortcuts keep the counted blocks few: blocks are classified coarse to fine (a FULL
or EMPTY block pair RATIO x RATIO times larger settles all its children, so a causal mask
costs its diagonal, not its triangle), and tiles whose boxes differ only on axes that no
conjunction constrains meet every tile alike, so each such kind of tile is counted once
(a frame-only mask in temporal-major order: ~15 kinds of tile per side).

The signed sum is built in svgen.analysis.axis_terms, the per-axis tables it counts with in
svgen.analysis.axis_relations. Masks with other nodes (band, prefix, user predicates that are
not per-axis, primitives registered later) return None from `axis_terms.polynomial` and go
through the row sets of `svgen.analysis.rowsets`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from svgen.analysis import bounds as box_bounds
from svgen.analysis.axis_relations import AXES
from svgen.analysis.axis_terms import (
    Term,
    axis_sizes,
    factor_constraints,
    factor_ranges,
    factor_size,
    factor_table,
    factors,
    polynomial,
)
from svgen.analysis.intervals import IntervalSet, expand_ranges, ragged_arange
from svgen.spec.limits import PRODUCT_WORK, WorkOverLimit
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout

# Coarse-to-fine classification: each level's blocks are RATIO x RATIO blocks of the next;
# the coarsest level has at most TOP_LEVEL_PAIRS block pairs.
RATIO = 4
TOP_LEVEL_PAIRS = 4096
# Tiles that meet every tile alike (see _signatures) are counted once, when that leaves at
# most this many pairs of distinct tiles.
SIGNATURE_PAIRS = 1 << 16
# Box pairs counted per NumPy pass (bounds the memory of a pass to a few hundred MB).
COMBOS_PER_PASS = 1 << 22

# ---------------------------------------------------------------------------------------------
# Boxes of a grid's tiles.


@dataclasses.dataclass(frozen=True)
class _Boxes:
    """Exact product boxes of every tile of one grid side, grouped by tile."""

    first: np.ndarray  # int64 [tiles + 1]: the boxes of tile t are first[t]:first[t + 1]
    lo: dict  # axis -> int64 [boxes]; text boxes have the range [0, 0] (text coordinates)
    hi: dict
    text: np.ndarray  # int64 [boxes]: 1 for a text box
    size: np.ndarray  # int64 [boxes]: multiplicity (text tokens of a text box; 1 for video)


@functools.lru_cache(maxsize=16)  # both sides of every level of one classification
def _tile_boxes(layout: TokenLayout, block: int) -> _Boxes:
    tiles = -(-layout.seq_len // block)
    b = box_bounds.tile_boxes(layout, block, range(tiles))
    text = b.lo["is_text"].astype(np.int64)
    size = np.where(text == 1, b.hi["i"] - b.lo["i"] + 1, 1)
    first = np.searchsorted(b.tile, np.arange(tiles + 1))
    return _Boxes(first, dict(b.lo), dict(b.hi), text, size)


# ---------------------------------------------------------------------------------------------
# The blocks each conjunction may reach (a sound superset: everything else is EMPTY).


def _axis_hull(factor: tuple, lo: np.ndarray, hi: np.ndarray):
    """Per query range [lo, hi]: the first and last key value the factor's relation allows
    from some query in it (first > last when none)."""
    return factor_table(factor).reach(lo, hi)


def _reached_keys(layout: TokenLayout, term: Term, boxes: _Boxes, which: np.ndarray):
    """(box, start, end): key-position intervals covering every key the term may keep for
    a query of box `which[i]` (their union is a superset, never a subset)."""
    parts = []
    for query_text in (0, 1):
        sel = which[boxes.text[which] == query_text]
        key_video = term.classes >> (2 * query_text) & 1
        key_text = term.classes >> (2 * query_text + 1) & 1
        if sel.size and key_text and layout.text_tokens:
            start = np.full(sel.size, layout.text_start, np.int64)
            parts.append((sel, start, start + layout.text_tokens))
        if sel.size and key_video:
            parts.append(_reached_video_keys(layout, term, boxes, sel))
    if not parts:
        return (np.zeros(0, np.int64),) * 3
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def _reached_video_keys(layout: TokenLayout, term: Term, boxes: _Boxes, sel: np.ndarray):
    hull = {}
    lo = {axis: boxes.lo[axis][sel] for axis in AXES}
    hi = {axis: boxes.hi[axis][sel] for axis in AXES}
    for factor in factors(term, axis_sizes(layout)):
        first, last = _axis_hull(factor, *factor_ranges(factor, lo, hi))
        if factor[0] != "p":
            hull[factor[0]] = first, last
            continue
        # The places [first, last] as rows first // W .. last // W, of every column unless
        # they lie in one row (a superset, as every hull here).
        width = layout.width
        one_row = first // width == last // width
        hull["h"] = first // width, last // width
        hull["w"] = np.where(one_row, first % width, 0), np.where(one_row, last % width, width - 1)
    live = np.ones(sel.size, bool)
    for first, last in hull.values():
        live &= first <= last
    (f0, f1), (h0, h1), (w0, w1) = ([a[live] for a in hull[x]] for x in AXES)
    sel = sel[live]
    if layout.is_tiled:
        return _tiled_hull(layout, sel, f0, f1, h0, h1, w0, w1)
    if not layout.is_temporal_major:
        return _frame_major_hull(layout, layout.video_start, sel, f0, f1, h0, h1, w0, w1)
    anchors = layout.anchor_frames
    anchor = _frame_major_hull(
        layout, layout.video_start, sel, f0, np.minimum(f1, anchors - 1), h0, h1, w0, w1
    )
    main = _temporal_major_hull(layout, sel, np.maximum(f0, anchors), f1, h0, h1, w0, w1)
    return tuple(np.concatenate([a, m]) for a, m in zip(anchor, main))


def _frame_major_hull(layout: TokenLayout, base: int, sel, f0, f1, h0, h1, w0, w1):
    """Frames [f0, f1] of rows [h0, h1] and columns [w0, w1] from `base`, frame-major: one
    interval per box when whole frames, else one per frame (row starts to row ends)."""
    s, width = layout.tokens_per_frame, layout.width
    whole = (h0 == 0) & (h1 == layout.height - 1) & (w0 == 0) & (w1 == width - 1)
    some = f0 <= f1
    one = whole & some
    starts = [base + f0[one] * s]
    ends = [base + (f1[one] + 1) * s]
    owners = [sel[one]]
    each = ~whole & some
    owner, frame, i = expand_ranges(sel[each], f0[each], f1[each])
    starts.append(base + frame * s + h0[each][i] * width + w0[each][i])
    ends.append(base + frame * s + h1[each][i] * width + w1[each][i] + 1)
    owners.append(owner)
    return np.concatenate(owners), np.concatenate(starts), np.concatenate(ends)


def _temporal_major_hull(layout: TokenLayout, sel, f0, f1, h0, h1, w0, w1):
    """The same box among the temporal-major frames (place p, frame f at
    main_start + p * T' + f - anchors): one interval per image row of places, from its first
    place's first frame to its last place's last frame (whole rows of places merge)."""
    t, width, anchors = layout.main_frames, layout.width, layout.anchor_frames
    some = f0 <= f1
    sel, f0, f1, h0, h1, w0, w1 = (a[some] for a in (sel, f0, f1, h0, h1, w0, w1))
    full_cols = (w0 == 0) & (w1 == width - 1)
    h_last = np.where(full_cols, h0, h1)  # whole rows: one interval over all of them
    owner, h, i = expand_ranges(sel, h0, h_last)
    last_h = np.where(full_cols[i], h1[i], h)
    start = layout.main_start + (h * width + w0[i]) * t + f0[i] - anchors
    end = layout.main_start + (last_h * width + w1[i]) * t + f1[i] - anchors + 1
    return owner, start, end


def _tiled_hull(layout: TokenLayout, sel, f0, f1, h0, h1, w0, w1):
    """The same box in a tiled layout: per (frame group, row group) it meets, one interval
    from its first token in the first cube it meets to its last token in the last one (the
    cubes of a row group are consecutive, and inside a cube the order is (f, h, w), so those
    two tokens are the box's least and greatest there)."""
    a, b, _ = layout.cube
    owner, gf, i = expand_ranges(sel, f0 // a, f1 // a)
    owner, gh, j = expand_ranges(owner, h0[i] // b, h1[i] // b)
    i, gf = i[j], gf[j]
    first = layout.tiled_offset(np.maximum(f0[i], gf * a), np.maximum(h0[i], gh * b), w0[i])
    last = layout.tiled_offset(
        np.minimum(f1[i], gf * a + a - 1), np.minimum(h1[i], gh * b + b - 1), w1[i]
    )
    return owner, layout.video_start + first, layout.video_start + last + 1


def _reached_blocks(layout, poly, q_boxes: _Boxes, t0: int, t1: int, block_kv: int, nk: int):
    """Flat (q tile * nk + kv tile) ranges, half-open and merged, of the blocks that some
    term may reach from q tiles [t0, t1)."""
    which = np.arange(q_boxes.first[t0], q_boxes.first[t1])
    tile_of_box = np.repeat(np.arange(t0, t1), np.diff(q_boxes.first[t0 : t1 + 1]))
    starts, ends = [], []
    for term in poly:
        box, start, end = _reached_keys(layout, term, q_boxes, which)
        keep = end > start
        base = tile_of_box[box[keep] - which[0]] * nk
        starts.append(base + start[keep] // block_kv)
        ends.append(base + (end[keep] - 1) // block_kv + 1)
    if not starts:  # no term: the mask keeps nothing
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    reached = IntervalSet.normalized(np.concatenate(starts), np.concatenate(ends))
    return reached.starts, reached.ends


def _candidate_pairs(layout, poly, q_boxes, t0, t1, block_kv, nk, open_parents=None):
    """Flat (q tile * nk + kv tile) of q tiles [t0, t1) that some term may reach (and,
    below the top level, whose parent is BOUNDARY)."""
    starts, ends = _reached_blocks(layout, poly, q_boxes, t0, t1, block_kv, nk)
    if starts.size == 0:
        return starts
    if open_parents is None:
        flat = expand_ranges(np.zeros(starts.size, np.int64), starts, ends - 1)[1]
        return flat
    flat = _children(open_parents, t0, t1, nk)
    at = np.searchsorted(starts, flat, side="right") - 1
    return flat[(at >= 0) & (flat < ends[np.maximum(at, 0)])]


def _children(open_parents: np.ndarray, t0: int, t1: int, nk: int) -> np.ndarray:
    """Flat (q tile * nk + kv tile) of q tiles [t0, t1) whose parent is open."""
    parent_q, parent_kv = np.nonzero(open_parents[t0 // RATIO : (t1 - 1) // RATIO + 1])
    parent_q += t0 // RATIO
    offset = np.arange(RATIO)
    q = (parent_q[:, None, None] * RATIO + offset[None, :, None]).repeat(RATIO, axis=2)
    kv = (parent_kv[:, None, None] * RATIO + offset[None, None, :]).repeat(RATIO, axis=1)
    keep = (q >= t0) & (q < t1) & (kv < nk)
    return q[keep] * nk + kv[keep]


# ---------------------------------------------------------------------------------------------
# Counting.


def _pair_counts(layout, poly, q_boxes: _Boxes, k_boxes: _Boxes, q_tile, kv_tile):
    """int64 kept pairs of each (q tile, kv tile), summed over their box pairs and terms."""
    nq_box = np.diff(q_boxes.first)[q_tile]
    nk_box = np.diff(k_boxes.first)[kv_tile]
    combos = nq_box * nk_box
    # The work: box pairs times terms (many small cubes, dozens of terms), before allocating.
    PRODUCT_WORK.charge(int(combos.sum()) * len(poly))
    pair = np.repeat(np.arange(q_tile.size), combos)
    local = ragged_arange(combos)
    qb = q_boxes.first[q_tile][pair] + local // nk_box[pair]
    kb = k_boxes.first[kv_tile][pair] + local % nk_box[pair]
    class_bit = 1 << (2 * q_boxes.text[qb] + k_boxes.text[kb])
    weight = q_boxes.size[qb] * k_boxes.size[kb]
    total = np.zeros(qb.size, np.int64)
    ranges = {
        axis: (
            q_boxes.lo[axis][qb],
            q_boxes.hi[axis][qb],
            k_boxes.lo[axis][kb],
            k_boxes.hi[axis][kb],
        )
        for axis in AXES
    }
    q_lo = {axis: r[0] for axis, r in ranges.items()}
    q_hi = {axis: r[1] for axis, r in ranges.items()}
    k_lo = {axis: r[2] for axis, r in ranges.items()}
    k_hi = {axis: r[3] for axis, r in ranges.items()}
    axis_counts = {}  # factor -> counts: terms share most of them
    for term, coef in poly.items():
        count = np.where(class_bit & term.classes, weight * coef, 0)
        for factor in factors(term, axis_sizes(layout)):
            if factor not in axis_counts:
                axis_counts[factor] = _factor_counts(
                    factor, *factor_ranges(factor, q_lo, q_hi), *factor_ranges(factor, k_lo, k_hi)
                )
            count *= axis_counts[factor]
        total += count
    starts = np.concatenate([[0], np.cumsum(combos)[:-1]])
    return np.add.reduceat(total, starts) if total.size else np.zeros(0, np.int64)


def _factor_counts(factor: tuple, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
    """Pairs of one factor's relation in each [q_lo, q_hi] x [k_lo, k_hi]."""
    if not factor_constraints(factor):  # every pair
        return (q_hi - q_lo + 1) * (k_hi - k_lo + 1)
    return factor_table(factor).count(q_lo, q_hi, k_lo, k_hi)


@dataclasses.dataclass(frozen=True)
class ProductClassification:
    kinds: np.ndarray  # int8 [nq, nk] of TileKind
    kept: int  # exact kept real pairs
    boundary_index: np.ndarray | None = None  # with boundary_counts: flat BOUNDARY blocks,
    boundary_pairs: np.ndarray | None = None  # sorted, and the kept pairs of each


def classify_product(
    mask,
    layout: TokenLayout,
    grid,
    progress: Callable[[int, int], None] | None = None,
    boundary_counts: bool = False,
) -> ProductClassification:
    """Kinds and kept pairs of a per-axis mask (see the module docstring); with
    `boundary_counts`, also the kept pairs of every BOUNDARY block.

    Coarse to fine: blocks RATIO x RATIO times larger are classified first, and a block pair
    is counted only when its parent is BOUNDARY (a FULL or EMPTY parent settles all its
    children)."""
    poly = polynomial(mask, axis_sizes(layout))
    q_boxes = _tile_boxes(layout, grid.block_q)
    k_boxes = _tile_boxes(layout, grid.block_kv)
    constrained = {axis for term in poly for axis in AXES if term.on_axis(axis)}
    if any(term.on_axis("p") for term in poly):
        constrained |= {"h", "w"}
    q_sig, q_rep = _signatures(q_boxes, constrained)
    k_sig, k_rep = _signatures(k_boxes, constrained)
    if q_rep.size * k_rep.size <= SIGNATURE_PAIRS:
        q_count, k_count = np.diff(q_boxes.first), np.diff(k_boxes.first)
        _check_bound(int(q_count[q_rep].sum()) * int(k_count[k_rep].sum()) * len(poly))
        out = _classify_signatures(
            layout, poly, grid, (q_sig, q_rep), (k_sig, k_rep), boundary_counts
        )
        if progress is not None:
            progress(grid.num_q_blocks, grid.num_q_blocks)
        return out
    kinds = kept = None
    levels = _levels(grid)
    found = [] if boundary_counts else None
    for depth, level in enumerate(levels):
        last = depth == len(levels) - 1
        kinds, level_kept = _classify_level(
            layout, poly, level, kinds, progress if last else None, found if last else None
        )
        kept = level_kept if kept is None else kept  # the top level counts every pair
    if found is None:
        return ProductClassification(kinds, kept)
    index = np.concatenate([f[0] for f in found] + [np.zeros(0, np.int64)])
    pairs = np.concatenate([f[1] for f in found] + [np.zeros(0, np.int64)])
    order = np.argsort(index, kind="stable")
    return ProductClassification(kinds, kept, index[order], pairs[order])


def _signatures(boxes: _Boxes, constrained: set) -> tuple[np.ndarray, np.ndarray]:
    """(signature per tile, a tile of each signature). A tile's signature is its boxes with
    the ranges of axes no term constrains replaced by their lengths: the count of a box pair
    on such an axis is the product of the lengths, so tiles of one signature meet every
    tile alike."""
    columns = [boxes.text, boxes.size]
    for axis in AXES:
        lo, hi = boxes.lo[axis], boxes.hi[axis]
        columns += [lo, hi] if axis in constrained else [hi - lo + 1]
    rows = np.stack(columns, axis=1)
    ids: dict[bytes, int] = {}
    tiles = boxes.first.size - 1
    signature = np.empty(tiles, np.int64)
    for t in range(tiles):
        signature[t] = ids.setdefault(rows[boxes.first[t] : boxes.first[t + 1]].tobytes(), len(ids))
    _, representative = np.unique(signature, return_index=True)
    return signature, representative


def _classify_signatures(layout, poly, grid, q, kv, boundary_counts: bool):
    """Kinds and kept pairs from one count per (q signature, kv signature); `q` and `kv`
    are (signature per tile, a tile of each signature)."""
    (q_sig, q_rep), (k_sig, k_rep) = q, kv
    q_tile = np.repeat(q_rep, k_rep.size)
    kv_tile = np.tile(k_rep, q_rep.size)
    q_boxes = _tile_boxes(layout, grid.block_q)
    k_boxes = _tile_boxes(layout, grid.block_kv)
    count = _pair_counts(layout, poly, q_boxes, k_boxes, q_tile, kv_tile)
    table = _kinds(count, grid.real_pairs(q_tile, kv_tile)).reshape(q_rep.size, k_rep.size)
    count = count.reshape(q_rep.size, k_rep.size)
    per_q = np.bincount(q_sig, minlength=q_rep.size)
    per_kv = np.bincount(k_sig, minlength=k_rep.size)
    kept = int((count * per_q[:, None] * per_kv).sum())
    kinds = table[q_sig[:, None], k_sig[None, :]]
    if not boundary_counts:
        return ProductClassification(kinds, kept)
    nk = grid.num_kv_blocks
    index = np.flatnonzero(kinds.ravel() == TileKind.BOUNDARY)
    pairs = count[q_sig[index // nk], k_sig[index % nk]]
    return ProductClassification(kinds, kept, index, pairs.astype(np.int64))


def _levels(grid) -> list:
    """Grids from the coarsest (at most TOP_LEVEL_PAIRS block pairs) to `grid`."""
    out = [grid]
    while out[-1].num_q_blocks * out[-1].num_kv_blocks > TOP_LEVEL_PAIRS and (
        out[-1].num_q_blocks > 1 or out[-1].num_kv_blocks > 1
    ):
        g = out[-1]
        out.append(type(g)(g.seq_len, g.block_q * RATIO, g.block_kv * RATIO))
    return out[::-1]


def _classify_level(layout, poly, grid, parent, progress, found: list | None = None):
    """Kinds of `grid` given the kinds of its parent grid (None at the top), and the pairs
    counted (all kept pairs at the top level); `found` collects (flat index, kept pairs) of
    the BOUNDARY blocks counted."""
    nq, nk = grid.num_q_blocks, grid.num_kv_blocks
    kinds = np.full((nq, nk), TileKind.EMPTY, np.int8)
    if parent is not None:
        settled = np.repeat(np.repeat(parent, RATIO, axis=0), RATIO, axis=1)[:nq, :nk]
        kinds[settled == TileKind.FULL] = TileKind.FULL
        open_parents = parent == TileKind.BOUNDARY
    else:
        open_parents = None
    q_boxes = _tile_boxes(layout, grid.block_q)
    k_boxes = _tile_boxes(layout, grid.block_kv)
    kept = 0
    # A chunk of q tiles reaches at most `tiles * nk` blocks, about COMBOS_PER_PASS box pairs
    # on average (the passes then split them by their actual box pairs, see _passes).
    combos = np.diff(q_boxes.first).mean() * np.diff(k_boxes.first).mean()
    tiles = max(1, int(COMBOS_PER_PASS // (combos * nk)))
    _check_bound(_level_bound(layout, poly, grid, open_parents, q_boxes, k_boxes, tiles))
    for t0 in range(0, nq, tiles):
        t1 = min(t0 + tiles, nq)
        if parent is not None and not open_parents[t0 // RATIO : (t1 - 1) // RATIO + 1].any():
            continue
        flat = _candidate_pairs(layout, poly, q_boxes, t0, t1, grid.block_kv, nk, open_parents)
        for part in _passes(flat, nk, q_boxes, k_boxes):
            q_tile, kv_tile = part // nk, part % nk
            count = _pair_counts(layout, poly, q_boxes, k_boxes, q_tile, kv_tile)
            kept += int(count.sum())
            kind = _kinds(count, grid.real_pairs(q_tile, kv_tile))
            kinds[q_tile, kv_tile] = kind
            if found is not None:
                boundary = kind == TileKind.BOUNDARY
                found.append((part[boundary], count[boundary]))
        if progress is not None:
            progress(t1, nq)
    return kinds, kept


def _passes(flat: np.ndarray, nk: int, q_boxes: _Boxes, k_boxes: _Boxes):
    """Consecutive runs of the block pairs `flat` of about COMBOS_PER_PASS box pairs each (at
    most that plus one pair's): split by each pair's own box pairs, not the most any pair has,
    so that tiles of many small cubes next to tiles of few boxes do not make every pass tiny
    (a NumPy pass per handful of pairs)."""
    if flat.size == 0:
        return []
    combos = np.diff(q_boxes.first)[flat // nk] * np.diff(k_boxes.first)[flat % nk]
    group = (np.cumsum(combos) - combos) // COMBOS_PER_PASS
    cuts = np.flatnonzero(np.diff(group)) + 1
    return np.split(flat, cuts)


def _level_bound(layout, poly, grid, open_parents, q_boxes: _Boxes, k_boxes: _Boxes, tiles):
    """PRODUCT_WORK a level charges at most, known before it runs: the box pairs of the
    children of BOUNDARY parents (every block pair at the top), and the reach of every query
    box of the chunks of `tiles` q tiles it visits (one [boxes, axis size] array per axis),
    both per term."""
    nq, nk = grid.num_q_blocks, grid.num_kv_blocks
    q_count, k_count = np.diff(q_boxes.first), np.diff(k_boxes.first)
    if open_parents is None:
        pairs = int(q_count.sum()) * int(k_count.sum())
        rows = np.arange(nq)
    else:
        flat = _children(open_parents, 0, nq, nk)
        pairs = int((q_count[flat // nk] * k_count[flat % nk]).sum())
        chunks = np.unique(flat // nk // tiles)  # _reached_blocks takes all of their boxes
        rows = (chunks[:, None] * tiles + np.arange(tiles)).ravel()
        rows = rows[rows < nq]
    reach = int(q_count[rows].sum()) * (layout.frames + layout.height + layout.width)
    return (pairs + reach) * len(poly)


def _check_bound(bound: int) -> None:
    """Refuse, before it starts, a step that could take PRODUCT_WORK past its budget."""
    budget = PRODUCT_WORK.current()
    if budget is not None and budget.used + bound > budget.limit:
        raise WorkOverLimit(PRODUCT_WORK, budget.used + bound)


def _kinds(count: np.ndarray, real: np.ndarray) -> np.ndarray:
    return np.where(
        count == real, TileKind.FULL, np.where(count > 0, TileKind.BOUNDARY, TileKind.EMPTY)
    ).astype(np.int8)


# ---------------------------------------------------------------------------------------------
# Rows with keys (what `tiling.align` needs to count the rows it empties).

ROWS_PER_PASS = 1 << 20


def rows_with_keys(layout: TokenLayout, mask, grid) -> tuple[np.ndarray, np.ndarray]:
    """Per q block of `grid`: real rows keeping at least one key, and those among them
    keeping none in the last kv block (svgen.analysis.classify.PairCounts)."""
    poly = polynomial(mask, axis_sizes(layout))
    everything = _tile_boxes(layout, layout.seq_len)  # one tile: every key
    last = _tile_boxes(layout, grid.block_kv)
    last_tile = grid.num_kv_blocks - 1
    with_keys = np.zeros(grid.num_q_blocks, np.int64)
    without_last = np.zeros(grid.num_q_blocks, np.int64)
    for lo in range(0, layout.seq_len, ROWS_PER_PASS):
        rows = np.arange(lo, min(lo + ROWS_PER_PASS, layout.seq_len), dtype=np.int64)
        has = _row_keys(layout, poly, everything, 0, rows) > 0
        none_last = _row_keys(layout, poly, last, last_tile, rows) == 0
        block = rows // grid.block_q
        with_keys += np.bincount(block[has], minlength=grid.num_q_blocks)
        without_last += np.bincount(block[has & none_last], minlength=grid.num_q_blocks)
    return with_keys, without_last


def _row_keys(layout, poly, boxes: _Boxes, tile: int, rows: np.ndarray) -> np.ndarray:
    """Keys of tile `tile` of `boxes` that each query row (kernel positions) keeps."""
    c = layout.coordinates(rows)
    x = {"f": c.frame, "h": c.row, "w": c.col, "p": c.row * layout.width + c.col}
    query_text = c.is_text.astype(np.int64)
    total = np.zeros(rows.size, np.int64)
    for b in range(boxes.first[tile], boxes.first[tile + 1]):
        class_bit = 1 << (2 * query_text + boxes.text[b])
        lo = {axis: boxes.lo[axis][b] for axis in AXES}
        hi = {axis: boxes.hi[axis][b] for axis in AXES}
        for term, coef in poly.items():
            count = np.where(class_bit & term.classes, coef * boxes.size[b], 0)
            for factor in factors(term, axis_sizes(layout)):
                point = np.arange(factor_size(factor), dtype=np.int64)  # every query value
                per_value = _factor_counts(factor, point, point, *factor_ranges(factor, lo, hi))
                count *= per_value[x[factor[0]]]
            total += count
    return total
