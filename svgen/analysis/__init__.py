"""Analysis: a validated spec -> a frozen Plan (per pattern: mask IR, layout, tile kinds,
runs, its mask functions as printed; for the kernel: the tables of all patterns).

`analyze` is the driver: it runs PASSES, in order, over one AnalysisRun (svgen.analysis.run),
each pass a function of its own module that reads what the passes before it left there and
adds its part, then freezes the run into the Plan. The passes:

  lower_masks            1. per candidate pattern: spec terms -> simplified mask IR
  check_block_masks         block masks given as data: where they run, their tables' size
  classification_tiling     the tiles the backend classifies at (a GPU's may be coarser)
  choose_layouts         2. per pattern: kernel order (anchor frames for temporal_major)
  check_layouts             the backend runs those orders (a GPU no curves)
  over_kernel_frames        the masks over a frame walked column by column, transposed
  check_row_set_work        masks too costly to classify, refused before any classification
  print_masks               each pattern's mask function, printed once (mask_functions)
  check_tiling              TPU: the one VMEM check, from the printed masks' query values
  plan_patterns          3. classify: EMPTY / BOUNDARY / FULL per compute block, exact or
                            aligned (`tiling.align`, svgen.analysis.align)
                         4. kernel tiles: tile kinds and compute-block words
                         5. the visited tiles as runs, in the kernel's order
  plan_tables            6. the backend's tables of all patterns: TPU, SMEM pieces within
                            the budget (residual masks where they fit, printed once) and the
                            backward kernels' tables; GPU, CSR tables (svgen.core.gpu_tables)
  plan_video_frames         runtime.per_video_frames: supersets and frame trees
  check_runtime_tables      run-time tables at their static maximum, in SMEM
  plan_chunks               runtime.kv_cache: every chunk position's runs (chunks)
  check_chunk_tables        ... in SMEM
  check_select_heads        select: the heads the backend's selection runs for
  plan_candidates           ... each pattern's candidate region
  check_select_tables       ... its tables at their static maximum, in SMEM

What differs per backend is one object (svgen.analysis.backends: TpuBackend, GpuBackend),
chosen once from the target's name, that the backend's passes ask.
"""

from __future__ import annotations

from typing import Callable

from svgen.analysis import (
    backends,
    block_masks,
    kernel_masks,
    mask_functions,
    patterns,
    runtime_runs,
    work,
)
from svgen.analysis.align import PairBudget
from svgen.analysis.classify import Classification, TileGrid
from svgen.analysis.gpu_backend import gpu_classification_tiling
from svgen.analysis.kernel_masks import choose_layout
from svgen.analysis.plan import PatternPlan, Plan
from svgen.analysis.run import ROW_SET_BACKSTOP, AnalysisRun, Settings
from svgen.analysis.smem_checks import check_backward_tables
from svgen.analysis.tables import DEFAULT_SMEM_BUDGET, BlockTable
from svgen.analysis.targets import DEFAULT_TARGET
from svgen.analysis.vmem import check_vmem, query_coordinate_bound, vmem_need
from svgen.analysis.vmem import pattern_query_values as _query_values
from svgen.spec import Spec
from svgen.spec.limits import (
    MAX_BLOCK_TABLE_BYTES,
    MAX_PRODUCT_WORK,
    MAX_ROW_SET_WORK,
    MAX_TILE_PAIRS,
)

__all__ = [
    "analyze",
    "PASSES",
    "query_coordinate_bound",
    "Plan",
    "PatternPlan",
    "TileGrid",
    "Classification",
    "BlockTable",
    "DEFAULT_SMEM_BUDGET",
    "choose_layout",
    "PairBudget",
    "check_vmem",
    "vmem_need",
    "gpu_classification_tiling",
]

# Under the names the analysis's own helpers had here (tests call them).
_check_backward_tables = check_backward_tables
_pattern_plans = patterns.pattern_plans

PASSES: tuple[Callable[[AnalysisRun], None], ...] = (
    kernel_masks.lower_masks,
    block_masks.check_block_masks,
    backends.classification_tiling,
    kernel_masks.choose_layouts,
    backends.check_layouts,
    kernel_masks.over_kernel_frames,
    work.check_row_set_work,
    mask_functions.print_masks,
    backends.check_tiling,
    patterns.plan_patterns,
    backends.plan_tables,
    runtime_runs.plan_video_frames,
    backends.check_runtime_tables,
    runtime_runs.plan_chunks,
    backends.check_chunk_tables,
    backends.check_select_heads,
    runtime_runs.plan_candidates,
    backends.check_select_tables,
)


def analyze(
    spec: Spec,
    progress: Callable[[int, int], None] | None = None,
    smem_budget: int = DEFAULT_SMEM_BUDGET,
    target_name: str = DEFAULT_TARGET,
    residual_masks: bool = True,
) -> Plan:
    """The plan of `spec` for `target_name`, a TPU or a GPU: PASSES over one AnalysisRun,
    with what differs per backend asked of its backend object. residual_masks=False: every
    BOUNDARY block runs the whole mask (TPU; bench/residual_cost.py compares the two)."""
    settings = _settings()
    backend = backends.backend_for(target_name, smem_budget, residual_masks, settings)
    run = AnalysisRun(spec, backend, settings, progress)
    for step in PASSES:
        step(run)
    return run.plan()


def _settings() -> Settings:
    """The settings of one analysis, read from this package when it starts: the limits and
    the VMEM model under the names it has here, where tests and benches lower or replace
    them (svgen.analysis.run.Settings)."""
    return Settings(
        row_set_work=MAX_ROW_SET_WORK,
        row_set_backstop=ROW_SET_BACKSTOP,
        product_work=MAX_PRODUCT_WORK,
        tile_pairs=MAX_TILE_PAIRS,
        block_table_bytes=MAX_BLOCK_TABLE_BYTES,
        vmem_need=vmem_need,
        query_values=_query_values,
    )
