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

Masks with other nodes (band, prefix, user predicates, primitives registered later) return
None from `polynomial` and go through the row sets of `svgen.analysis.rowsets`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np
import sympy

from svgen import ir
from svgen.spec.expr import SYMBOLS
from svgen.analysis import bounds as box_bounds
from svgen.analysis.intervals import IntervalSet, ragged_arange
from svgen.spec.limits import PRODUCT_WORK, WorkOverLimit
from svgen.runtime.kinds import TileKind
from svgen.runtime.layout import Coordinates, TokenLayout

AXES = ("f", "h", "w")
# Places of a frame (height x width) up to which a part of a user predicate that reads rows and
# columns together is tabulated: a [places + 1]^2 int32 prefix sum (64 MiB at the limit).
MAX_PLACES = 4096
# Class pairs as bits: bit (2 * query_is_text + key_is_text).
VIDEO_PAIR = 1 << 0
TEXT_QUERY_VIDEO_KEY = 1 << 2
ANY_QUERY_VIDEO_KEY = VIDEO_PAIR | TEXT_QUERY_VIDEO_KEY
TEXT_INVOLVED = (1 << 1) | (1 << 2) | (1 << 3)
ALL_PAIRS = 0b1111
# Above these the table or the sum would cost more than the row sets: fall back to them.
MAX_AXIS = 1024
MAX_TERMS = 64
# Coarse-to-fine classification: each level's blocks are RATIO x RATIO blocks of the next;
# the coarsest level has at most TOP_LEVEL_PAIRS block pairs.
RATIO = 4
TOP_LEVEL_PAIRS = 4096
# Tiles that meet every tile alike (see _signatures) are counted once, when that leaves at
# most this many pairs of distinct tiles.
SIGNATURE_PAIRS = 1 << 16
# Box pairs counted per NumPy pass (bounds the memory of a pass to a few hundred MB).
COMBOS_PER_PASS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Term:
    """A conjunction: the class pairs it allows and its per-axis constraints, each
    (axis, kind, parameter) with kind one of near (|x_q - x_k| <= p), below (x_k < p),
    causal (x_k <= x_q), block (x_k // p <= x_q // p), stride ((x_q - x_k) % p == 0),
    cube (|x_q // s - x_k // s| <= r for p = (s, r))."""

    classes: int
    constraints: frozenset

    def times(self, other: "Term") -> "Term":
        return Term(self.classes & other.classes, self.constraints | other.constraints)

    def on_axis(self, axis: str) -> frozenset:
        return frozenset((kind, p) for a, kind, p in self.constraints if a == axis)


ONE = Term(ALL_PAIRS, frozenset())


def _near(axis: str, radius: int | None) -> set:
    return set() if radius is None else {(axis, "near", radius)}


def _atom(node) -> Term | None:
    """The conjunction a primitive is, or None when it is not one of the per-axis kind."""
    if isinstance(node, ir.FirstFrame):
        return Term(ANY_QUERY_VIDEO_KEY, frozenset({("f", "below", node.frames)}))
    if isinstance(node, ir.SpatialWindow):
        parts = _near("f", node.frames) | _near("h", node.rows) | _near("w", node.cols)
        return Term(VIDEO_PAIR, frozenset(parts))
    if isinstance(node, ir.TemporalStride):
        parts = _near("h", node.rows) | _near("w", node.cols) | _near("f", node.frames)
        if node.stride > 1:
            parts.add(("f", "stride", node.stride))
        return Term(VIDEO_PAIR, frozenset(parts))
    if isinstance(node, ir.CausalFrames):
        return Term(VIDEO_PAIR, frozenset({("f", "causal", 0)}))
    if isinstance(node, ir.BlockCausal):
        return Term(VIDEO_PAIR, frozenset({("f", "block", node.frames)}))
    if isinstance(node, ir.Text):
        return Term(TEXT_INVOLVED, frozenset())
    if isinstance(node, ir.CubeWindow):
        return Term(
            VIDEO_PAIR,
            frozenset(
                {
                    ("f", "cube", (node.cube_frames, node.frames)),
                    ("h", "cube", (node.cube_rows, node.rows)),
                    ("w", "cube", (node.cube_cols, node.cols)),
                }
            ),
        )
    return None


Polynomial = dict  # Term -> integer coefficient: the mask's indicator as a signed sum


def _add(a: Polynomial, b: Polynomial, sign: int = 1) -> Polynomial:
    out = dict(a)
    for term, coef in b.items():
        out[term] = out.get(term, 0) + sign * coef
    return {t: c for t, c in out.items() if c != 0 and t.classes}


def _times(a: Polynomial, b: Polynomial) -> Polynomial:
    out: Polynomial = {}
    for ta, ca in a.items():
        for tb, cb in b.items():
            t = ta.times(tb)
            out[t] = out.get(t, 0) + ca * cb
    return {t: c for t, c in out.items() if c != 0 and t.classes}


def polynomial(node, sizes: tuple[int, int, int] | None = None) -> Polynomial | None:
    """The mask's indicator as a signed sum of conjunctions; None when a node is not a
    per-axis primitive or the sum grows past MAX_TERMS. With the axis `sizes` (frames,
    height, width), conjunctions whose user-predicate relation on some axis keeps no pair
    are dropped as they appear (see `_prune`)."""
    if isinstance(node, ir.Always):
        return {ONE: 1} if node.value else {}
    if isinstance(node, ir.Predicate):
        return _boolean_polynomial(node.expr, sizes)
    if isinstance(node, ir.Not):
        inner = polynomial(node.child, sizes)
        return None if inner is None else _add({ONE: 1}, inner, -1)
    if isinstance(node, (ir.AnyOf, ir.AllOf)):
        return _combine(
            [polynomial(child, sizes) for child in node.children],
            isinstance(node, ir.AllOf),
            sizes,
        )
    atom = _atom(node)
    return None if atom is None else {atom: 1}


def _combine(parts: list, conjunction: bool, sizes) -> Polynomial | None:
    """The polynomial of an all_of (`conjunction`) or any_of of `parts`."""
    out = None
    for p in parts:
        if p is None:
            return None
        if out is None:
            out = p
        elif conjunction:
            out = _prune(_times(out, p), sizes)
        else:
            out = _prune(_add(_add(out, p), _times(out, p), -1), sizes)
        if len(out) > MAX_TERMS:
            return None
    return out


def applies(mask, layout: TokenLayout) -> bool:
    """True when the mask is per-axis and the geometry's axes are small enough."""
    sizes = _sizes(layout)
    if max(sizes) > MAX_AXIS:
        return False
    poly = polynomial(mask, sizes)
    if poly is None:
        return False
    if any(term.on_axis("p") for term in poly):
        # Each box's places must be one range (rows of a frame, or cols of one row): true in
        # frame-major and temporal-major order, not for the cubes of a tiled one.
        return not layout.is_tiled and _places_fit(poly, sizes)
    return True


def _places_fit(poly: Polynomial, sizes) -> bool:
    """Every place relation can be counted: its frame has at most MAX_PLACES places (one
    table), or it reads only the place difference (`_Differences`, any size)."""
    if sizes[1] * sizes[2] <= MAX_PLACES:
        return True
    return all(
        _place_differences(*factor[1:]) is not None
        for term in poly
        for factor in _factors(term, sizes)
        if factor[0] == "p"
    )


def _sizes(layout: TokenLayout) -> tuple[int, int, int]:
    return (layout.frames, layout.height, layout.width)


# ---------------------------------------------------------------------------------------------
# User predicates that are per-axis.
#
# An `expr` such as NATTEN's clamped neighborhood, max(0, min(h_q - 3, 38)) <= h_k <= ... and
# the same on f and w, is a boolean combination of parts that each read one axis (f_q and f_k,
# or h_q and h_k, or w_q and w_k) or only the token classes (is_text_q, is_text_k). Each such
# part becomes one constraint ("expr", part) whose relation is tabulated over the axis (at
# most MAX_AXIS values) like a built-in's, so the predicate is classified and counted exactly
# by the machinery above, at any sequence length. A part reading two axes, or i_q / i_k,
# returns None (the row sets bound it instead).

_AXIS_SYMBOLS = {axis: frozenset({f"{axis}_q", f"{axis}_k"}) for axis in AXES}
# A part reading rows and columns together (a window over the flattened place h * W + w, as
# Radial Attention's) constrains the "p" axis: its relation is tabulated over the places of a
# frame (at most MAX_PLACES), and a term with one counts rows and columns as one factor.
_AXIS_SYMBOLS["p"] = _AXIS_SYMBOLS["h"] | _AXIS_SYMBOLS["w"]
_CLASS_SYMBOLS = frozenset({"is_text_q", "is_text_k"})


def _boolean_polynomial(e, sizes) -> Polynomial | None:
    if e is sympy.true:
        return {ONE: 1}
    if e is sympy.false:
        return {}
    names = frozenset(s.name for s in e.free_symbols)
    if names and names <= _CLASS_SYMBOLS:
        return _class_polynomial(e)
    axis = _group_of(e)
    if axis is not None:
        return {Term(ALL_PAIRS, frozenset({(axis, "expr", e)})): 1}
    if isinstance(e, sympy.Not):
        inner = _boolean_polynomial(e.args[0], sizes)
        return None if inner is None else _add({ONE: 1}, inner, -1)
    if isinstance(e, (sympy.And, sympy.Or)):
        # One sub-polynomial per argument, the arguments of one axis (or of one place
        # relation) first joined into one relation: fewer, larger constraints (a chain on h
        # is one table, not two).
        groups: dict = {}
        for arg in e.args:
            groups.setdefault(_group_of(arg) or arg, []).append(arg)
        parts = [
            {Term(ALL_PAIRS, frozenset({(key, "expr", e.func(*args))})): 1}
            if isinstance(key, str)
            else _boolean_polynomial(key, sizes)
            for key, args in groups.items()
        ]
        return _combine(parts, isinstance(e, sympy.And), sizes)
    return None  # a relation reading f with h or w, or i_q / i_k


def _group_of(e) -> str | None:
    """The one axis a part reads (f, h or w), "p" for a relation (not an and / or / not,
    which can still split by axis) reading rows and columns together, else None."""
    names = frozenset(s.name for s in e.free_symbols)
    if not names:
        return None
    for axis in AXES:
        if names <= _AXIS_SYMBOLS[axis]:
            return axis
    if names <= _AXIS_SYMBOLS["p"] and not isinstance(e, (sympy.And, sympy.Or, sympy.Not)):
        return "p"
    return None


def _class_polynomial(e) -> Polynomial:
    """A part reading only is_text_q / is_text_k: the class pairs it keeps."""
    query_text = np.array([0, 0, 1, 1], bool)
    key_text = np.array([0, 1, 0, 1], bool)
    zeros = np.zeros(4, np.int64)
    keep = np.broadcast_to(
        ir.evaluate_sympy(
            e,
            Coordinates(zeros, zeros, zeros, zeros, query_text),
            Coordinates(zeros, zeros, zeros, zeros, key_text),
        ),
        (4,),
    )
    classes = sum(1 << bit for bit in range(4) if keep[bit])
    return {Term(classes, frozenset()): 1} if classes else {}


def _prune(poly: Polynomial, sizes) -> Polynomial:
    """Drop the conjunctions whose relation on an axis with a user-predicate constraint keeps
    no pair (disjoint frame-distance bands of a union, for example): exact, and it keeps a
    union of n disjoint conjunctions at n terms instead of 2^n - 1."""
    if sizes is None:
        return poly
    if not _places_fit(poly, sizes):
        return poly  # too many places to tabulate: `applies` refuses the mask anyway
    out = {}
    for term, coef in poly.items():
        empty = False
        for factor in _factors(term, sizes):
            if any(c[0] == "expr" for c in _factor_constraints(factor)):
                empty = empty or _factor_table(factor).total == 0
        if not empty:
            out[term] = coef
    return out


# A factor of a term's pair count: ("f" | "h" | "w", constraints, n) for one axis, or
# ("p", h constraints, w constraints, p constraints, height, width) for rows and columns
# together when the term has a place constraint.


def _factors(term: Term, sizes) -> list[tuple]:
    frames, height, width = sizes
    out = [("f", term.on_axis("f"), frames)]
    if term.on_axis("p"):
        out.append(("p", term.on_axis("h"), term.on_axis("w"), term.on_axis("p"), height, width))
    else:
        out += [("h", term.on_axis("h"), height), ("w", term.on_axis("w"), width)]
    return out


def _factor_constraints(factor: tuple) -> frozenset:
    return factor[1] | factor[2] | factor[3] if factor[0] == "p" else factor[1]


def _factor_size(factor: tuple) -> int:
    return factor[4] * factor[5] if factor[0] == "p" else factor[2]


def _factor_table(factor: tuple) -> "_Table | _Differences":
    """How the factor's pairs are counted: its prefix-sum table, or for a place relation of
    the place difference only, its `_Differences` (no [places, places] table); both answer
    `count`, `total` and `reach`."""
    if factor[0] == "p":
        differences = _place_differences(*factor[1:])
        if differences is not None:
            return differences
        return _Table(_factor_size(factor), _place_prefix(*factor[1:]))
    return _Table(factor[2], _prefix(factor[1], factor[2]))


def _factor_ranges(factor: tuple, lo: dict, hi: dict):
    """(lo, hi) of each box on the factor: its axis range, or its place range (one range per
    box: see `applies`)."""
    if factor[0] != "p":
        return lo[factor[0]], hi[factor[0]]
    width = factor[5]
    return lo["h"] * width + lo["w"], hi["h"] * width + hi["w"]


# ---------------------------------------------------------------------------------------------
# Per-axis relations and their prefix sums.


def _relation(constraints: frozenset, n: int) -> np.ndarray:
    """bool [n, n]: rel[x_q, x_k] for a set of (kind, parameter) constraints on one axis."""
    q = np.arange(n, dtype=np.int64)[:, None]
    k = np.arange(n, dtype=np.int64)[None, :]
    rel = np.ones((n, n), bool)
    for kind, p in constraints:
        if kind == "near":
            rel &= np.abs(q - k) <= p
        elif kind == "below":
            rel &= k < p
        elif kind == "causal":
            rel &= k <= q
        elif kind == "block":
            rel &= k // p <= q // p
        elif kind == "stride":
            rel &= (q - k) % p == 0
        elif kind == "cube":  # p = (cube size, radius in cubes)
            rel &= np.abs(q // p[0] - k // p[0]) <= p[1]
        elif kind == "expr":  # a user predicate's part that reads this axis only
            rel &= _tabulated(p, n)
        else:  # pragma: no cover - _atom emits only the kinds above
            raise ValueError(kind)
    return rel


def _tabulated(e, n: int, width: int = 1) -> np.ndarray:
    """bool [n, n]: a per-axis part of a user predicate at every (x_q, x_k) of its axis
    (the other coordinates 0, as no symbol of theirs appears in it); for a place part, every
    pair of places h * width + w."""
    zeros = np.zeros(1, np.int64)
    names = {x.name for x in e.free_symbols}
    axis = next(a for a, s in _AXIS_SYMBOLS.items() if names <= s)

    def side(v):
        if axis == "p":
            return Coordinates(zeros, v // width, v % width, zeros, np.zeros(1, bool))
        coords = [zeros, zeros, zeros]
        coords[AXES.index(axis)] = v
        return Coordinates(*coords, zeros, np.zeros(1, bool))

    out = np.empty((n, n), bool)
    keys = side(np.arange(n, dtype=np.int64)[None, :])
    for start in range(0, n, PLACE_ROWS):  # a few MB of temporaries per node at a time
        rows = np.arange(start, min(start + PLACE_ROWS, n), dtype=np.int64)[:, None]
        kept = ir.evaluate_sympy(e, side(rows), keys)
        out[start : start + rows.size] = np.broadcast_to(np.asarray(kept, bool), (rows.size, n))
    return out


# Query values tabulated per pass (a place table is up to 4096 x 4096).
PLACE_ROWS = 256


# ---------------------------------------------------------------------------------------------
# Place relations of the place difference only (Radial Attention's window): counted from a
# table of differences, so they need no [places, places] table at any frame size.


@dataclasses.dataclass(frozen=True)
class _Differences:
    """A relation rel[x_q, x_k] = g(x_q - x_k) on n values: pairs in a rectangle from two
    prefix sums over the differences, O(1) each (see `count`)."""

    n: int
    # twice[t + n + 1] = GG(t) = sum of G(u) for u <= t, t in [-n - 1, n - 1], where G(u) is
    # the sum of g(delta) for delta <= u (int64).
    twice: np.ndarray
    # The least and greatest difference g keeps (None when it keeps none): `reach`.
    kept_from: int | None
    kept_to: int | None

    @classmethod
    def of(cls, kept: np.ndarray) -> "_Differences":
        """From g as bool [2n - 1], g(delta) at index delta + n - 1."""
        n = (kept.size + 1) // 2
        ones = np.concatenate([[0, 0], np.cumsum(kept, dtype=np.int64)])  # G, t = -n - 1 ..
        deltas = np.flatnonzero(kept) - (n - 1)
        if deltas.size == 0:
            return cls(n, np.cumsum(ones), None, None)
        return cls(n, np.cumsum(ones), int(deltas.min()), int(deltas.max()))

    def _gg(self, t):
        return self.twice[np.asarray(t) + self.n + 1]

    def count(self, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
        """Pairs x_q in [q_lo, q_hi], x_k in [k_lo, k_hi] with g(x_q - x_k): the sum over x_q
        of G(x_q - k_lo) - G(x_q - k_hi - 1), each sum of G a difference of GG."""
        return (
            self._gg(q_hi - k_lo)
            - self._gg(q_lo - k_lo - 1)
            - self._gg(q_hi - k_hi - 1)
            + self._gg(q_lo - k_hi - 2)
        )

    @property
    def total(self) -> int:
        return int(self.count(0, self.n - 1, 0, self.n - 1))

    def reach(self, lo, hi):
        """A superset of the keys some query in [lo, hi] keeps: [lo - max d, hi - min d]."""
        if self.kept_from is None:
            return np.full(np.shape(lo), self.n), np.full(np.shape(lo), -1)
        return np.maximum(lo - self.kept_to, 0), np.minimum(hi - self.kept_from, self.n - 1)


@dataclasses.dataclass(frozen=True)
class _Table:
    """A relation on n values through its prefix sums (`_prefix_of`): the same questions as
    `_Differences`, from the [n + 1, n + 1] table."""

    n: int
    prefix: np.ndarray  # int32 [(n + 1) * (n + 1)], flat

    def count(self, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
        return _rect(self.prefix, self.n, q_lo, q_hi, k_lo, k_hi)

    @property
    def total(self) -> int:
        return int(self.prefix[-1])

    def reach(self, lo: np.ndarray, hi: np.ndarray):
        """Per query range [lo, hi]: the first and last key value some query in it keeps
        (first > last when none)."""
        n = self.n
        PRODUCT_WORK.charge(lo.size * n)  # a [boxes, n] array per term and axis
        table = self.prefix.reshape(n + 1, n + 1)
        # reach[b, x_k] = number of x_q in [lo, hi] related to x_k, from column differences.
        column = table[:, 1:] - table[:, :-1]
        reach = column[hi + 1] - column[lo]
        some = reach > 0
        first = np.where(some.any(axis=1), np.argmax(some, axis=1), n)
        last = np.where(some.any(axis=1), n - 1 - np.argmax(some[:, ::-1], axis=1), -1)
        return first, last


_DIFFERENCE = sympy.Symbol("place_difference", integer=True)


def _expanded(e):
    """A predicate with both sides of each comparison expanded (sums collected)."""
    return e.replace(
        lambda x: isinstance(x, sympy.core.relational.Relational),
        lambda r: r.func(sympy.expand(r.lhs), sympy.expand(r.rhs)),
    )


@functools.lru_cache(maxsize=32)
def _place_differences(h_constraints, w_constraints, p_constraints, height: int, width: int):
    """The `_Differences` of a term's place relation when it reads only the place difference
    width * (h_q - h_k) + w_q - w_k (sympy proves it: with w_q written through that
    difference, no coordinate is left), and has no row or column constraint; else None."""
    if h_constraints or w_constraints:
        return None
    w_q = _DIFFERENCE + SYMBOLS["w_k"] - width * SYMBOLS["h_q"] + width * SYMBOLS["h_k"]
    for _, e in p_constraints:
        if _expanded(e.subs(SYMBOLS["w_q"], w_q)).free_symbols - {_DIFFERENCE}:
            return None
    n = height * width
    delta = np.arange(-(n - 1), n, dtype=np.int64)
    # Any pair of places at each difference: q at delta, k at 0 (or q at 0, k at -delta).
    q_place, k_place = np.maximum(delta, 0), np.maximum(-delta, 0)
    zeros = np.zeros(delta.size, np.int64)
    q = Coordinates(zeros, q_place // width, q_place % width, zeros, zeros > 0)
    k = Coordinates(zeros, k_place // width, k_place % width, zeros, zeros > 0)
    kept = np.ones(delta.size, bool)
    for _, e in p_constraints:
        kept &= np.broadcast_to(np.asarray(ir.evaluate_sympy(e, q, k), bool), delta.shape)
    return _Differences.of(kept)


@functools.lru_cache(maxsize=8)
def _place_prefix(h_constraints, w_constraints, p_constraints, height: int, width: int):
    """The prefix sum (see `_prefix`) of a term's relation on places h * width + w: its row
    and column constraints lifted to places, and its place parts."""
    n = height * width
    place = np.arange(n)
    rel = np.ones((n, n), bool)
    for _, e in p_constraints:
        rel &= _tabulated(e, n, width)
    if h_constraints or w_constraints:
        rows = _relation(h_constraints, height)
        cols = _relation(w_constraints, width)
        for start in range(0, n, PLACE_ROWS):
            q = place[start : start + PLACE_ROWS, None]
            lifted = rows[q // width, place // width] & cols[q % width, place % width]
            rel[start : start + q.size] &= lifted
    return _prefix_of(rel)


def _prefix_of(rel: np.ndarray) -> np.ndarray:
    """int32 [(n + 1) * (n + 1)], flat: P[i, j] = pairs of `rel` [n, n] with x_q < i and
    x_k < j. Summed in place in one contiguous array (5x faster than two cumsums into new
    arrays at 3,600 places)."""
    n = rel.shape[0]
    counts = rel.astype(np.int32)
    counts.cumsum(axis=1, out=counts)
    counts.cumsum(axis=0, out=counts)
    table = np.zeros((n + 1, n + 1), np.int32)
    table[1:, 1:] = counts
    return table.ravel()


@functools.lru_cache(maxsize=32)
def _prefix(constraints: frozenset, n: int) -> np.ndarray:
    """int32 [(n + 1) * (n + 1)], flat: P[i, j] = pairs x_q < i, x_k < j in the relation."""
    return _prefix_of(_relation(constraints, n))


def _rect(table: np.ndarray, n: int, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
    """Pairs of the relation in [q_lo, q_hi] x [k_lo, k_hi] (inclusive ranges, arrays)."""
    w = n + 1
    q0, q1, k0, k1 = q_lo * w, (q_hi + 1) * w, k_lo, k_hi + 1
    return table[q1 + k1].astype(np.int64) - table[q0 + k1] - table[q1 + k0] + table[q0 + k0]


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
    return _factor_table(factor).reach(lo, hi)


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
    for factor in _factors(term, _sizes(layout)):
        first, last = _axis_hull(factor, *_factor_ranges(factor, lo, hi))
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


def _expand(owner, first, last):
    """(owner repeated, value) for every value in [first, last] of each owner."""
    counts = np.maximum(last - first + 1, 0)
    index = np.repeat(np.arange(counts.size), counts)
    return owner[index], first[index] + ragged_arange(counts), index


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
    owner, frame, i = _expand(sel[each], f0[each], f1[each])
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
    owner, h, i = _expand(sel, h0, h_last)
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
    owner, gf, i = _expand(sel, f0 // a, f1 // a)
    owner, gh, j = _expand(owner, h0[i] // b, h1[i] // b)
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
        flat = _expand(np.zeros(starts.size, np.int64), starts, ends - 1)[1]
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
        for factor in _factors(term, _sizes(layout)):
            if factor not in axis_counts:
                axis_counts[factor] = _factor_counts(
                    factor, *_factor_ranges(factor, q_lo, q_hi), *_factor_ranges(factor, k_lo, k_hi)
                )
            count *= axis_counts[factor]
        total += count
    starts = np.concatenate([[0], np.cumsum(combos)[:-1]])
    return np.add.reduceat(total, starts) if total.size else np.zeros(0, np.int64)


def _factor_counts(factor: tuple, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
    """Pairs of one factor's relation in each [q_lo, q_hi] x [k_lo, k_hi]."""
    if not _factor_constraints(factor):  # every pair
        return (q_hi - q_lo + 1) * (k_hi - k_lo + 1)
    return _factor_table(factor).count(q_lo, q_hi, k_lo, k_hi)


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
    poly = polynomial(mask, _sizes(layout))
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
    poly = polynomial(mask, _sizes(layout))
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
            for factor in _factors(term, _sizes(layout)):
                point = np.arange(_factor_size(factor), dtype=np.int64)  # every query value
                per_value = _factor_counts(factor, point, point, *_factor_ranges(factor, lo, hi))
                count *= per_value[x[factor[0]]]
            total += count
    return total
