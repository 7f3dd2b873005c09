"""What the analysis does for the GPU kernel (svgen.runtime.gpu): passes 1-5 at the
classification tiles of `gpu_classification_tiling` (the plan's spec carries that tiling:
what the generated module's SHAPE and docstring say), runs of the tile kinds themselves,
then the CSR tables of all patterns. What fits the GPU's shared memory and registers is the
deviceless compile's to check (svgen.chip.gpu_aot), not the analysis's; its tables live in
global memory, so no SMEM budget is checked."""

from __future__ import annotations

import dataclasses

from svgen.analysis.errors import select_error
from svgen.analysis.plan import GpuKernelPlan
from svgen.analysis.targets import GpuTarget
from svgen.core.gpu_tables import GpuTables
from svgen.core.tables import KernelShape
from svgen.spec import Spec, Tiling
from svgen.spec.errors import SpecError
from svgen.spec.limits import MAX_TILE_PAIRS


class GpuBackend:
    """The GPU kernel's side of `analyze` (see the module docstring)."""

    # The runs are those of the tile kinds themselves (one compute block per tile): unlike
    # the TPU kernel, the GPU kernel masks the padding keys of a FULL tile in a branch of its
    # own, so the last key column need not run as BOUNDARY.
    gpu_runs = True

    def __init__(self, chip: GpuTarget, max_tile_pairs: int = MAX_TILE_PAIRS):
        self.chip = chip
        self.max_tile_pairs = max_tile_pairs

    def refuses_block_data(self) -> str | None:
        return f"the {self.chip.name} (GPU) kernel"

    def check_layouts(self, spec: Spec, layouts) -> None:
        """Curve layouts run in the TPU kernels; the GPU kernel does not take them yet. Nor
        int8 QK^T (attention.qk: int8), a TPU kernel's path."""
        if spec.attention.qk == "int8":
            where = spec.attention.qk_where
            raise SpecError(
                f"qk: int8 runs in the TPU kernels only; the {self.chip.name} (GPU) kernel "
                "computes QK^T in the spec's dtype (leave qk out, or compile for a TPU target)",
                file=spec.source,
                line=where.line if where else None,
                column=where.column if where else None,
                key="attention.qk",
            )
        if any(lay.curve for lay in layouts):
            raise SpecError(
                f"a curve layout does not run in the {self.chip.name} (GPU) kernel yet; it runs "
                "in the TPU kernels (docs/limits.md)",
                file=spec.source,
                key="layout",
            )

    def classified(self, spec: Spec) -> Spec:
        patterns = len(spec.head_patterns().candidates)
        tiling = gpu_classification_tiling(spec, patterns, self.max_tile_pairs)
        return dataclasses.replace(spec, tiling=tiling)

    def check_tiling(self, run) -> None:
        """A selection must choose per GPU tile."""
        spec = run.spec
        gpu = spec.gpu_tiling
        if spec.select is not None and (spec.tiling.block_q, spec.tiling.block_kv) != (
            gpu.block_q,
            gpu.block_kv,
        ):
            raise select_error(
                spec,
                "select",
                f"selects per GPU tile, but {gpu.block_q} x {gpu.block_kv} GPU tiles give more "
                "tile pairs than the analysis allows (MAX_TILE_PAIRS): use larger gpu.block_q / "
                "gpu.block_kv",
            )

    def plan(self, spec: Spec, tables: GpuTables) -> GpuKernelPlan:
        return GpuKernelPlan(tables, self.chip, spec.gpu_tiling)

    def plan_tables(self, run) -> None:
        spec, patterns = run.spec, run.patterns
        grid, gpu = patterns[0].grid, spec.gpu_tiling
        shape = KernelShape(
            grid.seq_len, grid.padded_seq_len, grid.block_q, grid.block_kv,
            spec.attention.head_dim, spec.attention.heads,
        )  # fmt: skip
        runs = [p.table.runs for p in patterns]
        run.tables = GpuTables.from_runs(runs, shape, gpu.block_q, gpu.block_kv)

    def check_runtime_tables(self, run) -> None:
        pass

    def check_chunk_tables(self, run) -> None:
        pass

    def check_select_heads(self, run) -> None:
        """The GPU kernel's selection reads one pattern's tiles, and no run-time ids."""
        spec = run.spec
        if len(run.patterns) > 1:
            raise select_error(
                spec,
                "select",
                f"a selection with heads of several patterns does not run in the {self.chip.name} "
                "(GPU) kernel yet; it runs in the TPU kernels (docs/limits.md)",
            )
        if spec.runtime.any:
            raise select_error(
                spec,
                "select",
                f"a selection with runtime segments or text lengths does not run in the "
                f"{self.chip.name} (GPU) kernel yet; it runs in the TPU kernels (docs/limits.md)",
            )

    def check_select_tables(self, run) -> None:
        pass


def gpu_classification_tiling(
    spec: Spec, patterns: int, max_tile_pairs: int = MAX_TILE_PAIRS
) -> Tiling:
    """The tiles a GPU plan classifies at: the GPU tiles themselves (every GPU tile gets its
    own exact kind), or, where that grid would exceed MAX_TILE_PAIRS, the smallest power-of-two
    multiple of them that fits (each GPU tile then inherits the kind of the block it lies in,
    as svgen.core.gpu_tables does). `tiling.align` rounds at these tiles."""
    gpu, seq_len = spec.gpu_tiling, spec.geometry.seq_len
    bq, bkv = gpu.block_q, gpu.block_kv
    while -(-seq_len // bq) * -(-seq_len // bkv) * patterns > max_tile_pairs:
        bq, bkv = 2 * bq, 2 * bkv
    return Tiling(bq, bkv, align=spec.tiling.align)
