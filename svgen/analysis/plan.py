"""The analysis result that code generation and `svgen inspect` read."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from svgen.core.program import ProgramLimits
from svgen import ir
from svgen.analysis.align import PairBudget
from svgen.analysis.classify import Classification, TileGrid
from svgen.analysis.mask_functions import MaskFunctions
from svgen.analysis.residuals import Residuals
from svgen.analysis.tables import BlockTable
from svgen.core.gpu_tables import GpuTables
from svgen.core.layout import TokenLayout
from svgen.core.tables import (
    KernelShape,
    PieceTables,
    compute_block_kinds,
    selectable_blocks,
    selection_superset_runs,
    static_steps,
    tile_grid,
)
from svgen.core.kinds import TileKind
from svgen.spec import GpuTiling, Spec
from svgen.analysis.targets import GpuTarget, Target, VmemNeed


@dataclasses.dataclass(frozen=True)
class PatternPlan:
    """One candidate pattern: its mask, layout, tile kinds and runs.

    `classification` is at the compute-block granularity (`compute_grid`); `kinds` are the
    tiles' (`grid`), the same as classifying the tiles directly. With `tiling.align` both are
    the aligned mask's (it is the mask the kernel runs) and `budget` says what aligning
    changed; None for exact patterns.
    """

    name: str
    layout: TokenLayout
    mask: ir.Node
    grid: TileGrid
    compute_grid: TileGrid
    classification: Classification
    kinds: np.ndarray  # int8 [q tiles, kv tiles] of TileKind
    table: BlockTable
    budget: PairBudget | None = None
    # Residual masks of the BOUNDARY blocks (svgen.analysis.residuals); None: every BOUNDARY
    # block runs the whole mask.
    residuals: Residuals | None = None
    # Why residual masks were not searched to the end, when a work limit stopped their
    # analysis (the limit's name); None when they were.
    residuals_skipped: str | None = None
    # Its mask functions as printed, once, by the analysis (svgen.analysis.mask_functions:
    # the whole mask's, then its residual masks'), what the module holds; None for plans of
    # masks no module prints (a selection's candidate, a per-video group).
    mask_functions: MaskFunctions | None = None

    @property
    def compute_kinds(self) -> np.ndarray:
        return self.classification.kinds

    def compute_block_counts(self) -> dict[str, int]:
        counts = np.bincount(self.compute_kinds.ravel(), minlength=len(TileKind))
        return {
            k.name.lower(): int(counts[k])
            for k in (TileKind.FULL, TileKind.BOUNDARY, TileKind.EMPTY)
        }

    def tile_counts(self) -> dict[str, int]:
        counts = np.bincount(self.kinds.ravel(), minlength=len(TileKind))
        return {
            k.name.lower(): int(counts[k])
            for k in (TileKind.FULL, TileKind.BOUNDARY, TileKind.EMPTY)
        }

    @property
    def total_pairs(self) -> int:
        return self.layout.seq_len**2

    @property
    def density(self) -> float:
        return self.classification.kept_pairs / self.total_pairs

    @property
    def visited_fraction(self) -> float:
        return float(np.count_nonzero(self.kinds != TileKind.EMPTY)) / self.kinds.size

    def summary(self) -> dict:
        c = self.classification
        out = {
            "layout": self.layout.order,
            "tiles": self.tile_counts(),
            "compute_blocks": self.compute_block_counts(),
            # Never a bound under `density`: a user predicate not evaluated everywhere has
            # only bounds (150x apart for a neighborhood predicate), reported as such.
            **self._density_keys(),
            "density_is_exact": c.density_is_exact,
            "visited_fraction": self.visited_fraction,
            "visited_steps": self.table.visited_steps,
            "unproven_boundary_tiles": c.unproven_tiles,
        }
        if self.layout.is_temporal_major:
            out["anchor_frames"] = self.layout.anchor_frames
        if self.layout.is_tiled:
            out["cube"] = list(self.layout.cube)  # frames, rows, cols
        if self.layout.transposed:  # only where it is: other plans' keys stay as they were
            out["transposed_frame"] = True
        if self.layout.curve:
            out["curve"] = self.layout.curve
        if self.budget is not None:
            out.update(self.budget.to_json())
        if self.residuals is not None:
            out["residual_masks"] = self.residuals.summary()
        if self.residuals_skipped is not None:
            out["residual_masks_skipped"] = self.residuals_skipped
        return out

    def _density_keys(self) -> dict:
        c = self.classification
        if c.density_is_exact:
            return {"density": self.density}
        return {
            "density": None,
            "density_lower": self.density,  # the pairs proven kept
            "density_upper": c.kept_pairs_upper / self.total_pairs,
        }


def pattern_shape(spec: Spec, pattern: PatternPlan) -> KernelShape:
    """The kernel shape of a pattern's tiles and compute blocks (the tables' side of it)."""
    grid, compute = pattern.grid, pattern.compute_grid
    return KernelShape(
        grid.seq_len, grid.padded_seq_len, grid.block_q, grid.block_kv,
        spec.attention.head_dim, spec.attention.heads,
        compute_q=compute.block_q, compute_kv=compute.block_kv,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class VideoFramePlan:
    """One pattern under per-video frame numbering (svgen.analysis.video_frames): the runs
    of its superset (the union over every segment start: what a call's tables are refined
    from), the runs of each invariant group at the same tiles, and the frame tree combining
    the groups with the anchored leaves."""

    runs: np.ndarray
    group_runs: tuple[np.ndarray, ...]
    tree: tuple
    groups: tuple  # the groups' IR nodes (for the generated module's comments)


@dataclasses.dataclass(frozen=True)
class TpuKernelPlan:
    """The TPU kernel's side of a plan (svgen.runtime.kernel): its SMEM piece tables, the chip
    it is compiled for and what it keeps in VMEM there."""

    tables: PieceTables
    target: Target
    vmem: VmemNeed
    backend: ClassVar[str] = "tpu"
    # The static model estimates its speed from its grid steps (svgen.estimate.cost; lint).
    steps_estimated: ClassVar[bool] = True
    # Its BOUNDARY tiles may run straight-line bodies (svgen.core.straight).
    straight_bodies: ClassVar[bool] = True

    def table_bytes(self, heads: int) -> int:
        return self.tables.scalar_prefetch_bytes(heads)

    def summary(self, plan: "Plan", out: dict) -> dict:
        """The TPU kernel's keys of `svgen inspect --json`."""
        out["vmem_bytes"] = self.vmem.total
        out["vmem_limit_bytes"] = self.vmem.limit()
        out["table_bytes"] = plan.table_bytes
        out["grid_steps"] = plan.grid_steps
        out["slots_per_piece"] = self.tables.slots
        out.update(plan._inputs_summary())
        if len(plan.patterns) == 1:
            out.update(
                {k: v for k, v in plan.only.summary().items() if k not in out and k != "layout"}
            )
            out["layout"] = plan.layout.order
        else:
            out["patterns"] = {
                p.name: dict(
                    p.summary(),
                    table_bytes=_pattern_bytes(plan, i),
                    grid_steps=plan.pattern_grid_steps(i),
                )
                for i, p in enumerate(plan.patterns)
            }
            out["assign"] = _assign_names(plan)
        return out


@dataclasses.dataclass(frozen=True)
class GpuKernelPlan:
    """The GPU kernel's side of a plan (svgen.runtime.gpu): its CSR tables, the GPU it is
    compiled for, and its tiles, warps and stages."""

    tables: GpuTables
    target: GpuTarget
    tiling: GpuTiling
    backend: ClassVar[str] = "gpu"
    steps_estimated: ClassVar[bool] = False
    straight_bodies: ClassVar[bool] = False

    def table_bytes(self, heads: int) -> int:
        return self.tables.nbytes

    def summary(self, plan: "Plan", out: dict) -> dict:
        """The GPU kernel's keys of `svgen inspect --json`: those of a TPU plan that describe
        the mask and its classification (block_q / block_kv: the classification tiles), then
        the GPU kernel's own (key `gpu`)."""
        tiling, tables = self.tiling, self.tables
        out["gpu"] = {
            "block_q": tiling.block_q,
            "block_kv": tiling.block_kv,
            "num_warps": tiling.num_warps,
            "num_stages": tiling.num_stages,
            "num_q_tiles": tables.num_q_tiles,
            "num_kv_tiles": tables.num_kv_tiles,
            "table_bytes": tables.nbytes,
        }
        out["table_bytes"] = tables.nbytes
        per_pattern = {
            p.name: dict(p.summary(), gpu_visited_tiles=tables.visited(i))
            for i, p in enumerate(plan.patterns)
        }
        if len(plan.patterns) == 1:
            out.update({k: v for k, v in per_pattern[plan.only.name].items() if k not in out})
        else:
            out["patterns"] = per_pattern
            out["assign"] = _assign_names(plan)
        return out


def _assign_names(plan: "Plan"):
    return "runtime" if plan.assign is None else [plan.patterns[i].name for i in plan.assign]


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: Spec
    patterns: tuple[PatternPlan, ...]  # the candidates, in head_pattern index order
    assign: tuple[int, ...] | None  # pattern index per head; None: chosen at run time
    # The backend's side: its tables, the chip it compiles for, and what only it has.
    kernel: TpuKernelPlan | GpuKernelPlan
    # runtime.kv_cache: per pattern, its chunked calls' runs by chunk position
    # (svgen.analysis.chunks.chunk_runs); empty without chunked calls
    chunk_runs: tuple[np.ndarray, ...] = ()
    # select: per pattern, the candidate region's runs at the spec's tiles in the pattern's
    # layout (svgen.runtime.select); None without a select policy
    candidate_runs: tuple[np.ndarray, ...] | None = None
    # runtime.per_video_frames: per pattern its VideoFramePlan, or None where the mask means
    # the same at every segment start; empty when no pattern needs one
    video_frames: tuple = ()
    # Code left out of the TPU kernel to keep its program under the chip's budget (decided
    # by `svgen compile` from libtpu's count: svgen.chip.program_size)
    program: ProgramLimits = ProgramLimits()

    @property
    def backend(self) -> str:
        return self.kernel.backend

    @property
    def tables(self) -> PieceTables | GpuTables:
        """The kernel's tables: TPU, the scalar prefetch; GPU, the CSR tables."""
        return self.kernel.tables

    @property
    def target(self) -> Target | GpuTarget:
        """The chip the kernel is compiled for."""
        return self.kernel.target

    # -- single-pattern views (a spec with `mask`) -----------------------------------------
    @property
    def only(self) -> PatternPlan:
        if len(self.patterns) != 1:
            raise ValueError(f"{self.spec.name} has {len(self.patterns)} patterns")
        return self.patterns[0]

    @property
    def kinds(self) -> np.ndarray:
        return self.only.kinds

    @property
    def layout(self) -> TokenLayout:
        return self.patterns[0].layout  # all patterns share the geometry

    @property
    def mask(self) -> ir.Node:
        return self.only.mask

    @property
    def grid(self) -> TileGrid:
        return self.patterns[0].grid  # all patterns share the tiling

    @property
    def classification(self) -> Classification:
        return self.only.classification

    @property
    def table(self) -> BlockTable:
        return self.only.table

    def tile_counts(self) -> dict[str, int]:
        return self.only.tile_counts()

    @property
    def density(self) -> float:
        return self.only.density

    @property
    def visited_fraction(self) -> float:
        return self.only.visited_fraction

    # -- kernel-wide -----------------------------------------------------------------------
    @property
    def table_bytes(self) -> int:
        return self.kernel.table_bytes(self.spec.attention.heads)

    @property
    def grid_steps(self) -> int:
        """Grid steps of a head of the longest pattern (the per-head walk gives every head
        that many)."""
        return self.tables.max_pieces * self.tables.slots

    def pattern_grid_steps(self, index: int) -> int:
        """Grid steps of a head of pattern `index`: its own pieces in the flat walk."""
        pieces = self.tables.num_pieces[index] if self.tables.flat else self.tables.max_pieces
        return int(pieces) * self.tables.slots

    def cache_words(self) -> str:
        """How the chunked calls' cache is kept, in words (inspect, the compile summary)."""
        runtime = self.spec.runtime
        if not runtime.rolling:
            return "a contiguous cache of the whole video"
        keys = runtime.cache_frames(self.layout.frames) * self.layout.tokens_per_frame
        return (
            f"a rolling cache of {runtime.sink_frames} sink + {runtime.window_frames} ring "
            f"frames ({keys:,} keys)"
        )

    def chunk_steps(self) -> list[int]:
        """runtime.kv_cache: per chunk position, the grid steps per head of one chunked call
        (its longest pattern's pieces: the chunked walk's grid)."""
        steps = []
        positions = self.layout.frames // self.spec.runtime.chunk_frames
        for position in range(positions):
            runs = [r[r[:, 0] == position] for r in self.chunk_runs]
            steps.append(
                max(int(np.ceil(r[:, 3] / self.tables.slots).sum()) for r in runs)
                * self.tables.slots
            )
        return steps

    def select_steps(self) -> int:
        """select: the most grid steps per head a call's selection can give (always-kept
        plus every selectable block: the static maximum of its tables; of the longest
        pattern's, with several)."""
        steps = []
        for pattern, candidate in zip(self.patterns, self.candidate_runs):
            shape = pattern_shape(self.spec, pattern)
            steps.append(
                static_steps(selection_superset_runs(pattern.table.runs, candidate, shape))
            )
        return max(steps)

    def select_blocks(self, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """select: (pattern `index`'s kind of each compute block, int8; which blocks a call
        may select for its heads, bool), both [row blocks, column blocks] in kernel order."""
        pattern = self.patterns[index]
        shape = pattern_shape(self.spec, pattern)
        grid = tile_grid(shape)
        always = compute_block_kinds(pattern.table.runs, *grid)
        candidate = compute_block_kinds(self.candidate_runs[index], *grid)
        return always, selectable_blocks(always, candidate, shape)

    def select_max_blocks(self, index: int | None = None) -> int:
        """select: the most blocks a call selects per compute block row for the heads of
        pattern `index` (None: of any pattern). The policy's `max`; without one, the most
        selectable blocks any row of the pattern has (the candidate's bound, so it clamps
        nothing), and never below `min` (a policy's min <= max, as a given max is)."""
        if index is None:
            return max(self.select_max_blocks(i) for i in range(len(self.patterns)))
        select = self.select_policy(index)
        if select.max_blocks is not None:
            return select.max_blocks
        most = int(self.select_blocks(index)[1].sum(axis=1).max(initial=0))
        return max(most, select.min_blocks)

    def select_policy(self, index: int):
        """select: the policy of pattern `index`'s heads (the section's, with the pattern's
        own candidate and amounts where select.patterns gives them)."""
        return self.spec.select.for_pattern(self.patterns[index].name)

    def summary(self) -> dict:
        """The `svgen inspect --json` object (v1 keys unchanged for single-pattern specs)."""
        out = {
            "name": self.spec.name,
            "seq_len": self.layout.seq_len,
            "padded_seq_len": self.grid.padded_seq_len,
            "block_q": self.grid.block_q,
            "block_kv": self.grid.block_kv,
            "compute_q": self.patterns[0].compute_grid.block_q,
            "compute_kv": self.patterns[0].compute_grid.block_kv,
            "num_q_blocks": self.grid.num_q_blocks,
            "num_kv_blocks": self.grid.num_kv_blocks,
            "align": self.spec.tiling.align,
        }
        if self.spec.tilings:  # a spec that names a chip's own tiling: which is in effect
            out["tiling_chip"] = self.target.name
            out["tiling_from"] = (
                f"tiling.{self.spec.tiling_chip}" if self.spec.tiling_chip else "tiling"
            )
        if len(self.patterns) == 1:
            single = self.only.summary()
            out.update(
                {
                    k: single[k]
                    for k in (
                        "tiles",
                        "compute_blocks",
                        "density",
                        "density_lower",
                        "density_upper",
                        "density_is_exact",
                        "visited_fraction",
                    )
                    if k in single
                }
            )
            if self.only.budget is not None:
                out.update(self.only.budget.to_json())
        out["target"] = self.target.name
        return self.kernel.summary(self, out)

    def _inputs_summary(self) -> dict:
        """The summary's keys for run-time inputs, a selection policy and KV-cache chunks (only
        those the spec declares: the keys of other specs stay what they were)."""
        extra: dict = {}
        runtime = self.spec.runtime
        if runtime.any:  # only when declared: the keys of other specs stay what they were
            names = ("segments", "text_lengths", "per_video_frames")
            extra["runtime"] = [n for n in names if getattr(runtime, n)]
        if self.spec.select is not None:
            select = self.spec.select
            extra["select"] = {
                "rule": select.rule,
                "default": select.default,
                "min_blocks": select.min_blocks,
                "max_blocks": self.select_max_blocks(),
                "max_grid_steps": self.select_steps(),
            }
        if self.chunk_runs:
            extra["kv_cache"] = {
                "chunk_frames": runtime.chunk_frames,
                "chunk_steps": self.chunk_steps(),
            }
            if runtime.rolling:
                extra["kv_cache"].update(
                    sink_frames=runtime.sink_frames, window_frames=runtime.window_frames
                )
        return extra


def _pattern_bytes(plan: Plan, index: int) -> int:
    """One pattern's share of the SMEM tables: its pieces (entries and lengths)."""
    return int(plan.tables.num_pieces[index]) * plan.tables.bytes_per_piece
