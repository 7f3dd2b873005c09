"""Analysis: a validated spec -> a frozen Plan (mask IR, tile kinds, block tables, statistics).

The passes, in order (each a pure function; `analyze` is only this list):
  1. lower_mask          spec terms -> simplified mask IR (svgen.ir.lower)
  2. classify_tiles      EMPTY / BOUNDARY / FULL per tile pair, exact kept-pair count
  3. build_block_table   the kernel's runs and SMEM pieces, within the SMEM budget
"""

from __future__ import annotations

from typing import Callable

from svgen import ir
from svgen.analysis.classify import Classification, TileGrid, classify_tiles
from svgen.analysis.plan import Plan
from svgen.analysis.tables import (DEFAULT_SMEM_BUDGET, BlockTable, TableBudgetError,
                                   build_block_table)
from svgen.errors import SpecError
from svgen.layout import SequenceLayout
from svgen.spec import BLOCK_MAX, Spec

__all__ = ["analyze", "Plan", "TileGrid", "Classification", "BlockTable", "DEFAULT_SMEM_BUDGET"]


def analyze(spec: Spec, progress: Callable[[int, int], None] | None = None,
            smem_budget: int = DEFAULT_SMEM_BUDGET) -> Plan:
    layout = SequenceLayout.of(spec)
    mask = ir.lower(spec)
    grid = TileGrid(layout.seq_len, spec.tiling.block_q, spec.tiling.block_kv)
    classification = classify_tiles(mask, layout, grid, progress)
    try:
        table = build_block_table(classification.kinds, grid, smem_budget)
    except TableBudgetError as err:
        raise _over_budget_error(spec, mask, layout, grid, err, smem_budget) from None
    return Plan(spec=spec, layout=layout, mask=mask, grid=grid,
                classification=classification, table=table)


def _over_budget_error(spec, mask, layout, grid, err, smem_budget) -> SpecError:
    """Says how many bytes, for which pattern, and which tile size would fit."""
    need = err.smallest.scalar_prefetch_bytes
    hint = "no tile size up to 4096 x 4096 fits either"
    bq, bkv = grid.block_q, grid.block_kv
    while max(bq, bkv) < BLOCK_MAX:
        bq, bkv = min(2 * bq, BLOCK_MAX), min(2 * bkv, BLOCK_MAX)
        bigger = TileGrid(layout.seq_len, bq, bkv)
        try:
            t = build_block_table(classify_tiles(mask, layout, bigger).kinds, bigger, smem_budget)
        except TableBudgetError:
            continue
        hint = (f"tiling {{block_q: {bq}, block_kv: {bkv}}} would fit "
                f"({t.scalar_prefetch_bytes:,} bytes)")
        break
    return SpecError(
        f"pattern {spec.name!r} needs {need:,} bytes of scalar-prefetch tables at "
        f"{grid.block_q} x {grid.block_kv} tiles, over the SMEM budget of {smem_budget:,} bytes "
        f"(--smem-budget); {hint}", file=spec.source, key="tiling")
