"""Analysis: a validated spec -> a frozen Plan (per pattern: mask IR, layout, tile kinds,
runs; for the kernel: the SMEM piece tables of all patterns).

The passes, in order (each a pure function; `analyze` is only this list):
  1. lower_mask          per candidate pattern: spec terms -> simplified mask IR
  2. choose_layout       per pattern: kernel order (anchor frames for temporal_major)
  3. classify_tiles      EMPTY / BOUNDARY / FULL per tile pair, exact kept-pair count
  4. build_runs          the visited tiles as runs, in the kernel's order
  5. build_tables        SMEM pieces of all patterns, within the SMEM budget
"""

from __future__ import annotations

from typing import Callable

from svgen import ir
from svgen.analysis.classify import Classification, TileGrid, classify_tiles
from svgen.analysis.plan import PatternPlan, Plan
from svgen.analysis.tables import (DEFAULT_SMEM_BUDGET, BlockTable, TableBudgetError,
                                   build_runs, choose_piece_tables)
from svgen.errors import SpecError
from svgen.layout import FRAME_MAJOR, SequenceLayout
from svgen.spec import BLOCK_MAX, Spec

__all__ = ["analyze", "Plan", "PatternPlan", "TileGrid", "Classification", "BlockTable",
           "DEFAULT_SMEM_BUDGET", "choose_layout"]


def choose_layout(spec: Spec, order: str, mask: ir.Node) -> SequenceLayout:
    g = spec.geometry
    anchors = 0 if order == FRAME_MAJOR else min(ir.anchor_frames(mask), g.frames)
    return SequenceLayout(g.frames, g.height, g.width, g.text_tokens,
                          g.text_position == "first", order, anchors)


def analyze(spec: Spec, progress: Callable[[int, int], None] | None = None,
            smem_budget: int = DEFAULT_SMEM_BUDGET) -> Plan:
    heads = spec.head_patterns()
    patterns = []
    for candidate in heads.candidates:
        mask = ir.lower(spec, spec.pattern_mask(candidate.pattern))
        layout = choose_layout(spec, candidate.layout, mask)
        grid = TileGrid(layout.seq_len, spec.tiling.block_q, spec.tiling.block_kv)
        classification = classify_tiles(mask, layout, grid, progress)
        runs = build_runs(classification.kinds, grid)
        patterns.append(PatternPlan(candidate.pattern, layout, mask, grid, classification,
                                    BlockTable(runs)))
    names = [c.pattern for c in heads.candidates]
    assign = None if heads.assign is None else tuple(names.index(n) for n in heads.assign)
    try:
        tables = choose_piece_tables([p.table.runs for p in patterns], spec.attention.heads,
                                     smem_budget)
    except TableBudgetError as err:
        raise _over_budget_error(spec, patterns, err, smem_budget) from None
    return Plan(spec=spec, patterns=tuple(patterns), assign=assign, tables=tables)


def _over_budget_error(spec: Spec, patterns, err, smem_budget) -> SpecError:
    """Says how many bytes, for which pattern, and which tile size would fit."""
    need = err.smallest.scalar_prefetch_bytes(spec.attention.heads)
    per_piece = 4 if err.smallest.lengths is None else 8
    biggest = max(range(len(patterns)), key=lambda i: int(err.smallest.num_pieces[i]))
    worst = patterns[biggest]
    hint = "no tile size up to 4096 x 4096 fits either"
    grid = worst.grid
    bq, bkv = grid.block_q, grid.block_kv
    while max(bq, bkv) < BLOCK_MAX:
        bq, bkv = min(2 * bq, BLOCK_MAX), min(2 * bkv, BLOCK_MAX)
        bigger = TileGrid(grid.seq_len, bq, bkv)
        runs = [build_runs(classify_tiles(p.mask, p.layout, bigger).kinds, bigger)
                for p in patterns]
        try:
            t = choose_piece_tables(runs, spec.attention.heads, smem_budget)
        except TableBudgetError:
            continue
        hint = (f"tiling {{block_q: {bq}, block_kv: {bkv}}} would fit "
                f"({t.scalar_prefetch_bytes(spec.attention.heads):,} bytes)")
        break
    which = f"pattern {worst.name!r}" if len(patterns) > 1 else f"pattern {spec.name!r}"
    share = int(err.smallest.num_pieces[biggest]) * per_piece
    detail = f" ({share:,} of them for {which})" if len(patterns) > 1 else ""
    return SpecError(
        f"{which} needs {need:,} bytes of scalar-prefetch tables{detail} at "
        f"{grid.block_q} x {grid.block_kv} tiles, over the SMEM budget of {smem_budget:,} bytes "
        f"(--smem-budget); {hint}", file=spec.source, key="tiling")
