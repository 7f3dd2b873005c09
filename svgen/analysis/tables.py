"""Block tables for the kernel: the visited tiles of each q tile, as runs and as packed steps.

The kernel walks a flat list of steps (see `svgen.runtime.kernel`): for each q tile in order,
its visited kv tiles in increasing order. Two adjustments turn tile kinds into kernel kinds:
  * a FULL tile in the last kv tile, when the sequence does not fill it, runs as BOUNDARY:
    its padding keys must be masked out (the boundary mask always drops keys >= seq_len);
  * a q tile with no visited tile gets one EMPTY step, which only writes its zero output.
    It names the previous step's kv tile, so the pipeline fetches nothing new for it.
The table shipped to the kernel is one int32 per step; the generated module stores it as runs
(q_block, kv_start, length, kind) of consecutive kv tiles of one kind, which are shorter and
readable, and expands them at import.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.analysis.classify import TileGrid
from svgen.runtime.kernel import expand_runs
from svgen.runtime.kinds import TileKind


@dataclasses.dataclass(frozen=True)
class StepTable:
    runs: np.ndarray  # int64 [num_runs, 4]: q_block, kv_start, length, kernel kind
    steps: np.ndarray  # int32 [num_steps], packed (runtime.kernel.pack_steps)

    @property
    def num_steps(self) -> int:
        return int(self.steps.size)

    @property
    def scalar_prefetch_bytes(self) -> int:
        return int(self.steps.nbytes)


def kernel_kinds(kinds: np.ndarray, grid: TileGrid) -> np.ndarray:
    out = kinds.copy()
    if grid.seq_len % grid.block_kv:
        last = out[:, -1]
        last[last == TileKind.FULL] = TileKind.BOUNDARY
    return out


def build_step_table(kinds: np.ndarray, grid: TileGrid) -> StepTable:
    kinds = kernel_kinds(kinds, grid)
    q_block, kv_block = np.nonzero(kinds != TileKind.EMPTY)  # row-major: sorted as the kernel walks
    kind = kinds[q_block, kv_block].astype(np.int64)
    new_run = np.ones(q_block.size, bool)
    new_run[1:] = ((q_block[1:] != q_block[:-1]) | (kv_block[1:] != kv_block[:-1] + 1)
                   | (kind[1:] != kind[:-1]))
    first = np.flatnonzero(new_run)
    lengths = np.diff(np.append(first, q_block.size))
    runs = np.stack([q_block[first], kv_block[first], lengths, kind[first]], axis=1).astype(np.int64)
    runs = _add_zero_fill_runs(runs, grid.num_q_blocks)
    return StepTable(runs=runs, steps=expand_runs(runs))


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
