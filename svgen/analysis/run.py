"""One analysis under way: what `svgen.analysis.analyze`'s passes read and fill in, in the
order of its pass list, and the settings it runs under."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

from svgen.analysis import vmem
from svgen.analysis.plan import Plan
from svgen.spec import Spec
from svgen.spec.limits import (
    MAX_BLOCK_TABLE_BYTES,
    MAX_PRODUCT_WORK,
    MAX_ROW_SET_WORK,
    MAX_TILE_PAIRS,
    PRODUCT_WORK,
    ROW_SET_WORK,
)

# How far past MAX_ROW_SET_WORK the classifications may go before they are stopped: the
# estimate samples rows, so a mask whose work sits in rows the samples missed is caught there.
ROW_SET_BACKSTOP = 1.5


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one analysis reads of the svgen.analysis package when it starts, and every pass
    then sees the same: the limits on its work and tables (svgen.spec.limits) and the TPU
    kernel's VMEM model (svgen.analysis.vmem). Tests and benches lower a limit, or replace
    the model, on the package."""

    row_set_work: int  # MAX_ROW_SET_WORK: row-set intervals the estimate allows
    row_set_backstop: float  # ROW_SET_BACKSTOP: how far past it the classifications stop
    product_work: int  # MAX_PRODUCT_WORK: box pairs x terms of the per-axis analysis
    tile_pairs: int  # MAX_TILE_PAIRS: of the tiles a GPU plan classifies at
    block_table_bytes: int  # MAX_BLOCK_TABLE_BYTES: one block mask's kernel table
    vmem_need: Callable = vmem.vmem_need  # a kernel's VMEM need at a tiling
    query_values: Callable = vmem.pattern_query_values  # what a pattern keeps in VMEM

    @classmethod
    def default(cls) -> "Settings":
        """The limits as svgen.spec.limits sets them, and the VMEM model as it is."""
        return cls(
            MAX_ROW_SET_WORK,
            ROW_SET_BACKSTOP,
            MAX_PRODUCT_WORK,
            MAX_TILE_PAIRS,
            MAX_BLOCK_TABLE_BYTES,
        )

    @contextlib.contextmanager
    def work_budgets(self, spent: tuple[int, int] = (0, 0)):
        """The row-set and product work budgets (their `.used`), less what this analysis has
        `spent` on them already: one analysis, one budget."""
        with (
            ROW_SET_WORK.budget(int(self.row_set_backstop * self.row_set_work) - spent[0]) as rows,
            PRODUCT_WORK.budget(self.product_work - spent[1]) as products,
        ):
            yield rows, products


@dataclasses.dataclass
class AnalysisRun:
    """The state `analyze`'s passes share, filled in as they run: each pass reads what the
    passes before it left and adds its own part."""

    spec: Spec  # a GPU plan's carries its classification tiles once they are chosen
    backend: object  # svgen.analysis.backends: TpuBackend or GpuBackend
    settings: Settings
    progress: Callable[[int, int], None] | None = None
    masks: list = dataclasses.field(default_factory=list)  # per candidate pattern, its IR
    layouts: list = dataclasses.field(default_factory=list)  # per pattern, its kernel order
    printed: list = dataclasses.field(default_factory=list)  # per pattern, MaskFunctions
    patterns: list = dataclasses.field(default_factory=list)  # PatternPlan
    tiles: list = dataclasses.field(default_factory=list)  # per pattern, kinds and words
    spent: tuple[int, int] = (0, 0)  # row-set and product work of the classifications
    tables: object = None  # the backend's: PieceTables or GpuTables
    video_frames: tuple = ()  # per pattern, a VideoFramePlan or None (per_video_frames)
    chunk_runs: tuple = ()  # per pattern, its chunk runs (runtime.kv_cache)
    candidate_runs: tuple | None = None  # per pattern, its select candidate's runs

    @property
    def candidates(self) -> tuple:
        """The spec's candidate patterns, in head_pattern index order."""
        return self.spec.head_patterns().candidates

    def plan(self) -> Plan:
        """The frozen plan of what the passes found."""
        heads = self.spec.head_patterns()
        names = [c.pattern for c in heads.candidates]
        return Plan(
            spec=self.spec,
            patterns=tuple(self.patterns),
            assign=None if heads.assign is None else tuple(names.index(n) for n in heads.assign),
            kernel=self.backend.plan(self.spec, self.tables),
            chunk_runs=self.chunk_runs,
            candidate_runs=self.candidate_runs,
            video_frames=self.video_frames,
        )
