"""What the TPU kernels' tables need of SMEM, checked against the budget (--smem-budget): the
forward piece tables (a refusal says which tiling would fit), the backward kernels'
transposed tables, and the tables a call builds on the device (run-time inputs, KV-cache
chunks, selections) at their static maximum, one batch element's."""

from __future__ import annotations

from svgen.analysis import chunks
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.analysis.errors import candidate_key, kv_cache_error, select_error
from svgen.analysis.plan import PatternPlan, pattern_shape
from svgen.analysis.run import Settings
from svgen.analysis.tables import (
    MAX_SLOTS,
    TableBudgetError,
    build_runs,
    choose_piece_tables,
    kernel_tiles,
    transposed_tiles,
)
from svgen.analysis.targets import Target
from svgen.core.kinds import TileKind
from svgen.core.tables import (
    PieceTables,
    runtime_table_bytes,
    selection_superset_runs,
    static_steps,
    walks_flat,
)
from svgen.spec import BLOCK_MAX, Spec
from svgen.spec.errors import SpecError
from svgen.spec.limits import WorkOverLimit


def check_backward_tables(spec: Spec, patterns, tiles, chip: Target, smem_budget: int) -> None:
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
        f"the backward (dk, dv and dq) tables need {need:,} bytes of SMEM, over "
        f"{smem_budget:,}: use larger tiles (the backward walk of the transposed tables; "
        f"tiling {t.block_q} x {t.block_kv})",
        file=spec.source,
        key=spec.tiling_source(spec.tiling_chip),
    )


def check_runtime_tables(spec: Spec, runs, grid, slots: int, smem_budget: int) -> None:
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


def check_chunk_tables(spec: Spec, chunked, slots: int, smem_budget: int) -> None:
    """The chunked calls' tables (every chunk position of every pattern, one table) in SMEM."""
    need = chunks.chunk_tables(chunked, slots, spec.tiling.compute_blocks).scalar_prefetch_bytes(
        spec.attention.heads
    )
    if need > smem_budget:
        raise kv_cache_error(
            spec,
            f"the chunked calls' tables need {need:,} bytes of SMEM, over {smem_budget:,}: "
            "use larger tiles or longer chunks",
        )


def check_select_tables(
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
        raise select_error(
            spec,
            candidate_key(spec, always.name),
            f"the selection tables need {need:,} bytes of SMEM for one batch element "
            f"({heads} heads x {pieces:,} steps at most), over {smem_budget:,}: narrow "
            "select.candidate or use larger tiles",
        )


def over_budget_error(spec: Spec, patterns, err, smem_budget: int, settings: Settings) -> SpecError:
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
            with settings.work_budgets():
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
