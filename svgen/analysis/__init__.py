"""Analysis: a validated spec -> a frozen Plan (mask IR, tile kinds, block tables, statistics).

The passes, in order (each a pure function; `analyze` is only this list):
  1. lower_mask        spec terms -> simplified mask IR (svgen.ir.lower)
  2. classify_tiles    EMPTY / BOUNDARY / FULL per tile pair, exact kept-pair count
  3. build_step_table  the kernel's step list (runs and packed int32 steps)
"""

from __future__ import annotations

from typing import Callable

from svgen import ir
from svgen.analysis.classify import Classification, TileGrid, classify_tiles
from svgen.analysis.plan import Plan
from svgen.analysis.tables import StepTable, build_step_table
from svgen.layout import SequenceLayout
from svgen.spec import Spec

__all__ = ["analyze", "Plan", "TileGrid", "Classification", "StepTable"]


def analyze(spec: Spec, progress: Callable[[int, int], None] | None = None) -> Plan:
    layout = SequenceLayout.of(spec)
    mask = ir.lower(spec)
    grid = TileGrid(layout.seq_len, spec.tiling.block_q, spec.tiling.block_kv)
    classification = classify_tiles(mask, layout, grid, progress)
    table = build_step_table(classification.kinds, grid)
    return Plan(spec=spec, layout=layout, mask=mask, grid=grid,
                classification=classification, table=table)
