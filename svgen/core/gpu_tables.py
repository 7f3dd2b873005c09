"""The GPU kernel's tables and resource needs (svgen.runtime.gpu), NumPy only: compiling a
spec for a GPU never imports Pallas.

Table format (`GpuTables`), CSR per (pattern, q tile):

    row_offsets  int32 [patterns * num_q_tiles + 1]  entries of row r = p * num_q_tiles + i
                                                     are entries[row_offsets[r]:row_offsets[r+1]]
    entries      int32 [visited tiles of all patterns (at least 1)]
                                                     kv_tile << 2 | kind (FULL or BOUNDARY)

EMPTY tiles are never listed; a q tile with no entry runs no iteration and writes zeros. One
copy per pattern, whatever the number of heads using it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from svgen.core.kinds import TileKind
from svgen.core.tables import KIND_MASK, KV_BLOCK_SHIFT, KernelShape, compute_block_kinds


def gpu_tile_kinds(
    runs, shape: KernelShape, block_q: int, block_kv: int, q_len: int | None = None
) -> np.ndarray:
    """int8 [ceil(q_len / block_q), ceil(seq_len / block_kv)]: each GPU tile's kind, that of
    the compute block it lies in (block_q must divide compute_q, block_kv compute_kv); q_len:
    the rows when they are not seq_len (a KV-cache chunk's, svgen.runtime.chunks)."""
    q_len = q_len or shape.seq_len
    if shape.cq % block_q or shape.ckv % block_kv:
        raise ValueError(
            f"GPU tiles must divide the compute blocks ({shape.cq} x {shape.ckv}); "
            f"got {block_q} x {block_kv}"
        )
    num_q = -(-q_len // shape.block_q)
    num_kv = -(-shape.seq_len // shape.block_kv)
    blocks = compute_block_kinds(
        runs, num_q, num_kv, shape.q_blocks_per_tile, shape.kv_blocks_per_tile
    )
    gq, gk = -(-q_len // block_q), -(-shape.seq_len // block_kv)
    rows = np.arange(gq) * block_q // shape.cq
    cols = np.arange(gk) * block_kv // shape.ckv
    return blocks[np.ix_(rows, cols)]


@dataclasses.dataclass(frozen=True)
class GpuTables:
    """The CSR tables of all patterns (see the module docstring)."""

    block_q: int
    block_kv: int
    num_q_tiles: int
    num_kv_tiles: int
    row_offsets: np.ndarray  # int32 [patterns * num_q_tiles + 1]
    entries: np.ndarray  # int32 [max(visited, 1)]: kv_tile << 2 | kind

    @classmethod
    def from_runs(
        cls,
        runs_per_pattern: Sequence,
        shape: KernelShape,
        block_q: int,
        block_kv: int,
        q_len: int | None = None,
    ) -> "GpuTables":
        counts, entries = [], []
        gq = gk = 0
        for runs in runs_per_pattern:
            kinds = gpu_tile_kinds(runs, shape, block_q, block_kv, q_len)
            gq, gk = kinds.shape
            q_tile, kv_tile = np.nonzero(kinds != TileKind.EMPTY)  # row-major: by q tile
            counts.append(np.bincount(q_tile, minlength=gq))
            entries.append((kv_tile << KV_BLOCK_SHIFT) | kinds[q_tile, kv_tile])
        counts = np.concatenate(counts)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        flat = np.concatenate(entries) if entries else np.zeros(0, np.int64)
        if offsets[-1] >= 2**31 or gk >= 2**29:
            raise ValueError("the GPU tables do not fit int32: use larger GPU tiles")
        if flat.size == 0:  # never read; keeps the operand non-empty
            flat = np.zeros(1, np.int64)
        return cls(block_q, block_kv, gq, gk, offsets.astype(np.int32), flat.astype(np.int32))

    @property
    def nbytes(self) -> int:
        return self.row_offsets.nbytes + self.entries.nbytes

    @property
    def num_patterns(self) -> int:
        return (len(self.row_offsets) - 1) // self.num_q_tiles

    def visited(self, pattern: int) -> int:
        """Visited GPU tiles of one pattern (per head using it)."""
        rows = self.row_offsets[pattern * self.num_q_tiles : (pattern + 1) * self.num_q_tiles + 1]
        return int(rows[-1] - rows[0])

    def kinds(self, pattern: int) -> np.ndarray:
        """int8 [num_q_tiles, num_kv_tiles] back from the CSR rows (tests, inspection)."""
        out = np.zeros((self.num_q_tiles, self.num_kv_tiles), np.int8)
        for i in range(self.num_q_tiles):
            r = pattern * self.num_q_tiles + i
            for e in self.entries[self.row_offsets[r] : self.row_offsets[r + 1]].tolist():
                out[i, e >> KV_BLOCK_SHIFT] = e & KIND_MASK
        return out
