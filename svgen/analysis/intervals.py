"""Sets of half-open integer intervals, vectorized with NumPy.

The analysis represents "which keys may query row r attend" as a union of intervals of key
positions. Rows of a chunk are laid end to end on one line, row r occupying
[r * stride, r * stride + seq_len) with stride = seq_len + 1, so a batch of per-row sets is
a single interval set and union / intersection / complement of per-row sets are plain 1-D
interval operations (the gap of one position keeps rows from ever merging).

Invariant of `IntervalSet`: starts sorted, every interval non-empty, and no two intervals
overlap or touch (end < next start). All operations keep it.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class IntervalSet:
    starts: np.ndarray  # int64 [n]
    ends: np.ndarray  # int64 [n], exclusive

    @classmethod
    def empty(cls) -> "IntervalSet":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def normalized(cls, starts, ends) -> "IntervalSet":
        """The union of arbitrary intervals [starts[i], ends[i]) (empty ones dropped)."""
        starts = np.asarray(starts, np.int64).ravel()
        ends = np.asarray(ends, np.int64).ravel()
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if starts.size == 0:
            return cls.empty()
        if np.any(starts[1:] < starts[:-1]):  # builders usually emit sorted starts
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        # A new merged interval begins where a start lies beyond everything before it
        # (strictly: touching intervals merge).
        begins = np.ones(starts.size, bool)
        begins[1:] = starts[1:] > reach[:-1]
        first = np.flatnonzero(begins)
        last = np.append(first[1:], starts.size) - 1
        return cls(starts[first], reach[last])

    def __len__(self) -> int:
        return int(self.starts.size)

    def total_length(self) -> int:
        return int((self.ends - self.starts).sum())

    def union(self, other: "IntervalSet") -> "IntervalSet":
        return IntervalSet.normalized(
            np.concatenate([self.starts, other.starts]), np.concatenate([self.ends, other.ends])
        )

    def intersection(self, other: "IntervalSet") -> "IntervalSet":
        a, b = self, other
        if len(a) == 0 or len(b) == 0:
            return IntervalSet.empty()
        # For each interval of a, the intervals of b it overlaps form a contiguous index range.
        lo = np.searchsorted(b.ends, a.starts, side="right")
        hi = np.searchsorted(b.starts, a.ends, side="left")
        counts = np.maximum(hi - lo, 0)
        a_idx = np.repeat(np.arange(len(a)), counts)
        b_idx = np.repeat(lo, counts) + ragged_arange(counts)
        starts = np.maximum(a.starts[a_idx], b.starts[b_idx])
        ends = np.minimum(a.ends[a_idx], b.ends[b_idx])
        keep = ends > starts
        # Pieces come out sorted, disjoint and non-touching (they lie inside disjoint,
        # non-touching intervals of both operands).
        return IntervalSet(starts[keep], ends[keep])

    def complement_within(self, universe: "IntervalSet") -> "IntervalSet":
        """universe minus self."""
        if len(self) == 0:
            return universe
        lo = np.iinfo(np.int64).min
        hi = np.iinfo(np.int64).max
        gaps = IntervalSet(np.concatenate([[lo], self.ends]), np.concatenate([self.starts, [hi]]))
        gaps = IntervalSet(gaps.starts[gaps.ends > gaps.starts], gaps.ends[gaps.ends > gaps.starts])
        return universe.intersection(gaps)


def ragged_arange(counts: np.ndarray) -> np.ndarray:
    """concatenate([arange(c) for c in counts]) without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(offsets, counts)


def repeat_each(counts: np.ndarray, work=None) -> tuple[np.ndarray, np.ndarray]:
    """(parent, index) pairs: parent i repeated counts[i] times (negative counts as 0), index
    0..counts[i]-1. `work` (a svgen.spec.limits.Work), when given, is charged the pairs made:
    where a hostile window could inflate them, the budget stops it before memory does."""
    counts = np.maximum(counts, 0)
    if work is not None:
        work.charge(counts.sum())
    return np.repeat(np.arange(counts.size), counts), ragged_arange(counts)


def expand_ranges(owner, first, last, work=None):
    """(owner repeated, value, position in owner) for every value in [first, last] of each
    owner (empty ranges give nothing); `work` as in repeat_each."""
    index, within = repeat_each(last - first + 1, work)
    return owner[index], first[index] + within, index
