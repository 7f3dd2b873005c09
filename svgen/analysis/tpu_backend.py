"""What the analysis does for the TPU kernel (svgen.runtime.kernel): the spec's own tiles, its
VMEM need checked before any classification (from the query values of the printed masks),
kernel tiles with compute-block words, the SMEM piece tables of all patterns (with residual
masks where they fit, printed once they are kept), and every table a call builds checked
against the SMEM budget."""

from __future__ import annotations

import dataclasses

from svgen.analysis.mask_functions import add_residual_masks
from svgen.analysis.patterns import with_residuals
from svgen.analysis.plan import PatternPlan, TpuKernelPlan
from svgen.analysis.smem_checks import (
    check_backward_tables,
    check_chunk_tables,
    check_runtime_tables,
    check_select_tables,
    over_budget_error,
)
from svgen.analysis.tables import TableBudgetError, choose_piece_tables
from svgen.analysis.targets import VMEM_RESERVE, Target, VmemNeed
from svgen.analysis.vmem import check_vmem
from svgen.core.tables import PieceTables, walks_flat
from svgen.spec import Spec


class TpuBackend:
    """The TPU kernel's side of `analyze` (see the module docstring)."""

    gpu_runs = False  # its runs carry compute-block words (svgen.analysis.tables.kernel_tiles)

    def __init__(self, chip: Target, smem_budget: int, residual_masks: bool):
        self.chip = chip
        self.smem_budget = smem_budget
        self.residual_masks = residual_masks

    def refuses_block_data(self) -> str | None:
        return None  # block masks given as data run in the TPU kernels

    def check_layouts(self, spec: Spec, layouts) -> None:
        pass  # every kernel order runs in the TPU kernels, curves too

    def classified(self, spec: Spec) -> Spec:
        return spec  # classified at the spec's own tiles

    def check_tiling(self, run) -> None:
        """A SpecError for a tiling that cannot run: the one VMEM check, with the query values
        each pattern's printed masks read."""
        spec, settings = run.spec, run.settings
        self.query_values = max(
            settings.query_values(spec, mask, printed)
            for mask, printed in zip(run.masks, run.printed)
        )
        self.vmem = check_vmem(spec, self.chip, self.query_values, settings.vmem_need)

    def plan(self, spec: Spec, tables: PieceTables) -> TpuKernelPlan:
        # The chip and the VMEM need were settled by check_tiling (and the residual masks).
        return TpuKernelPlan(tables, self.chip, self.vmem)

    def plan_tables(self, run) -> None:
        """The piece tables of all patterns, with residual masks added where the tables still
        fit SMEM and their query values VMEM (the VMEM need is then theirs); the backward
        kernels' transposed tables checked too."""
        spec, patterns = run.spec, run.patterns
        # The budget first, without residual masks (they only add bytes): a spec whose tables
        # cannot fit is told so before the residual analysis's classifications run.
        try:
            tables = self._piece_tables(spec, patterns)
        except TableBudgetError as err:
            raise over_budget_error(spec, patterns, err, self.smem_budget, run.settings) from None
        if self.residual_masks and static_kernel(spec):
            patterns, tables = self._with_residual_masks(run, tables)
        check_backward_tables(spec, patterns, run.tiles, self.chip, self.smem_budget)
        run.patterns, run.tables = patterns, tables

    def _piece_tables(self, spec: Spec, plans, first_slots: int = 1) -> PieceTables:
        return choose_piece_tables(
            [p.table.runs for p in plans],
            spec.attention.heads,
            self.smem_budget,
            spec.tiling.compute_blocks,
            walks_flat(len(plans), self.chip.cores_per_chip),
            [p.table.variants for p in plans],
            first_slots,
        )

    def _with_residual_masks(self, run, tables: PieceTables) -> tuple[list, PieceTables]:
        """(patterns, tables) with the residual masks the analysis finds, where they fit; the
        patterns and tables as they were where not. Residual masks are a speed-up: without
        them the tables and VMEM fit."""
        spec = run.spec
        found = with_residuals(spec, run.patterns, run.tiles, run.spent, run.settings)
        if not any(p.residuals is not None for p in found):
            return found, tables  # the same tables; the plans may say why none were searched
        try:
            tables_with = self._piece_tables(spec, found, first_slots=tables.slots)
        except TableBudgetError:
            return run.patterns, tables
        found = [_print_residual_masks(spec, p) for p in found]
        vmem = self._vmem_with(run, found)
        if vmem is None:
            return run.patterns, tables
        self.vmem = vmem
        return found, tables_with

    def _vmem_with(self, run, patterns) -> VmemNeed | None:
        """The VMEM need with the patterns' residual masks (their query values may outnumber
        the whole masks'), None where it no longer fits: residual masks are a speed-up, and
        the tiling was accepted without them."""
        spec, settings = run.spec, run.settings
        values = max(
            (
                settings.query_values(spec, p.mask, p.mask_functions)
                for p in patterns
                if p.residuals is not None
            ),
            default=0,
        )
        need = settings.vmem_need(spec, self.chip, max(values, self.query_values))
        return need if need.limit() <= self.chip.vmem_bytes - VMEM_RESERVE else None

    def check_runtime_tables(self, run) -> None:
        spec, patterns = run.spec, run.patterns
        if spec.runtime.any:
            runs = [
                p.table.runs if v is None else v.runs for p, v in zip(patterns, run.video_frames)
            ]
            check_runtime_tables(spec, runs, patterns[0].grid, run.tables.slots, self.smem_budget)

    def check_chunk_tables(self, run) -> None:
        check_chunk_tables(run.spec, run.chunk_runs, run.tables.slots, self.smem_budget)

    def check_select_heads(self, run) -> None:
        pass  # every pattern selects among its own blocks (svgen.runtime.select)

    def check_select_tables(self, run) -> None:
        for pattern, runs in zip(run.patterns, run.candidate_runs):
            check_select_tables(run.spec, pattern, runs, run.tables.slots, self.smem_budget)


def _print_residual_masks(spec: Spec, pattern: PatternPlan) -> PatternPlan:
    """The pattern with its residual masks printed after its whole mask (none to print
    without residual masks)."""
    if pattern.residuals is None:
        return pattern
    masks = [v.mask for v in pattern.residuals.variants]
    printed = add_residual_masks(
        pattern.mask_functions, masks, pattern.layout, spec.runtime.per_video_frames
    )
    return dataclasses.replace(pattern, mask_functions=printed)


def static_kernel(spec: Spec) -> bool:
    """Tables fixed at compile time, walked as compiled: the kernels residual masks serve
    (run-time refinement, selections and chunked calls rebuild the tables on the device,
    and their blocks run the whole mask)."""
    return not spec.runtime.any and not spec.runtime.kv_cache and spec.select is None
