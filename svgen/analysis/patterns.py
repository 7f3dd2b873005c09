"""Passes 3-5 for every candidate pattern at the spec's tiling: classify its compute blocks
(EMPTY / BOUNDARY / FULL, exact or aligned), the kernel's tile kinds and compute-block
words, and the visited tiles as runs; then, for a static TPU kernel, its residual masks.
All under one analysis's work budgets (svgen.analysis.run.Settings)."""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen import ir
from svgen.analysis import residuals
from svgen.analysis.align import PairBudget, align_classification
from svgen.analysis.classify import Classification, TileGrid, classify_tiles
from svgen.analysis.plan import PatternPlan
from svgen.analysis.run import Settings
from svgen.analysis.tables import BlockTable, build_runs, kernel_tiles, tile_kinds, variant_words
from svgen.analysis.work import work_error
from svgen.core.layout import TokenLayout
from svgen.core.tables import variant_mask
from svgen.spec import Spec
from svgen.spec.errors import SpecError
from svgen.spec.limits import PRODUCT_WORK, WorkOverLimit


def plan_patterns(run) -> None:
    """Pass: every candidate pattern's plan (with its printed mask functions), its kernel
    tiles, and the work the classifications spent."""
    run.patterns, run.tiles, run.spent = pattern_plans(
        run.spec,
        run.masks,
        run.layouts,
        run.progress,
        run.backend.gpu_runs,
        run.settings,
        run.printed,
    )


def pattern_plans(
    spec: Spec,
    masks,
    layouts,
    progress,
    gpu_runs: bool = False,
    settings: Settings | None = None,
    printed=None,
) -> tuple[list[PatternPlan], list, tuple[int, int]]:
    """Passes 3-5 for every candidate pattern: the pattern plans, per pattern its kernel
    tiles (kinds and compute-block words), and the row-set and product work spent (what
    later work of the same analysis counts against the same limits). gpu_runs: the runs are
    those of the tile kinds themselves (one compute block per tile): unlike the TPU kernel,
    the GPU kernel masks the padding keys of a FULL tile in a branch of its own
    (svgen.runtime.gpu), so the last key column need not run as BOUNDARY. printed: per
    pattern, its MaskFunctions (None: plans without them)."""
    settings = settings or Settings.default()
    candidates = spec.head_patterns().candidates
    printed = printed or [None] * len(candidates)
    patterns, tiles = [], []
    # All candidates together: the estimate can miss work in rows it did not sample, and the
    # product analysis has none; these stop either long before it would run for minutes.
    with settings.work_budgets() as (row_sets, products):
        for candidate, mask, layout, functions in zip(candidates, masks, layouts, printed):
            try:
                plan, kernel = _pattern_plan(
                    spec, candidate.pattern, mask, layout, progress, gpu_runs
                )
            except WorkOverLimit as over:
                raise work_error(spec, over, candidate.pattern, mask, layout, settings) from None
            patterns.append(dataclasses.replace(plan, mask_functions=functions))
            tiles.append(kernel)
    return patterns, tiles, (row_sets.used, products.used)


def _pattern_plan(spec: Spec, name: str, mask, layout: TokenLayout, progress, gpu_runs: bool):
    """One candidate's plan and kernel tiles (kinds and compute-block words)."""
    grid = TileGrid(layout.seq_len, spec.tiling.block_q, spec.tiling.block_kv)
    compute = TileGrid(layout.seq_len, spec.tiling.cq, spec.tiling.ckv)
    classification, budget = _classify(spec, name, mask, layout, compute, progress)
    kinds = tile_kinds(classification.kinds, grid, compute)
    if gpu_runs:
        tiles = (kinds, np.zeros(kinds.shape, np.int64))
    else:
        tiles = kernel_tiles(classification.kinds, grid, compute)
    table = BlockTable(build_runs(*tiles, grid))
    plan = PatternPlan(name, layout, mask, grid, compute, classification, kinds, table, budget)
    return plan, tiles


def _classify(
    spec: Spec, name: str, mask: ir.Node, layout: TokenLayout, compute: TileGrid, progress
) -> tuple[Classification, PairBudget | None]:
    """The compute blocks' kinds, aligned when the spec asks (then with the pair budget)."""
    mode = spec.tiling.align
    if mode == "exact":
        return classify_tiles(mask, layout, compute, progress), None
    exact = classify_tiles(mask, layout, compute, progress, count_pairs=True)
    if exact.pairs is None:
        raise SpecError(
            f"align: {mode} needs exact pair counts, but a user predicate of pattern {name!r} "
            f"left pairs unevaluated (over the analysis budget); use align: exact, or a "
            f"predicate the analysis decides",
            file=spec.source,
            key="tiling.align",
        )
    return align_classification(exact, mode, compute)


def mask_runs(
    spec: Spec, name: str, mask, layout: TokenLayout, progress, settings: Settings
) -> np.ndarray:
    """The runs of a mask besides the patterns' (a select candidate, a per-video superset or
    group) at the spec's tiles, under the analysis's work budgets; `name` says whose in
    errors."""
    with settings.work_budgets():
        try:
            plan, _ = _pattern_plan(spec, name, mask, layout, progress, False)
        except WorkOverLimit as over:
            raise work_error(spec, over, name, mask, layout, settings) from None
    return plan.table.runs


def with_residuals(
    spec: Spec, patterns: list[PatternPlan], tiles: list, spent: tuple[int, int], settings
) -> list[PatternPlan]:
    """The plans with residual masks on the BOUNDARY blocks of a static TPU kernel
    (svgen.analysis.residuals), within what the classification (`spent`) left of the work
    limits: one analysis, one budget. Their mask functions are the whole masks' still: the
    residual masks are printed once they are kept (svgen.analysis.backends)."""
    out = []
    product_work = settings.product_work
    with settings.work_budgets(spent):
        for plan, (kinds, blocks) in zip(patterns, tiles):
            # Residual masks are a speed-up, the kernel exact without them: where classifying
            # the mask's parts would pass the work limit (foreseen from the classification's
            # own work, or found on the way), every BOUNDARY block runs the whole mask.
            ratio = residuals.relative_work(plan.mask, plan.layout)
            if ratio is not None and spent[1] * ratio > product_work - spent[1]:
                out.append(dataclasses.replace(plan, residuals_skipped=PRODUCT_WORK.name))
                continue
            try:
                found = residuals.analyze(
                    plan.mask,
                    plan.layout,
                    plan.compute_grid,
                    plan.classification.kinds,
                    variant_mask(spec.tiling.compute_blocks),
                )
            except WorkOverLimit as over:
                out.append(dataclasses.replace(plan, residuals_skipped=over.work.name))
                continue
            if found is None:
                out.append(plan)
                continue
            words = variant_words(found.block_variant, kinds, plan.grid, plan.compute_grid)
            runs = build_runs(kinds, blocks, plan.grid, words)
            table = BlockTable(runs[:, :5], runs[:, 5])
            out.append(dataclasses.replace(plan, table=table, residuals=found))
    return out
