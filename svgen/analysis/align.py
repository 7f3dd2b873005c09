"""`tiling.align`: the mask rounded to whole compute blocks, and what that costs in pairs.

A BOUNDARY compute block costs its mask: VALU work on every score and extra vector stores,
1.2-1.4x a FULL block (see docs/measured.md). Rounding each one to FULL or EMPTY removes that cost and
changes the mask; users of sparse video attention accept approximate masks, but should know
exactly what changed. The modes:

    superset  every BOUNDARY block becomes FULL (attends pairs the mask drops);
    subset    every BOUNDARY block becomes EMPTY;
    nearest   FULL when the block keeps at least half of its real pairs, else EMPTY;
    balanced  blocks are promoted to FULL in decreasing order of kept fraction (ties in
              (q block, kv block) order), as many as bring the aligned mask's kept-pair count
              closest to the exact one (of two equally close counts, the smaller: fewer
              blocks to run); the rest become EMPTY.

Every block is aligned, the column holding padding keys (when the sequence does not fill
its last compute block column) included: the kernel runs that column's FULL blocks through
its masked path, which tests `k < seq_len`, and an aligned pattern's mask there is `True`, so
padding is never attended and an aligned kernel decodes no coordinates at all.

Everything comes from `PairCounts` (interval counting in the classification), never from an
N x N array: the pair budget is exact.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.analysis.classify import Classification, PairCounts, TileGrid
from svgen.core.kinds import TileKind
from svgen.spec import ALIGN_MODES

__all__ = ["ALIGN_MODES", "PairBudget", "align_classification", "promoted_blocks"]


@dataclasses.dataclass(frozen=True)
class PairBudget:
    """What aligning did to one pattern's mask, in real (query, key) pairs, exactly."""

    mode: str
    total_pairs: int  # seq_len ** 2
    exact_pairs: int  # kept by the mask as written
    aligned_pairs: int  # kept by the aligned mask
    pairs_added: int  # kept by the aligned mask only
    pairs_dropped: int  # kept by the exact mask only
    rows_emptied: int  # query rows with keys under the exact mask and none aligned

    @property
    def exact_density(self) -> float:
        return self.exact_pairs / self.total_pairs

    @property
    def density(self) -> float:
        return self.aligned_pairs / self.total_pairs

    @property
    def recall(self) -> float:
        """Exact pairs the aligned mask keeps, as a fraction of the exact pairs (1 when the
        mask keeps none: nothing was lost)."""
        kept = self.exact_pairs - self.pairs_dropped
        return kept / self.exact_pairs if self.exact_pairs else 1.0

    @property
    def precision(self) -> float:
        """Exact pairs among the aligned mask's pairs (1 when it keeps none)."""
        kept = self.exact_pairs - self.pairs_dropped
        return kept / self.aligned_pairs if self.aligned_pairs else 1.0

    def to_json(self) -> dict:
        """The keys `svgen inspect --json` reports for an aligned pattern."""
        return {
            "exact_density": self.exact_density,
            "density": self.density,
            "pairs_added": self.pairs_added,
            "pairs_dropped": self.pairs_dropped,
            "recall": self.recall,
            "precision": self.precision,
            "rows_emptied": self.rows_emptied,
        }

    def words(self) -> str:
        """One line for the compile summary and the generated docstring."""
        return (
            f"{self.mode}: density {self.density:.6f} (exact {self.exact_density:.6f}), "
            f"{self.pairs_added:,} pairs added, {self.pairs_dropped:,} dropped, recall "
            f"{self.recall:.4f}, precision {self.precision:.4f}, {self.rows_emptied:,} "
            f"rows emptied"
        )


def align_classification(
    c: Classification, mode: str, grid: TileGrid
) -> tuple[Classification, PairBudget]:
    """The aligned classification (its kept pairs are the aligned mask's) and its budget.

    `c` must come from classify_tiles(..., count_pairs=True) on `grid` (the compute grid)
    and be exact."""
    if mode not in ALIGN_MODES or mode == "exact":
        raise ValueError(f"not an align mode: {mode!r}")
    if c.pairs is None:
        raise ValueError("aligning needs exact pair counts (classify_tiles(count_pairs=True))")
    p = c.pairs
    nk = grid.num_kv_blocks
    q, kv = p.boundary_index // nk, p.boundary_index % nk
    real = grid.real_pairs(q, kv)
    promote = promoted_blocks(
        mode, p.boundary_pairs, real, c.kept_pairs - int(p.boundary_pairs.sum()), c.kept_pairs
    )
    kinds = c.kinds.copy()
    kinds[q[promote], kv[promote]] = TileKind.FULL
    kinds[q[~promote], kv[~promote]] = TileKind.EMPTY
    added = int((real[promote] - p.boundary_pairs[promote]).sum())
    dropped = int(p.boundary_pairs[~promote].sum())
    aligned = c.kept_pairs + added - dropped
    budget = PairBudget(
        mode, grid.seq_len**2, c.kept_pairs, aligned, added, dropped, _rows_emptied(kinds, p)
    )
    return Classification(kinds, aligned, aligned, 0), budget


def promoted_blocks(
    mode: str, kept: np.ndarray, real: np.ndarray, base: int, target: int
) -> np.ndarray:
    """Which BOUNDARY blocks become FULL (the rest EMPTY), given each block's kept and real
    pairs; `base` is the pairs kept outside these blocks, `target` the exact mask's count."""
    if mode == "superset":
        return np.ones(kept.size, bool)
    if mode == "subset":
        return np.zeros(kept.size, bool)
    if mode == "nearest":
        return 2 * kept >= real
    assert mode == "balanced", mode
    order = balanced_order(kept, real)
    # counts[m]: the aligned mask's pairs with the first m blocks of `order` promoted.
    counts = base + np.concatenate([[0], np.cumsum(real[order])])
    best = int(np.argmin(np.abs(counts - target)))  # the first of equals: the smaller count
    promote = np.zeros(kept.size, bool)
    promote[order[:best]] = True
    return promote


def balanced_order(kept: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Blocks by decreasing kept fraction, ties in their given ((q, kv) row-major) order.

    kept / real as floats: division is correctly rounded, so equal fractions give equal floats,
    and distinct ones (denominators under 2^25) differ by more than a rounding step."""
    fraction = kept / np.maximum(real, 1)
    return np.lexsort((np.arange(kept.size), -fraction))


def _rows_emptied(kinds: np.ndarray, p: PairCounts) -> int:
    """Rows that had keys and have none now: those of the q blocks left without a FULL one."""
    has_full = np.any(kinds == TileKind.FULL, axis=1)
    return int(p.rows_with_keys[~has_full].sum())
