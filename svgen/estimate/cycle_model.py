"""The static model over the tables: a call's cycles, walking every head's tables as the
kernel does with the per-path costs read from libtpu's schedule (`model_cycles`), and what
`svgen cost` models with it: the dense kernel, a KV-cache module's chunked calls, a
selection's bounds, a training step, a bounded softmax's fallback, the useful work."""

from __future__ import annotations

import numpy as np

from svgen.core.kinds import TileKind
from svgen.estimate.cost_report import ChunkReport, TrainingReport, Utilisation
from svgen.estimate.measure import TrainingPaths, dkv_tables
from svgen.estimate.paths import SEGMENT_BOUNDARY, PathCosts


def model_cycles(
    paths: PathCosts,
    tables,
    head_pattern,
    padding_tile: int | None = None,
    grid_pieces: int | None = None,
) -> tuple[int, dict, dict]:
    """Cycles of one call over all heads, walking each head's tables as the kernel does;
    `padding_tile`: the kv tile holding padding keys (KernelShape.padding_kv_tile);
    `grid_pieces`: the per-head walk's grid length when it is not the tables' longest
    pattern (a chunked call's: its heads' longest)."""
    from svgen.core.tables import KIND_MASK, KV_BLOCK_MASK, KV_BLOCK_SHIFT, Q_BLOCK_SHIFT

    steps = {"full": 0, "mixed": 0, "empty": 0, "skipped": 0}
    by_path = {
        "bookkeeping": 0,
        "full": 0,
        "mixed": 0,
        "empty": 0,
        "skipped": 0,
        "init_finalize": 0,
        "pipeline": 2 * paths.pipeline,
    }
    for pattern in np.asarray(head_pattern).tolist():
        first, count = int(tables.first_piece[pattern]), int(tables.num_pieces[pattern])
        entries = tables.entries[first : first + count].astype(np.int64) & 0xFFFFFFFF
        lengths = (
            np.ones(count, np.int64)
            if tables.lengths is None
            else tables.lengths[first : first + count].astype(np.int64)
        )
        words = _unsigned_words(tables.blocks, first, count)
        variants = _unsigned_words(getattr(tables, "variants", None), first, count)
        kinds = entries & KIND_MASK
        q_tiles = len(np.unique(entries >> Q_BLOCK_SHIFT))
        # The one step of a piece that visits the kv tile holding padding keys.
        kv_start = (entries >> KV_BLOCK_SHIFT) & KV_BLOCK_MASK
        padding = (
            np.zeros(count, np.int64)
            if padding_tile is None
            else ((kv_start <= padding_tile) & (padding_tile < kv_start + lengths)).astype(np.int64)
        )
        for kind, word, variant, length, on_padding in _grouped(
            kinds, words, variants, lengths, padding
        ):
            # SEGMENT_BOUNDARY (run-time tables of one compute block per tile) is mixed too.
            name = {int(TileKind.FULL): "full", int(TileKind.EMPTY): "empty"}.get(
                int(kind), "mixed"
            )
            steps[name] += length
            by_path[name] += (length - on_padding) * paths.tile_cost(
                pattern, kind, word, False, variant
            ) + on_padding * paths.tile_cost(pattern, kind, word, True, variant)
        work = int(lengths.sum())
        # The flat walk gives a head its own pattern's pieces; the per-head one the longest's.
        longest = tables.max_pieces if grid_pieces is None else grid_pieces
        skipped = (count if tables.flat else longest) * tables.slots - work
        steps["skipped"] += skipped
        by_path["skipped"] += skipped * paths.bookkeeping
        by_path["init_finalize"] += q_tiles * (paths.init[pattern] + paths.finalize)
    total = sum(by_path.values())
    return total, steps, by_path


def _unsigned_words(table, first: int, count: int) -> np.ndarray:
    """Pieces first..first + count of a packed word table (blocks, variants) as unsigned
    int64, its sign extension masked off; zeros for a table the kernel does not have."""
    if table is None:
        return np.zeros(count, np.int64)
    return table[first : first + count].astype(np.int64) & ((1 << (8 * table.itemsize)) - 1)


def _grouped(kinds, words, variants, lengths, padding):
    """(kind, word, variants word, total length, steps on the padding tile) per distinct
    (kind, word, variants word)."""
    keys = np.stack([kinds, words, variants], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    totals = np.bincount(inverse, weights=lengths).astype(np.int64)
    on_padding = np.bincount(inverse, weights=padding).astype(np.int64)
    for (kind, word, variant), total, pad in zip(
        uniq.tolist(), totals.tolist(), on_padding.tolist()
    ):
        yield kind, word, variant, total, pad


def key_bytes(plan) -> int:
    """The bytes of k over all heads, one batch element (what a pass over k reads)."""
    a = plan.spec.attention
    return a.heads * plan.grid.seq_len * a.head_dim * (2 if a.dtype == "bfloat16" else 4)


def key_pass_cycles(plan) -> int:
    """A bounded softmax's XLA pass over k (svgen.runtime.softmax.key_bound): it reads k
    once, in cycles at the target's HBM bandwidth (its output, 512 B a head, is noise)."""
    return _hbm_cycles(plan, key_bytes(plan))


def _hbm_cycles(plan, nbytes: int) -> int:
    """Cycles to move `nbytes` at the target's HBM bandwidth (whole cycles, rounded down)."""
    return int(nbytes / plan.target.hbm_bytes_per_s * plan.target.clock_ghz * 1e9)


def pooling_floor(plan) -> int:
    """Cycles to read q and k once at the target's HBM bandwidth (what pooling must)."""
    a = plan.spec.attention
    size = 2 if a.dtype == "bfloat16" else 4
    qk_bytes = 2 * a.heads * plan.layout.seq_len * a.head_dim * size
    return _hbm_cycles(plan, qk_bytes)


def model_chunks(paths: PathCosts, plan, head_pattern) -> "ChunkReport":
    """Per chunk position, one chunked call over all heads: the position's tables (every
    pattern's), walked as model_cycles walks the full call's. The grid is as long as the
    longest head's pieces at that position, as the kernel's is."""
    from svgen.analysis.chunks import runs_of_position
    from svgen.core.tables import PieceTables

    runtime = plan.spec.runtime
    cf = runtime.chunk_frames
    cache_keys = runtime.cache_frames(plan.layout.frames) * plan.layout.tokens_per_frame
    steps, cycles = [], []
    for position in range(plan.layout.frames // cf):
        runs = [runs_of_position(r, position) for r in plan.chunk_runs]
        tables = PieceTables.from_runs(runs, plan.tables.slots, plan.spec.tiling.compute_blocks)
        longest = max(int(tables.num_pieces[p]) for p in head_pattern)
        total, position_steps, _ = model_cycles(
            paths, tables, head_pattern, padding_tile(plan, cache_keys), grid_pieces=longest
        )
        steps.append(position_steps)
        cycles.append(total)
    return ChunkReport(cf, paths, tuple(steps), tuple(cycles))


def model_head_pattern(plan) -> list[int]:
    """The static assignment; for run-time specs, candidates in turn (an assumption: the
    report says so)."""
    if plan.assign is not None:
        return list(plan.assign)
    return [h % len(plan.patterns) for h in range(plan.spec.attention.heads)]


def dense_cycles(paths: PathCosts, plan) -> int:
    """The same kernel's paths on a mask that keeps every pair (pattern 0's BOUNDARY costs
    for the compute blocks that hold padding keys)."""
    from svgen.core.tables import PieceTables

    tables = PieceTables.from_runs([_dense_runs(plan)], 1, plan.spec.tiling.compute_blocks)
    heads = plan.spec.attention.heads
    total, _, _ = model_cycles(paths, tables, [0] * heads, padding_tile(plan))
    return total


def _dense_runs(plan):
    """The runs of a mask that keeps every pair, at the plan's tiles and compute blocks."""
    from svgen.analysis.tables import build_runs, kernel_tiles

    compute = plan.patterns[0].compute_grid
    full = np.full((compute.num_q_blocks, compute.num_kv_blocks), TileKind.FULL, np.int8)
    return build_runs(*kernel_tiles(full, plan.grid, compute), plan.grid)


def padding_tile(plan, keys: int | None = None) -> int | None:
    """The kv tile holding padding keys, as the kernel computes it (KernelShape); keys: the
    kv side's length when it is not the sequence's (a rolling cache's)."""
    seq_len, t = keys or plan.grid.seq_len, plan.spec.tiling
    return None if seq_len % t.ckv == 0 else (seq_len - 1) // t.block_kv


def utilisation(plan) -> Utilisation | None:
    """Useful FLOPs of a call under the plan's head assignment (`model_head_pattern`)."""
    if plan.spec.select is not None:
        return None
    heads = model_head_pattern(plan)
    counts = [plan.patterns[p].classification for p in heads]
    per_pair = 4 * plan.spec.attention.head_dim
    return Utilisation(
        flops=per_pair * sum(c.kept_pairs for c in counts),
        exact=all(c.density_is_exact for c in counts),
        dense_flops=per_pair * len(heads) * plan.patterns[0].total_pairs,
        peak_flops_per_s=plan.target.bf16_flops_per_core_s,
    )


def fallback_cycles(paths: PathCosts, plan, head_pattern) -> tuple[int, int] | None:
    """A bounded kernel's call and dense call if every q tile ran its online twin."""
    if paths.fallback is None:
        return None
    cycles = model_cycles(paths.fallback, plan.tables, head_pattern, padding_tile(plan))[0]
    return cycles, dense_cycles(paths.fallback, plan)


def model_select(paths: PathCosts, plan, chooser=None) -> dict:
    """A select spec's call at its two bounds: nothing selected (the mask's blocks, walked
    per head as a selection's tables are) and every selectable block selected (a FULL
    block, PADDED where it holds the end of the keys): {bound: (cycles, steps)}. What a
    call costs in between depends on its activations (bench/select_cost.py); with the
    module's `chooser` (attention.select), also "sampled": the call at the spec's own amount
    on the blocks it selects from normal random q and k (`sampled_selection`)."""
    from svgen.core.tables import PieceTables, runs_of_blocks, tile_grid
    from svgen.analysis.plan import pattern_shape

    shape = pattern_shape(plan.spec, plan.only)
    grid = tile_grid(shape)
    always, selectable = plan.select_blocks()
    chosen = np.full(always.shape, int(TileKind.FULL), np.int8)
    if shape.seq_len % shape.ckv:
        chosen[:, shape.seq_len // shape.ckv] = SEGMENT_BOUNDARY  # PADDED
    heads = plan.spec.attention.heads

    def walk(blocks, heads_walking: int):
        runs = runs_of_blocks(blocks.astype(np.int8), *grid)
        tables = PieceTables.from_runs([runs], plan.tables.slots, shape.compute_blocks, False)
        cycles, steps, _ = model_cycles(paths, tables, [0] * heads_walking, padding_tile(plan))
        return cycles, steps

    out = {
        "none": walk(always, heads),
        "all": walk(np.where(selectable, chosen, always), heads),
    }
    if chooser is not None:
        per_head = [
            walk(np.where(picked, chosen, always), 1) for picked in sampled_selection(plan, chooser)
        ]
        steps = {kind: sum(st[kind] for _, st in per_head) for kind in per_head[0][1]}
        out["sampled"] = (sum(c for c, _ in per_head), steps)
    return out


def sampled_selection(plan, chooser, seed: int = 0) -> np.ndarray:
    """bool [heads, row blocks, col blocks]: what a call at the spec's own amount selects
    from q and k of independent standard normal tokens. Their compute-block means are normal
    with variance 1 / block, so they are drawn directly (no sequence-long inputs); rows of
    random activations score alike, so a top_p call selects more than real activations do."""
    from svgen.runtime.select import reference_selection

    rng = np.random.default_rng(seed)
    rows, cols = chooser.selectable.shape
    heads, d = plan.spec.attention.heads, plan.spec.attention.head_dim
    cq, ckv = plan.spec.tiling.cq, plan.spec.tiling.ckv
    q = rng.standard_normal((heads, rows, d)) / np.sqrt(cq)
    k = rng.standard_normal((heads, cols, d)) / np.sqrt(ckv)
    scores = np.einsum("hrd,hcd->hrc", q, k) / np.sqrt(d)
    policy = chooser.policy
    return reference_selection(
        scores.astype(np.float32), chooser.selectable, policy, policy.default
    )


def model_training(paths: TrainingPaths, plan, module) -> TrainingReport:
    """Cycles of the forward (with lse), dq and dk/dv kernels over all heads, each walking
    its own tables as the kernels do, and the same on a dense mask.

    With dq fused into the dk/dv walk, its HBM traffic is charged as well, since the static
    schedule does not show it: each step with work writes its query tile's dq back (f32) and
    waits (the read overlaps the step's matmuls), and the wrapper zeroes dq before and
    scales it after (two f32 passes and one in q's dtype)."""
    from svgen.core.tables import PieceTables, transposed_tables

    head_pattern = model_head_pattern(plan)
    transposed = dkv_tables(module)
    runs = _dense_runs(plan)
    dense = PieceTables.from_runs([runs], 1, plan.spec.tiling.compute_blocks)
    dense_t = transposed_tables([runs], module.SHAPE, module.HEADS)
    kernels = [
        ("forward", paths.forward, plan.tables, dense, padding_tile(plan)),
        ("dkv", paths.dkv, transposed, dense_t, None),  # zero-padded: no padding variant
    ]
    if paths.dq is not None:
        kernels.insert(1, ("dq", paths.dq, plan.tables, dense, None))
    cycles, steps, dense_cycles = {}, {}, {}
    heads = [0] * len(head_pattern)
    for name, kernel_paths, tables, dense_tables, padding in kernels:
        cycles[name], steps[name], _ = model_cycles(kernel_paths, tables, head_pattern, padding)
        dense_cycles[name] = model_cycles(kernel_paths, dense_tables, heads, padding)[0]
    if paths.fused:
        cycles["dq_hbm"] = _dq_hbm_cycles(plan, steps["dkv"], module)
        dense_steps = model_cycles(paths.dkv, dense_t, heads)[1]
        dense_cycles["dq_hbm"] = _dq_hbm_cycles(plan, dense_steps, module)
    return TrainingReport(paths, cycles, steps, dense_cycles)


def _dq_hbm_cycles(plan, dkv_steps: dict, module) -> int:
    """The fused walk's dq traffic in cycles at the target's HBM bandwidth (see above)."""
    d = module.HEAD_DIM
    tile_bytes = plan.spec.tiling.block_q * d * 4  # one query tile of dq, f32
    work = dkv_steps["full"] + dkv_steps["mixed"]
    rows = module.HEADS * module.PADDED_SEQ_LEN * d
    wrapper_bytes = rows * (4 + 4 + np.dtype(module.DTYPE).itemsize)
    seconds = (work * tile_bytes + wrapper_bytes) / plan.target.hbm_bytes_per_s
    return int(round(seconds * plan.target.clock_ghz * 1e9))
