"""Block tables for the kernel: the visited tiles of each q tile, as runs and as SMEM pieces.

The kernel walks the visited tiles q tile by q tile (see `svgen.runtime.kernel`). Two
adjustments turn tile kinds into kernel kinds:
  * a FULL tile in the last kv tile, when the sequence does not fill it, runs as BOUNDARY:
    its padding keys must be masked out (the boundary mask always drops keys >= seq_len);
  * a q tile with no visited tile gets one EMPTY step, which only writes its zero output.
    It names the previous step's kv tile, so the pipeline fetches nothing new for it.
The generated module stores runs (q_block, kv_start, length, kind) of consecutive kv tiles of
one kind, which are short and readable. The kernel's scalar prefetch holds them cut into
pieces of at most `slots` tiles: the smallest `slots` (a power of two) whose table fits the
SMEM budget, so tables stay one entry per visited tile unless that would not fit.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.analysis.classify import TileGrid
from svgen.runtime.kernel import PieceTables
from svgen.runtime.kinds import TileKind

DEFAULT_SMEM_BUDGET = 1 << 20  # bytes: the SMEM of one TPU v6e TensorCore
MAX_SLOTS = 256


class TableBudgetError(Exception):
    """No piece size fits the SMEM budget; `smallest` is the best tables found."""

    def __init__(self, smallest: PieceTables):
        super().__init__("tables over the SMEM budget")
        self.smallest = smallest


@dataclasses.dataclass(frozen=True)
class BlockTable:
    """One pattern's visited tiles, as the generated module stores them."""

    runs: np.ndarray  # int64 [num_runs, 4]: q_block, kv_start, length, kernel kind

    @property
    def visited_steps(self) -> int:
        """Grid steps that do work: visited tiles plus one per q tile with none."""
        return int(self.runs[:, 2].sum())


def kernel_kinds(kinds: np.ndarray, grid: TileGrid) -> np.ndarray:
    out = kinds.copy()
    if grid.seq_len % grid.block_kv:
        last = out[:, -1]
        last[last == TileKind.FULL] = TileKind.BOUNDARY
    return out


def build_runs(kinds: np.ndarray, grid: TileGrid) -> np.ndarray:
    kinds = kernel_kinds(kinds, grid)
    q_block, kv_block = np.nonzero(kinds != TileKind.EMPTY)  # row-major: the kernel's order
    kind = kinds[q_block, kv_block].astype(np.int64)
    new_run = np.ones(q_block.size, bool)
    new_run[1:] = ((q_block[1:] != q_block[:-1]) | (kv_block[1:] != kv_block[:-1] + 1)
                   | (kind[1:] != kind[:-1]))
    first = np.flatnonzero(new_run)
    lengths = np.diff(np.append(first, q_block.size))
    runs = np.stack([q_block[first], kv_block[first], lengths, kind[first]], axis=1)
    return _add_zero_fill_runs(runs.astype(np.int64).reshape(-1, 4), grid.num_q_blocks)


def choose_piece_tables(runs_per_pattern, heads: int,
                        smem_budget: int = DEFAULT_SMEM_BUDGET) -> PieceTables:
    """The SMEM tables with the smallest piece size (a power of two) that fits the budget.

    Raises TableBudgetError when even MAX_SLOTS-tile pieces do not fit.
    """
    slots = 1
    while True:
        tables = PieceTables.from_runs(runs_per_pattern, slots)
        if tables.scalar_prefetch_bytes(heads) <= smem_budget:
            return tables
        if slots >= MAX_SLOTS:
            raise TableBudgetError(tables)
        slots *= 2


def _add_zero_fill_runs(runs: np.ndarray, num_q_blocks: int) -> np.ndarray:
    missing = np.setdiff1d(np.arange(num_q_blocks), runs[:, 0])
    if missing.size == 0:
        return runs
    fill = np.zeros((missing.size, 4), np.int64)
    fill[:, 0] = missing
    fill[:, 2] = 1
    fill[:, 3] = TileKind.EMPTY
    merged = np.concatenate([runs, fill])
    merged = merged[np.argsort(merged[:, 0], kind="stable")]
    for r in np.flatnonzero(merged[:, 3] == TileKind.EMPTY):
        if r > 0:  # reuse the kv tile already resident: no DMA for a zero-fill step
            merged[r, 1] = merged[r - 1, 1] + merged[r - 1, 2] - 1
    return merged
