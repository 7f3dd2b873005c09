"""Per-axis relations of a (query, key) pair and how their pairs are counted.

A per-axis constraint (svgen.analysis.axis_terms) relates the query's and the key's value on
one axis (frame, row or column), or on the place h * width + w of a frame. Its relation is
tabulated once over the axis (at most a few thousand values) into a 2-D prefix sum (`Table`),
so the pairs it keeps in any rectangle of query values x key values come out in O(1); a place
relation that reads only the place difference is counted from prefix sums over the
differences (`Differences`), with no [places, places] table at any frame size.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import sympy

from svgen import ir
from svgen.spec.expr import SYMBOLS
from svgen.spec.limits import PRODUCT_WORK
from svgen.core.layout import Coordinates

AXES = ("f", "h", "w")
# The coordinates each axis's relation may read (a user predicate's part on that axis).
AXIS_SYMBOLS = {axis: frozenset({f"{axis}_q", f"{axis}_k"}) for axis in AXES}
# A part reading rows and columns together (a window over the flattened place h * W + w, as
# Radial Attention's) constrains the "p" axis: its relation is tabulated over the places of a
# frame (at most MAX_PLACES), and a term with one counts rows and columns as one factor.
AXIS_SYMBOLS["p"] = AXIS_SYMBOLS["h"] | AXIS_SYMBOLS["w"]


# ---------------------------------------------------------------------------------------------
# Per-axis relations and their prefix sums.


def relation(constraints: frozenset, n: int) -> np.ndarray:
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
            rel &= tabulated(p, n)
        else:  # pragma: no cover - _atom emits only the kinds above
            raise ValueError(kind)
    return rel


def tabulated(e, n: int, width: int = 1) -> np.ndarray:
    """bool [n, n]: a per-axis part of a user predicate at every (x_q, x_k) of its axis
    (the other coordinates 0, as no symbol of theirs appears in it); for a place part, every
    pair of places h * width + w."""
    zeros = np.zeros(1, np.int64)
    names = {x.name for x in e.free_symbols}
    axis = next(a for a, s in AXIS_SYMBOLS.items() if names <= s)

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
class Differences:
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
    def of(cls, kept: np.ndarray) -> "Differences":
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
class Table:
    """A relation on n values through its prefix sums (`prefix_of`): the same questions as
    `Differences`, from the [n + 1, n + 1] table."""

    n: int
    prefix: np.ndarray  # int32 [(n + 1) * (n + 1)], flat

    def count(self, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
        return rect_pairs(self.prefix, self.n, q_lo, q_hi, k_lo, k_hi)

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
def place_differences(h_constraints, w_constraints, p_constraints, height: int, width: int):
    """The `Differences` of a term's place relation when it reads only the place difference
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
    return Differences.of(kept)


@functools.lru_cache(maxsize=8)
def place_prefix(h_constraints, w_constraints, p_constraints, height: int, width: int):
    """The prefix sum (see `prefix_sums`) of a term's relation on places h * width + w: its row
    and column constraints lifted to places, and its place parts."""
    n = height * width
    place = np.arange(n)
    rel = np.ones((n, n), bool)
    for _, e in p_constraints:
        rel &= tabulated(e, n, width)
    if h_constraints or w_constraints:
        rows = relation(h_constraints, height)
        cols = relation(w_constraints, width)
        for start in range(0, n, PLACE_ROWS):
            q = place[start : start + PLACE_ROWS, None]
            lifted = rows[q // width, place // width] & cols[q % width, place % width]
            rel[start : start + q.size] &= lifted
    return prefix_of(rel)


def prefix_of(rel: np.ndarray) -> np.ndarray:
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
def prefix_sums(constraints: frozenset, n: int) -> np.ndarray:
    """int32 [(n + 1) * (n + 1)], flat: P[i, j] = pairs x_q < i, x_k < j in the relation."""
    return prefix_of(relation(constraints, n))


def rect_pairs(table: np.ndarray, n: int, q_lo, q_hi, k_lo, k_hi) -> np.ndarray:
    """Pairs of the relation in [q_lo, q_hi] x [k_lo, k_hi] (inclusive ranges, arrays)."""
    w = n + 1
    q0, q1, k0, k1 = q_lo * w, (q_hi + 1) * w, k_lo, k_hi + 1
    return table[q1 + k1].astype(np.int64) - table[q0 + k1] - table[q1 + k0] + table[q0 + k0]
