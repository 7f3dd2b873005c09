"""Analysis: a validated spec -> a frozen Plan (per pattern: mask IR, layout, tile kinds,
runs; for the kernel: the SMEM piece tables of all patterns).

The passes, in order (each a pure function; `analyze` runs this list, then the checks of
what the module's calls will need: the backward kernels' tables in SMEM, the run-time tables'
static maximum, a KV cache's chunk positions (svgen.analysis.chunks) and a selection's
candidate region):
  1. ir.lower            per candidate pattern: spec terms -> simplified mask IR
  2. choose_layout       per pattern: kernel order (anchor frames for temporal_major)
  3. classify_tiles      EMPTY / BOUNDARY / FULL per compute-block pair, exact kept-pair count
     align_classification  with `tiling.align`: BOUNDARY blocks rounded to FULL / EMPTY, and
                         the exact pair budget of the rounding (svgen.analysis.align)
  4. kernel_tiles        tile kinds and per-tile compute-block words, as the kernel runs them
  5. build_runs          the visited tiles as runs, in the kernel's order
  6. choose_piece_tables  SMEM pieces of all patterns, within the SMEM budget

For a GPU target the same passes 1-5 run at the GPU kernel's classification tiles, and step 6
is the GPU kernel's CSR tables (svgen.core.gpu_tables). What differs per backend is one
object (`_TpuKernel`, `_GpuKernel`) that `analyze` asks: the tiles it classifies at, what it
checks before classifying, its tables, and which tables must fit SMEM.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from svgen import ir
from svgen.analysis import axis_terms, chunks, mask_code, residuals, rowsets, video_frames
from svgen.analysis.align import PairBudget, align_classification
from svgen.analysis.classify import Classification, TileGrid, classify_tiles
from svgen.analysis.plan import (
    GpuKernelPlan,
    PatternPlan,
    Plan,
    TpuKernelPlan,
    VideoFramePlan,
    pattern_shape,
)
from svgen.core.ring import RingCache
from svgen.analysis.tables import (
    DEFAULT_SMEM_BUDGET,
    MAX_SLOTS,
    BlockTable,
    TableBudgetError,
    build_runs,
    variant_words,
    choose_piece_tables,
    kernel_tiles,
    tile_kinds,
    transposed_tiles,
)
from svgen.spec.errors import SpecError
from svgen.spec.limits import (
    MAX_BLOCK_TABLE_BYTES,
    MAX_PRODUCT_WORK,
    MAX_ROW_SET_WORK,
    MAX_TILE_PAIRS,
    PRODUCT_WORK,
    ROW_SET_WORK,
    WorkOverLimit,
)
from svgen.core.gpu_tables import GpuTables
from svgen.core.kinds import TileKind
from svgen.core.layout import FRAME_MAJOR, TokenLayout
from svgen.core.tables import (
    KernelShape,
    block_table_shape,
    PieceTables,
    runtime_table_bytes,
    selection_superset_runs,
    static_steps,
    variant_mask,
    walks_flat,
)
from svgen.spec import BLOCK_MAX, Spec, Tiling
from svgen.analysis.targets import (
    DEFAULT_TARGET,
    MIB,
    VMEM_RESERVE,
    GpuTarget,
    Target,
    VmemNeed,
    gpu_target,
    is_gpu,
    kernel_vmem,
    target,
)

__all__ = [
    "analyze",
    "query_coordinate_bound",
    "Plan",
    "PatternPlan",
    "TileGrid",
    "Classification",
    "BlockTable",
    "DEFAULT_SMEM_BUDGET",
    "choose_layout",
    "PairBudget",
]


def choose_layout(spec: Spec, order: str, mask: ir.Node) -> TokenLayout:
    g = spec.geometry
    anchors = 0 if order == FRAME_MAJOR else min(mask.anchor_frames(), g.frames)
    return g.with_order(order, anchors)


def _over_kernel_frame(spec: Spec, mask: ir.Node, layout: TokenLayout, order, where, key: str):
    """The mask the kernel of `layout` runs: over a transposed frame (an axis order `order`
    that walks a frame column by column, svgen.core.layout) the mask with rows and columns
    exchanged, so that everything after this point sees one row-major frame. A mask with no
    such form is a SpecError at `where` (key `key`); so is a mask that reads rows or columns
    in a curve layout, whose kernel decodes neither."""
    if layout.curve:
        _check_curve_mask(spec, mask, layout, where, key)
    if not layout.transposed:
        return mask
    try:
        return mask.transposed()
    except ir.NotTransposable as err:
        raise SpecError(
            f"layout {order.words()} walks a frame column by column, and this mask has no "
            f"form over the transposed frame: {err} (the orders whose rows come before their "
            "columns take it: [f, h, w], [h, w, f], [h, f, w])",
            file=spec.source,
            key=key,
            line=where.line if where else None,
            column=where.column if where else None,
        ) from None


def _check_curve_mask(spec: Spec, mask: ir.Node, layout: TokenLayout, where, key: str) -> None:
    """A curve layout (svgen.core.layout) keeps frames and positions as frame_major does and
    scatters each frame's rows and columns along the curve: its kernels decode no row or
    column, so a mask reading them is refused, naming what it reads. Over the whole video the
    frames are scattered too, and decoded neither."""
    scattered = {"h_q", "h_k", "w_q", "w_k"}
    if layout.curve_over_video:
        scattered |= {"f_q", "f_k"}
    names = sorted({s.name for s in mask.predicate().free_symbols} & scattered)
    if not names:
        return
    if layout.curve_over_video:
        walk, decodes = "the whole video", "no frames, rows or columns"
        takes = "positions and text (band, prefix, text, expr over i and is_text)"
    else:
        walk, decodes = "each frame", "no rows or columns"
        takes = (
            "frames, positions and text (first_frame, band, prefix, text, spatial_window with "
            "frames only, expr over f, i and is_text)"
        )
    raise SpecError(
        f"layout {{curve: {layout.curve}}} walks {walk} along a curve, and its kernel "
        f"decodes {decodes}; this mask reads {', '.join(names)}. A curve layout there takes "
        f"masks of {takes}, block masks given as data (blocks) and selections (select)",
        file=spec.source,
        key=key,
        line=where.line if where else None,
        column=where.column if where else None,
    )


def _check_curve_target(spec: Spec, layouts, target_name: str) -> None:
    """Curve layouts run in the TPU kernels; the GPU kernel does not take them yet."""
    if is_gpu(target_name) and any(lay.curve for lay in layouts):
        raise SpecError(
            f"a curve layout does not run in the {target_name} (GPU) kernel yet; it runs in "
            "the TPU kernels (docs/limits.md)",
            file=spec.source,
            key="layout",
        )


def _candidate_mask(spec: Spec, mask: ir.Node, layout: TokenLayout, candidate) -> ir.Node:
    where = candidate.where
    key = "layout" if where is None else f"{where.key}.layout"
    return _over_kernel_frame(spec, mask, layout, candidate.layout, where, key)


def analyze(
    spec: Spec,
    progress: Callable[[int, int], None] | None = None,
    smem_budget: int = DEFAULT_SMEM_BUDGET,
    target_name: str = DEFAULT_TARGET,
    residual_masks: bool = True,
) -> Plan:
    """The plan of `spec` for `target_name`, a TPU or a GPU: the passes every backend shares,
    with what differs (tiles, tables, their checks) asked of the backend's `_Kernel`.
    residual_masks=False: every BOUNDARY block runs the whole mask (TPU; bench/residual_cost.py
    compares the two)."""
    kernel = (
        _GpuKernel(gpu_target(target_name))
        if is_gpu(target_name)
        else _TpuKernel(target(target_name), smem_budget, residual_masks)
    )
    heads = spec.head_patterns()
    masks = [ir.lower(spec, spec.pattern_mask(c.pattern)) for c in heads.candidates]
    _check_block_masks(spec, target_name)
    spec = kernel.classified(spec)
    candidates = heads.candidates
    layouts = [choose_layout(spec, c.layout, m) for c, m in zip(candidates, masks)]
    _check_curve_target(spec, layouts, target_name)
    masks = [_candidate_mask(spec, m, lay, c) for m, lay, c in zip(masks, layouts, candidates)]
    # Before any classification work: masks too costly to classify, then a tiling that cannot
    # run (the one VMEM check).
    check_row_set_work(spec, masks, layouts)
    kernel.check_first(spec, masks, layouts)
    patterns, tiles, spent = _pattern_plans(spec, masks, layouts, progress, kernel.gpu_runs)
    patterns, tables = kernel.tables(spec, patterns, tiles, spent)
    video_frames = _video_frames(spec, patterns, progress)
    kernel.check_runtime_tables(spec, patterns, video_frames, tables)
    chunked = ()
    if spec.runtime.kv_cache:
        chunked = _chunk_runs(spec, patterns, spec.tiling)
        kernel.check_chunk_tables(spec, chunked, tables)
    candidate_runs = None
    if spec.select is not None:
        kernel.check_select_heads(spec, patterns)
        # Per pattern: the candidate region in the pattern's own layout.
        candidate_runs = tuple(_candidate_runs(spec, p, progress) for p in patterns)
        for pattern, runs in zip(patterns, candidate_runs):
            kernel.check_select_tables(spec, pattern, runs, tables)
    names = [c.pattern for c in heads.candidates]
    return Plan(
        spec=spec,
        patterns=tuple(patterns),
        assign=None if heads.assign is None else tuple(names.index(n) for n in heads.assign),
        kernel=kernel.plan(spec, tables),
        chunk_runs=chunked,
        candidate_runs=candidate_runs,
        video_frames=video_frames,
    )


class _TpuKernel:
    """What the analysis does for the TPU kernel (svgen.runtime.kernel): the spec's own tiles,
    its VMEM need checked before any classification, kernel tiles with compute-block words,
    the SMEM piece tables of all patterns (with residual masks where they fit), and every
    table a call builds checked against the SMEM budget."""

    gpu_runs = False

    def __init__(self, chip: Target, smem_budget: int, residual_masks: bool):
        self.chip = chip
        self.smem_budget = smem_budget
        self.residual_masks = residual_masks

    def classified(self, spec: Spec) -> Spec:
        return spec

    def check_first(self, spec: Spec, masks, layouts) -> None:
        """A SpecError for a tiling that cannot run: the one VMEM check, with the query values
        each mask's printed code reads (mask_code)."""
        self.query_values = max(_query_values(spec, m, lay) for m, lay in zip(masks, layouts))
        self.vmem = check_vmem(spec, self.chip, self.query_values)

    def plan(self, spec: Spec, tables: PieceTables) -> TpuKernelPlan:
        # The chip and the VMEM need were settled by check_first; spec: the GPU side's need.
        return TpuKernelPlan(tables, self.chip, self.vmem)

    def tables(self, spec: Spec, patterns, tiles, spent):
        """(patterns, PieceTables): residual masks added where the tables still fit SMEM and
        their query values VMEM (the VMEM need is then theirs); the backward kernels'
        transposed tables checked too."""

        def piece_tables(plans, first_slots: int = 1):
            return choose_piece_tables(
                [p.table.runs for p in plans],
                spec.attention.heads,
                self.smem_budget,
                spec.tiling.compute_blocks,
                walks_flat(len(plans), self.chip.cores_per_chip),
                [p.table.variants for p in plans],
                first_slots,
            )

        # The budget first, without residual masks (they only add bytes): a spec whose tables
        # cannot fit is told so before the residual analysis's classifications run.
        try:
            tables = piece_tables(patterns)
        except TableBudgetError as err:
            raise _over_budget_error(spec, patterns, err, self.smem_budget) from None
        if self.residual_masks and _static_kernel(spec):
            with_residuals = _with_residuals(spec, patterns, tiles, spent)
            if any(p.residuals is not None for p in with_residuals):
                # Residual masks are a speed-up: without them the tables and VMEM fit.
                try:
                    tables_with = piece_tables(with_residuals, first_slots=tables.slots)
                    vmem = self._vmem_with(spec, with_residuals)
                except TableBudgetError:
                    vmem = None
                if vmem is not None:
                    patterns, tables = with_residuals, tables_with
                    self.vmem = vmem
            else:  # the same tables; the plans may say why no residual masks were searched
                patterns = with_residuals
        _check_backward_tables(spec, patterns, tiles, self.chip, self.smem_budget)
        return patterns, tables

    def _vmem_with(self, spec: Spec, patterns) -> VmemNeed | None:
        """The VMEM need with the patterns' residual masks (their query values may outnumber
        the whole masks'), None where it no longer fits: residual masks are a speed-up, and
        the tiling was accepted without them."""
        values = max(
            (
                _query_values(spec, p.mask, p.layout, [v.mask for v in p.residuals.variants])
                for p in patterns
                if p.residuals is not None
            ),
            default=0,
        )
        need = vmem_need(spec, self.chip, max(values, self.query_values))
        return need if need.limit() <= self.chip.vmem_bytes - VMEM_RESERVE else None

    def check_runtime_tables(self, spec: Spec, patterns, video_frames, tables) -> None:
        if spec.runtime.any:
            runs = [p.table.runs if v is None else v.runs for p, v in zip(patterns, video_frames)]
            _check_runtime_tables(spec, runs, patterns[0].grid, tables.slots, self.smem_budget)

    def check_chunk_tables(self, spec: Spec, chunked, tables) -> None:
        _check_chunk_tables(spec, chunked, tables.slots, self.smem_budget)

    def check_select_tables(self, spec: Spec, always, candidate_runs, tables) -> None:
        _check_select_tables(spec, always, candidate_runs, tables.slots, self.smem_budget)

    def check_select_heads(self, spec: Spec, patterns) -> None:
        pass  # every pattern selects among its own blocks (svgen.runtime.select)


class _GpuKernel:
    """What the analysis does for the GPU kernel (svgen.runtime.gpu): passes 1-5 at the
    classification tiles of `gpu_classification_tiling` (the plan's spec carries that tiling:
    what the generated module's SHAPE and docstring say), runs of the tile kinds themselves,
    then the CSR tables of all patterns. What fits the GPU's shared memory and registers is
    the deviceless compile's to check (svgen.perf.gpu_aot), not the analysis's."""

    # The runs are those of the tile kinds themselves (one compute block per tile): unlike
    # the TPU kernel, the GPU kernel masks the padding keys of a FULL tile in a branch of its
    # own, so the last key column need not run as BOUNDARY.
    gpu_runs = True

    def __init__(self, chip: GpuTarget):
        self.chip = chip

    def classified(self, spec: Spec) -> Spec:
        patterns = len(spec.head_patterns().candidates)
        return dataclasses.replace(spec, tiling=gpu_classification_tiling(spec, patterns))

    def check_first(self, spec: Spec, masks, layouts) -> None:
        """A selection must choose per GPU tile."""
        gpu = spec.gpu_tiling
        if spec.select is not None and (spec.tiling.block_q, spec.tiling.block_kv) != (
            gpu.block_q,
            gpu.block_kv,
        ):
            raise _select_error(
                spec,
                "select",
                f"selects per GPU tile, but {gpu.block_q} x {gpu.block_kv} GPU tiles give more "
                "tile pairs than the analysis allows (MAX_TILE_PAIRS): use larger gpu.block_q / "
                "gpu.block_kv",
            )

    def plan(self, spec: Spec, tables: GpuTables) -> GpuKernelPlan:
        return GpuKernelPlan(tables, self.chip, spec.gpu_tiling)

    def tables(self, spec: Spec, patterns, tiles, spent):
        grid, gpu = patterns[0].grid, spec.gpu_tiling
        shape = KernelShape(
            grid.seq_len, grid.padded_seq_len, grid.block_q, grid.block_kv,
            spec.attention.head_dim, spec.attention.heads,
        )  # fmt: skip
        runs = [p.table.runs for p in patterns]
        return patterns, GpuTables.from_runs(runs, shape, gpu.block_q, gpu.block_kv)

    # The GPU kernel's tables live in global memory: no SMEM budget to check.
    def check_runtime_tables(self, spec: Spec, patterns, video_frames, tables) -> None:
        pass

    def check_chunk_tables(self, spec: Spec, chunked, tables) -> None:
        pass

    def check_select_tables(self, spec: Spec, always, candidate_runs, tables) -> None:
        pass

    def check_select_heads(self, spec: Spec, patterns) -> None:
        """The GPU kernel's selection reads one pattern's tiles, and no run-time ids."""
        if len(patterns) > 1:
            raise _select_error(
                spec,
                "select",
                f"a selection with heads of several patterns does not run in the {self.chip.name} "
                "(GPU) kernel yet; it runs in the TPU kernels (docs/limits.md)",
            )
        if spec.runtime.any:
            raise _select_error(
                spec,
                "select",
                f"a selection with runtime segments or text lengths does not run in the "
                f"{self.chip.name} (GPU) kernel yet; it runs in the TPU kernels (docs/limits.md)",
            )


def gpu_classification_tiling(spec: Spec, patterns: int) -> Tiling:
    """The tiles a GPU plan classifies at: the GPU tiles themselves (every GPU tile gets its
    own exact kind), or, where that grid would exceed MAX_TILE_PAIRS, the smallest power-of-two
    multiple of them that fits (each GPU tile then inherits the kind of the block it lies in,
    as svgen.core.gpu_tables does). `tiling.align` rounds at these tiles."""
    gpu, seq_len = spec.gpu_tiling, spec.geometry.seq_len
    bq, bkv = gpu.block_q, gpu.block_kv
    while -(-seq_len // bq) * -(-seq_len // bkv) * patterns > MAX_TILE_PAIRS:
        bq, bkv = 2 * bq, 2 * bkv
    return Tiling(bq, bkv, align=spec.tiling.align)


def _pattern_plans(
    spec: Spec, masks, layouts, progress, gpu_runs: bool = False
) -> tuple[list[PatternPlan], list, tuple[int, int]]:
    """Passes 2-5 for every candidate pattern at the spec's tiling: the pattern plans, per
    pattern its kernel tiles (kinds and compute-block words), and the row-set and product
    work spent (what later work of the same analysis counts against the same limits). gpu_runs: the runs are
    those of the tile kinds themselves (one compute block per tile): unlike the TPU kernel,
    the GPU kernel masks the padding keys of a FULL tile in a branch of its own
    (svgen.runtime.gpu), so the last key column need not run as BOUNDARY."""
    candidates = spec.head_patterns().candidates
    patterns, tiles = [], []
    # All candidates together: the estimate can miss work in rows it did not sample, and the
    # product analysis has none; these stop either long before it would run for minutes.
    with (
        ROW_SET_WORK.budget(int(ROW_SET_BACKSTOP * MAX_ROW_SET_WORK)) as row_sets,
        PRODUCT_WORK.budget(MAX_PRODUCT_WORK) as products,
    ):
        for candidate, mask, layout in zip(candidates, masks, layouts):
            try:
                plan, kernel = _pattern_plan(
                    spec, candidate.pattern, mask, layout, progress, gpu_runs
                )
            except WorkOverLimit as over:
                raise _work_error(spec, over, candidate.pattern, mask, layout) from None
            patterns.append(plan)
            tiles.append(kernel)
    return patterns, tiles, (row_sets.used, products.used)


def _pattern_plan(
    spec: Spec,
    name: str,
    mask,
    layout: TokenLayout,
    progress,
    gpu_runs: bool,
):
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
    plan = PatternPlan(
        name, layout, mask, grid, compute, classification, kinds, table, budget, None
    )
    return plan, tiles


def _with_residuals(
    spec: Spec, patterns: list[PatternPlan], tiles: list, spent: tuple[int, int]
) -> list[PatternPlan]:
    """The plans with residual masks on the BOUNDARY blocks of a static TPU kernel
    (svgen.analysis.residuals), within what the classification (`spent`) left of the work
    limits: one analysis, one budget."""
    out = []
    with (
        ROW_SET_WORK.budget(int(ROW_SET_BACKSTOP * MAX_ROW_SET_WORK) - spent[0]),
        PRODUCT_WORK.budget(MAX_PRODUCT_WORK - spent[1]),
    ):
        for plan, (kinds, blocks) in zip(patterns, tiles):
            # Residual masks are a speed-up, the kernel exact without them: where classifying
            # the mask's parts would pass the work limit (foreseen from the classification's
            # own work, or found on the way), every BOUNDARY block runs the whole mask.
            ratio = residuals.relative_work(plan.mask, plan.layout)
            if ratio is not None and spent[1] * ratio > MAX_PRODUCT_WORK - spent[1]:
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


def _check_block_masks(spec: Spec, target_name: str) -> None:
    """Block masks given as data (`blocks`) run in the TPU kernels over the module's own
    tables, forward and backward; the calls that build their tables on the device (run-time
    segments, KV-cache chunks, selections) and the GPU kernel do not read them yet."""
    term = _first_blocks_term(spec)
    if term is None:
        return
    where = (
        {}
        if term.where is None
        else {
            "file": term.where.file,
            "line": term.where.line,
            "column": term.where.column,
            "key": term.where.key,
        }
    )
    refused = [
        (is_gpu(target_name), f"the {target_name} (GPU) kernel"),
        (spec.runtime.any, "runtime: (packed videos, text lengths or frame offsets)"),
        (bool(spec.runtime.kv_cache), "runtime.kv_cache"),
        (spec.select is not None, "select"),
    ]
    for found, what in refused:
        if found:
            raise SpecError(
                f"a block mask given as data (blocks) does not run with {what} yet; it runs in "
                "the TPU kernels' static tables, forward and backward (docs/limits.md)",
                **where,
            )
    _check_block_table_size(spec, where)


def _check_block_table_size(spec: Spec, where: dict) -> None:
    """The kernels' table of each block mask (svgen.core.tables.block_table_shape) within
    MAX_BLOCK_TABLE_BYTES, before any table is built: small blocks over a long sequence make
    a table of many data blocks per compute block."""
    t = spec.tiling
    grid = TileGrid(spec.geometry.seq_len, t.block_q, t.block_kv)
    for term in _blocks_terms(spec):
        shape = block_table_shape(
            term.param("block"),
            t.cq,
            t.ckv,
            grid.num_q_blocks,
            grid.num_kv_blocks,
            t.block_q,
            t.block_kv,
        )
        size = 2 * int(np.prod(shape))  # bf16 on the device
        if size > MAX_BLOCK_TABLE_BYTES:
            raise SpecError(
                f"blocks of {term.param('block')} tokens make a kernel table of "
                f"{' x '.join(map(str, shape))} ({size:,} bytes), over the "
                f"{MAX_BLOCK_TABLE_BYTES:,} allowed (MAX_BLOCK_TABLE_BYTES): use larger blocks, "
                "or compute blocks nearer their size",
                **where,
            )


def _first_blocks_term(spec: Spec):
    """The first `blocks` term of the spec's masks (its mask, then its patterns), or None."""
    return next(iter(_blocks_terms(spec)), None)


def _blocks_terms(spec: Spec) -> list:
    """The `blocks` terms of the spec's masks (its mask, its patterns, a selection's
    candidate), depth first."""
    roots = ([spec.mask] if spec.mask is not None else []) + [t for _, t in spec.patterns]
    if spec.select is not None:
        roots.append(spec.select.candidate)
        roots.extend(own.candidate for own in spec.select.patterns)
    stack, found = list(reversed(roots)), []
    while stack:
        term = stack.pop()
        if term.op == "blocks":
            found.append(term)
        stack.extend(reversed(term.children))
    return found


def _static_kernel(spec: Spec) -> bool:
    """Tables fixed at compile time, walked as compiled: the kernels residual masks serve
    (run-time refinement, selections and chunked calls rebuild the tables on the device,
    and their blocks run the whole mask)."""
    return not spec.runtime.any and not spec.runtime.kv_cache and spec.select is None


# How far past MAX_ROW_SET_WORK the classifications may go before they are stopped: the
# estimate samples rows, so a mask whose work sits in rows the samples missed is caught there.
ROW_SET_BACKSTOP = 1.5


def _row_set_rows(spec: Spec, mask: ir.Node, layout: TokenLayout) -> int:
    """How many query rows `classify_tiles` builds row sets for (mirrors its dispatch): one
    frame's for a frame-invariant mask in frame-major order, none for a per-axis mask (its
    product boxes), else every row."""
    if (
        layout.text_tokens == 0
        and layout.frames > 1
        and layout.order == FRAME_MAJOR
        and mask.frame_invariant()
        and spec.tiling.align == "exact"
    ):
        return layout.tokens_per_frame
    return 0 if axis_terms.applies(mask, layout) else layout.seq_len


def check_row_set_work(spec: Spec, masks, layouts) -> None:
    """Refuse, before classifying anything, masks whose row sets would build more than
    MAX_ROW_SET_WORK intervals over all candidate patterns together (estimated from sampled
    rows, see rowsets.estimate_work): the work grows with terms x rows x intervals per row,
    which the limits on the spec's size do not bound."""
    t, left = spec.tiling, MAX_ROW_SET_WORK
    for candidate, mask, layout in zip(spec.head_patterns().candidates, masks, layouts):
        rows = _row_set_rows(spec, mask, layout)
        if rows == 0:
            continue
        work = rowsets.estimate_work(mask, layout, t.block_q, t.block_kv, rows, left)
        if work is None:
            raise _row_set_error(spec, candidate.pattern, rows, layout)
        left -= work


def _row_set_error(spec: Spec, name: str, rows: int, layout: TokenLayout) -> SpecError:
    return _mask_error(
        spec,
        name,
        f"needs more than {MAX_ROW_SET_WORK:,} row-set intervals to classify "
        f"(MAX_ROW_SET_WORK: the allowed keys of {rows:,} query rows in {layout.order} order "
        f"as intervals, summed over its terms and every candidate pattern); use fewer or "
        f"smaller terms (a union of many windows), fewer tokens, or built-ins the per-axis "
        f"analysis takes (at most {axis_terms.MAX_TERMS} terms once unions are expanded)",
    )


def _mask_error(spec: Spec, name: str, message: str) -> SpecError:
    """A SpecError at the mask key of pattern `name` (file:line:col)."""
    where = spec.pattern_mask(name).where
    which = f"pattern {name!r}" if spec.heads is not None else "the mask"
    if where is None:
        return SpecError(f"{which} {message}", file=spec.source, key="mask")
    return SpecError(
        f"{which} {message}", file=where.file, line=where.line, column=where.column, key=where.key
    )


def _work_error(spec: Spec, over: WorkOverLimit, name: str, mask, layout) -> SpecError:
    """The error of a classification stopped by its work budget."""
    if over.work is ROW_SET_WORK:
        return _row_set_error(spec, name, _row_set_rows(spec, mask, layout), layout)
    terms = len(axis_terms.polynomial(mask, (layout.frames, layout.height, layout.width)) or ())
    return _mask_error(
        spec,
        name,
        f"needs more than {MAX_PRODUCT_WORK:,} box pairs x terms to classify "
        f"(MAX_PRODUCT_WORK: {layout.seq_len:,} tokens in {layout.order} order, whose tiles "
        f"break into coordinate boxes, times the {terms} terms of its inclusion-exclusion "
        f"sum); use fewer primitives in one any_of or all_of, cubes that divide the geometry, "
        f"or fewer tokens",
    )


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


def _check_backward_tables(spec: Spec, patterns, tiles, chip: Target, smem_budget: int) -> None:
    """The dk/dv kernel walks transposed tables (per kv tile, its q tiles): a separate
    pallas_call whose tables must fit the SMEM budget on their own. Its runs come from the
    forward tiles (`tiles`: kernel kinds and words per pattern) as
    `svgen.core.tables.transposed_runs` finds them in the forward runs, vectorized; the
    piece size is chosen by the same rule as `transposed_tables`."""
    grid, compute, t = patterns[0].grid, patterns[0].compute_grid, spec.tiling
    transposed = TileGrid(grid.seq_len, grid.block_kv, grid.block_q)
    runs = [build_runs(*transposed_tiles(*kw, grid, compute), transposed) for kw in tiles]
    flat = walks_flat(len(runs), chip.cores_per_chip)
    slots = 1
    while True:
        tables = PieceTables.from_runs(runs, slots, spec.tiling.compute_blocks, flat)
        need = tables.scalar_prefetch_bytes(spec.attention.heads)
        if need <= smem_budget:
            return
        if slots >= MAX_SLOTS:
            break
        slots *= 2
    raise SpecError(
        f"the backward (dk, dv and dq) tables need {need:,} bytes of SMEM, over {smem_budget:,}: use "
        f"larger tiles (the backward walk of the transposed tables; tiling {t.block_q} x {t.block_kv})",
        file=spec.source,
        key=spec.tiling_source(spec.tiling_chip),
    )


def _video_frames(spec: Spec, patterns, progress) -> tuple:
    """runtime.per_video_frames: per pattern, its superset and frame tree
    (svgen.analysis.video_frames), or None for a mask that means the same at every segment
    start; () without the key, or when every pattern is such a mask."""
    if not spec.runtime.per_video_frames:
        return ()
    plans = tuple(_video_frame_plan(spec, p, progress, len(patterns) > 1) for p in patterns)
    return plans if any(plans) else ()


def _video_frame_plan(spec: Spec, pattern, progress, named: bool) -> VideoFramePlan | None:
    try:
        tree = video_frames.frame_tree(pattern.mask)
    except video_frames.NotPerVideo as refused:
        where = spec.runtime.frames_where
        which = f"pattern {pattern.name!r}: " if named else ""
        message = f"{which}{refused}"
        if where is None:
            raise SpecError(message, file=spec.source, key="runtime.per_video_frames") from None
        raise SpecError(
            message, file=where.file, line=where.line, column=where.column, key=where.key
        ) from None
    if tree.tree == ("group", 0):
        return None

    def runs_of(mask) -> np.ndarray:
        return _mask_runs(spec, pattern.name, mask, pattern.layout, progress)

    superset_runs = runs_of(video_frames.superset(pattern.mask, spec.geometry.frames))
    groups = tuple(runs_of(g) for g in tree.groups)
    return VideoFramePlan(superset_runs, groups, tree.tree, tree.groups)


def _check_runtime_tables(spec: Spec, runs, grid, slots: int, smem_budget: int) -> None:
    """A call with run-time inputs builds its tables at each pattern's static maximum (its
    static step count; with per-video frames, its superset's), per batch element; one
    element's must fit SMEM, for the forward walk and for the dk/dv walk (whose static steps
    are the same visited tiles plus at most one zero-fill step per kv tile)."""
    kv_tiles = grid.num_kv_blocks
    pieces = []
    for pattern_runs in runs:
        visited = int(sum(r[2] for r in pattern_runs if r[3] != TileKind.EMPTY))
        pieces.append(max(static_steps(pattern_runs), visited + kv_tiles))
    heads = spec.attention.heads
    need = runtime_table_bytes(pieces, slots, spec.tiling.compute_blocks, 1, heads)
    if need > smem_budget:
        raise SpecError(
            f"the run-time tables (runtime:) need {need:,} bytes of SMEM for one batch element, "
            f"over {smem_budget:,}: use larger tiles (each of the {sum(pieces):,} static steps "
            f"of all patterns keeps its own piece at run time)",
            file=spec.source,
            key="runtime",
        )


def _chunk_runs(spec: Spec, patterns, tiling: Tiling) -> tuple:
    """Every pattern's chunk runs (svgen.analysis.chunks), under the analysis's work budgets:
    their classification is the full sequence's at a finer row grain."""
    runtime = spec.runtime
    cf = runtime.chunk_frames
    with (
        ROW_SET_WORK.budget(int(ROW_SET_BACKSTOP * MAX_ROW_SET_WORK)),
        PRODUCT_WORK.budget(MAX_PRODUCT_WORK),
    ):
        try:
            if runtime.rolling:
                return tuple(_ring_runs(spec, p, tiling, len(patterns) > 1) for p in patterns)
            return tuple(chunks.chunk_runs(p.mask, p.layout, tiling, cf) for p in patterns)
        except WorkOverLimit as over:
            raise _kv_cache_error(
                spec,
                f"classifying every chunk position went over the analysis's work limit "
                f"({over}); use longer chunks or larger compute blocks",
            ) from None


def _ring_runs(spec: Spec, pattern, tiling: Tiling, named: bool):
    """A pattern's chunk runs against the rolling cache, which must hold every frame a
    chunk's mask keeps."""
    runtime = spec.runtime
    ring = RingCache(runtime.chunk_frames, runtime.sink_frames, runtime.window_frames)
    try:
        return chunks.ring_runs(pattern.mask, pattern.layout, tiling, ring)
    except chunks.EvictedFrames as evicted:
        raise _kv_cache_error(
            spec,
            f"{f'pattern {pattern.name!r}: ' if named else ''}the chunk at frame "
            f"{evicted.position * ring.chunk_frames} keeps frame {evicted.frame}, which a "
            f"ring of {ring.window_frames} frames (after {ring.sink_frames} sink frames) has "
            f"evicted: window_frames must be at least {evicted.need} for this mask, or the "
            "mask must not reach that far back",
        ) from None


def _check_chunk_tables(spec: Spec, chunked, slots: int, smem_budget: int) -> None:
    """The chunked calls' tables (every chunk position of every pattern, one table) in SMEM."""
    need = chunks.chunk_tables(chunked, slots, spec.tiling.compute_blocks).scalar_prefetch_bytes(
        spec.attention.heads
    )
    if need > smem_budget:
        raise _kv_cache_error(
            spec,
            f"the chunked calls' tables need {need:,} bytes of SMEM, over {smem_budget:,}: "
            "use larger tiles or longer chunks",
        )


def _candidate_runs(spec: Spec, always: PatternPlan, progress) -> np.ndarray:
    """The candidate region of the always-kept pattern's heads (select.candidate, or
    select.patterns.<name>.candidate) classified at the spec's tiles, in that pattern's
    layout: its runs (the compute blocks it touches are the ones a call may choose)."""
    select = spec.select.for_pattern(always.name)
    key = _candidate_key(spec, always.name)
    mask = ir.lower(spec, select.candidate)
    mask = _over_kernel_frame(spec, mask, always.layout, spec.layout, select.where, key)
    return _mask_runs(spec, key, mask, always.layout, progress)


def _candidate_key(spec: Spec, pattern: str) -> str:
    """Where the candidate of a pattern's heads is written (an entry that gives none holds
    the section's own)."""
    own = spec.select.own(pattern)
    if own is not None and own.candidate is not spec.select.candidate:
        return f"select.patterns.{pattern}.candidate"
    return "select.candidate"


def _mask_runs(spec: Spec, name: str, mask, layout: TokenLayout, progress) -> np.ndarray:
    """The runs of a mask besides the patterns' (a select candidate, a per-video superset or
    group) at the spec's tiles, under the analysis's work budgets; `name` says whose in
    errors."""
    with (
        ROW_SET_WORK.budget(int(ROW_SET_BACKSTOP * MAX_ROW_SET_WORK)),
        PRODUCT_WORK.budget(MAX_PRODUCT_WORK),
    ):
        try:
            plan, _ = _pattern_plan(spec, name, mask, layout, progress, False)
        except WorkOverLimit as over:
            raise _work_error(spec, over, name, mask, layout) from None
    return plan.table.runs


def _check_select_tables(
    spec: Spec, always: PatternPlan, candidate_runs, slots: int, smem_budget: int
) -> None:
    """A selection's tables hold every head's pieces at the static maximum (always-kept
    plus every selectable block), for the forward walk and the dk/dv walk (the same tiles
    plus at most one zero-fill step per kv tile); one batch element's must fit SMEM."""
    runs = selection_superset_runs(always.table.runs, candidate_runs, pattern_shape(spec, always))
    visited = int(sum(r[2] for r in runs if r[3] != TileKind.EMPTY))
    pieces = max(static_steps(runs), visited + always.grid.num_kv_blocks)
    heads = spec.attention.heads
    need = runtime_table_bytes([pieces], slots, spec.tiling.compute_blocks, 1, heads)
    if need > smem_budget:
        raise _select_error(
            spec,
            _candidate_key(spec, always.name),
            f"the selection tables need {need:,} bytes of SMEM for one batch element "
            f"({heads} heads x {pieces:,} steps at most), over {smem_budget:,}: narrow "
            "select.candidate or use larger tiles",
        )


def _select_error(spec: Spec, key: str, message: str) -> SpecError:
    """An error about the `select` section, at its line (a pattern's entry's, for its key)."""
    where = spec.select.where
    for own in spec.select.patterns:
        if key.startswith(f"select.patterns.{own.pattern}."):
            where = own.where or where
    return SpecError(
        message,
        file=spec.source,
        key=key,
        line=where.line if where else None,
        column=where.column if where else None,
    )


def _kv_cache_error(spec: Spec, message: str) -> SpecError:
    """An error about `runtime.kv_cache`, at its key."""
    where = spec.runtime.where
    if where is None:
        return SpecError(message, file=spec.source, key="runtime.kv_cache")
    return SpecError(message, file=where.file, line=where.line, column=where.column, key=where.key)


def query_coordinate_bound(mask: ir.Node) -> int:
    """At most how many query coordinates the mask's generated code reads (the kernel keeps
    each in VMEM, see svgen.runtime.forward): one per query symbol of its predicate, is_text
    twice (as bool and as int), and `place` when both rows and columns are read."""
    names = {s.name for s in mask.predicate().free_symbols if s.name.endswith("_q")}
    return len(names) + ("is_text_q" in names) + ({"h_q", "w_q"} <= names)


def _query_values(spec: Spec, mask, layout: TokenLayout, residual_masks=()) -> int:
    """How many query values (coordinates and query functions, each a [block_q, 128] int32
    buffer) a pattern's kernel keeps: those its printed masks read (mask_code), at least the
    mask's query symbols (query_coordinate_bound, what the VMEM model counted before it
    counted the printed code; kept so that no module's VMEM limit moved). An aligned pattern
    prints no mask."""
    printed = 0
    if not spec.tiling.aligned:
        per_video = spec.runtime.per_video_frames
        printed = mask_code.query_value_count(mask, layout, residual_masks, per_video)
    return max(query_coordinate_bound(mask), printed)


def vmem_need(spec: Spec, chip: Target, query_coords: int = 0, tiles=None) -> VmemNeed:
    """The kernel's VMEM need on `chip` at `tiles` (block_q, block_kv, compute_q, compute_kv;
    None: the spec's tiling)."""
    t = spec.tiling
    bq, bkv, cq, ckv = tiles or (t.block_q, t.block_kv, t.cq, t.ckv)
    a = spec.attention
    return kernel_vmem(bq, bkv, cq, ckv, a.head_dim, a.dtype, query_coords, chip.mxu_width)


def check_vmem(spec: Spec, chip: Target, query_coords: int = 0):
    """The kernel's VMEM need on `chip`; a SpecError (with a tiling that fits) when over."""
    t = spec.tiling

    def _spec_vmem(*tiles: int) -> VmemNeed:
        return vmem_need(spec, chip, query_coords, tiles)

    need = _spec_vmem(t.block_q, t.block_kv, t.cq, t.ckv)
    available = chip.vmem_bytes - VMEM_RESERVE
    if need.limit() <= available:
        return need
    bq, bkv, cq, ckv = t.block_q, t.block_kv, t.cq, t.ckv
    while _spec_vmem(bq, bkv, cq, ckv).limit() > available and max(bq, bkv) > 128:
        # Halve the larger side (and its compute block with it when it is the whole tile).
        if bq >= bkv:
            bq, cq = bq // 2, min(cq, bq // 2)
        else:
            bkv, ckv = bkv // 2, min(ckv, bkv // 2)
    hint = (
        f"tiling {{block_q: {bq}, block_kv: {bkv}, compute_q: {cq}, compute_kv: {ckv}}} "
        f"would fit ({_spec_vmem(bq, bkv, cq, ckv).limit() / MIB:.0f} MiB)"
    )
    raise SpecError(
        f"the kernel needs {need.limit() / MIB:.1f} MiB of VMEM at {t.block_q} x {t.block_kv} "
        f"tiles with {t.cq} x {t.ckv} compute blocks (blocks {need.pipeline / MIB:.1f}, "
        f"scratch {need.scratch / MIB:.1f}, compiler spills {need.temporaries / MIB:.1f} MiB), "
        f"over the {available / MIB:.0f} MiB a kernel may use on {chip.name} "
        f"({chip.vmem_bytes / MIB:.0f} MiB per TensorCore); {hint}",
        file=spec.source,
        key=spec.tiling_source(spec.tiling_chip),
    )


def _over_budget_error(spec: Spec, patterns, err, smem_budget) -> SpecError:
    """Says how many bytes, for which pattern, and which tile size would fit."""
    need = err.smallest.scalar_prefetch_bytes(spec.attention.heads)
    per_piece = err.smallest.bytes_per_piece
    biggest = max(range(len(patterns)), key=lambda i: int(err.smallest.num_pieces[i]))
    worst = patterns[biggest]
    hint = "no tile size up to 4096 x 4096 fits either"
    grid = worst.grid
    bq, bkv = grid.block_q, grid.block_kv
    while max(bq, bkv) < BLOCK_MAX:
        bq, bkv = min(2 * bq, BLOCK_MAX), min(2 * bkv, BLOCK_MAX)
        bigger = TileGrid(grid.seq_len, bq, bkv)
        try:
            with (
                ROW_SET_WORK.budget(int(ROW_SET_BACKSTOP * MAX_ROW_SET_WORK)),
                PRODUCT_WORK.budget(MAX_PRODUCT_WORK),
            ):
                kinds = [classify_tiles(p.mask, p.layout, bigger).kinds for p in patterns]
        except WorkOverLimit:
            break  # a hint is not worth more than the analysis itself
        runs = [build_runs(*kernel_tiles(k, bigger, bigger), bigger) for k in kinds]
        try:
            t = choose_piece_tables(runs, spec.attention.heads, smem_budget)
        except TableBudgetError:
            continue
        hint = (
            f"tiling {{block_q: {bq}, block_kv: {bkv}}} would fit "
            f"({t.scalar_prefetch_bytes(spec.attention.heads):,} bytes)"
        )
        break
    which = f"pattern {worst.name!r}" if len(patterns) > 1 else f"pattern {spec.name!r}"
    share = int(err.smallest.num_pieces[biggest]) * per_piece
    detail = f" ({share:,} of them for {which})" if len(patterns) > 1 else ""
    return SpecError(
        f"{which} needs {need:,} bytes of scalar-prefetch tables{detail} at "
        f"{grid.block_q} x {grid.block_kv} tiles, over the SMEM budget of {smem_budget:,} bytes "
        f"(--smem-budget); {hint}",
        file=spec.source,
        key=spec.tiling_source(spec.tiling_chip),
    )
