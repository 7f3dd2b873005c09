"""The analysis result that code generation and `svgen inspect` read."""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen import ir
from svgen.analysis.classify import Classification, TileGrid
from svgen.analysis.tables import BlockTable
from svgen.layout import SequenceLayout
from svgen.runtime.kinds import TileKind
from svgen.spec import Spec


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: Spec
    layout: SequenceLayout
    mask: ir.Node
    grid: TileGrid
    classification: Classification
    table: BlockTable

    @property
    def kinds(self) -> np.ndarray:
        return self.classification.kinds

    def tile_counts(self) -> dict[str, int]:
        counts = np.bincount(self.kinds.ravel(), minlength=len(TileKind))
        return {k.name.lower(): int(counts[k]) for k in (TileKind.FULL, TileKind.BOUNDARY,
                                                          TileKind.EMPTY)}

    @property
    def total_pairs(self) -> int:
        return self.layout.seq_len ** 2

    @property
    def density(self) -> float:
        return self.classification.kept_pairs / self.total_pairs

    @property
    def visited_fraction(self) -> float:
        return float(np.count_nonzero(self.kinds != TileKind.EMPTY)) / self.kinds.size

    def summary(self) -> dict:
        """The `svgen inspect --json` object."""
        c = self.classification
        out = {
            "name": self.spec.name,
            "seq_len": self.layout.seq_len,
            "padded_seq_len": self.grid.padded_seq_len,
            "block_q": self.grid.block_q,
            "block_kv": self.grid.block_kv,
            "num_q_blocks": self.grid.num_q_blocks,
            "num_kv_blocks": self.grid.num_kv_blocks,
            "tiles": self.tile_counts(),
            "density": self.density,
            "density_is_exact": c.density_is_exact,
            "visited_fraction": self.visited_fraction,
            "table_bytes": self.table.scalar_prefetch_bytes,
            "grid_steps": self.table.grid_steps,
            "visited_steps": self.table.visited_steps,
            "slots_per_piece": self.table.pieces.slots,
            "unproven_boundary_tiles": c.unproven_tiles,
        }
        if not c.density_is_exact:
            out["density_upper"] = c.kept_pairs_upper / self.total_pairs
        return out
