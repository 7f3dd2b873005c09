"""A per-axis mask as a signed sum of conjunctions (`polynomial`), and the factors that count
each conjunction's pairs.

A conjunction (`Term`) restricts a (query, key) pair in two ways only: which token classes
may meet (text / video, for the query and for the key), and, per axis, a relation between the
query's and the key's value on that axis alone (svgen.analysis.axis_relations). A mask
combining them is a signed sum (inclusion-exclusion: 1[A or B] = 1[A] + 1[B] - 1[A]1[B],
1[not A] = 1 - 1[A]); svgen.analysis.product counts it over tiles.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from svgen import ir
from svgen.analysis.axis_relations import (
    AXES,
    AXIS_SYMBOLS,
    Differences,
    Table,
    place_differences,
    place_prefix,
    prefix_sums,
)
from svgen.core.layout import Coordinates, TokenLayout

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


# The token classes a node's axis_term names (svgen.ir.NodeFacts.axis_term).
_CLASSES = {
    "video_pair": VIDEO_PAIR,
    "any_query_video_key": ANY_QUERY_VIDEO_KEY,
    "text_involved": TEXT_INVOLVED,
}


def _atom(node) -> Term | None:
    """The conjunction a primitive is (its axis_term), or None when it is not one of the
    per-axis kind."""
    term = node.axis_term()
    return None if term is None else Term(_CLASSES[term[0]], term[1])


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
    sizes = axis_sizes(layout)
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
    table), or it reads only the place difference (`Differences`, any size)."""
    if sizes[1] * sizes[2] <= MAX_PLACES:
        return True
    return all(
        place_differences(*factor[1:]) is not None
        for term in poly
        for factor in factors(term, sizes)
        if factor[0] == "p"
    )


def axis_sizes(layout: TokenLayout) -> tuple[int, int, int]:
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
        if names <= AXIS_SYMBOLS[axis]:
            return axis
    if names <= AXIS_SYMBOLS["p"] and not isinstance(e, (sympy.And, sympy.Or, sympy.Not)):
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
        for factor in factors(term, sizes):
            if any(c[0] == "expr" for c in factor_constraints(factor)):
                empty = empty or factor_table(factor).total == 0
        if not empty:
            out[term] = coef
    return out


# A factor of a term's pair count: ("f" | "h" | "w", constraints, n) for one axis, or
# ("p", h constraints, w constraints, p constraints, height, width) for rows and columns
# together when the term has a place constraint.


def factors(term: Term, sizes) -> list[tuple]:
    frames, height, width = sizes
    out = [("f", term.on_axis("f"), frames)]
    if term.on_axis("p"):
        out.append(("p", term.on_axis("h"), term.on_axis("w"), term.on_axis("p"), height, width))
    else:
        out += [("h", term.on_axis("h"), height), ("w", term.on_axis("w"), width)]
    return out


def factor_constraints(factor: tuple) -> frozenset:
    return factor[1] | factor[2] | factor[3] if factor[0] == "p" else factor[1]


def factor_size(factor: tuple) -> int:
    return factor[4] * factor[5] if factor[0] == "p" else factor[2]


def factor_table(factor: tuple) -> "Table | Differences":
    """How the factor's pairs are counted: its prefix-sum table, or for a place relation of
    the place difference only, its `Differences` (no [places, places] table); both answer
    `count`, `total` and `reach`."""
    if factor[0] == "p":
        differences = place_differences(*factor[1:])
        if differences is not None:
            return differences
        return Table(factor_size(factor), place_prefix(*factor[1:]))
    return Table(factor[2], prefix_sums(factor[1], factor[2]))


def factor_ranges(factor: tuple, lo: dict, hi: dict):
    """(lo, hi) of each box on the factor: its axis range, or its place range (one range per
    box: see `applies`)."""
    if factor[0] != "p":
        return lo[factor[0]], hi[factor[0]]
    width = factor[5]
    return lo["h"] * width + lo["w"], hi["h"] * width + hi["w"]
