"""The tuner's estimates: a candidate's per-path costs from those compiled for candidates of
the same compute-block shape and mask code (what libtpu's schedules show grows with the tile,
and what does not; svgen.estimate.tune's docstring)."""

from __future__ import annotations

from typing import Sequence

from svgen.estimate.paths import PathCosts, mean
from svgen.estimate.tune_rows import Candidate


def estimate_paths(points: Sequence[tuple[Candidate, object]], c: Candidate, seq_len: int):
    """Per-path costs of candidate `c` from the exact ones of `points` (candidates of the
    same compute-block shape, and their PathCosts), by what libtpu's schedules show:
      * bookkeeping, a compute block's cost by kind inside a BOUNDARY tile (FULL, BOUNDARY,
        BOUNDARY with the padding test) and the pipeline step do not depend on the tile;
      * a BOUNDARY tile's branch overhead grows with its number of blocks;
      * a FULL tile's straight-line body costs, per row of blocks, r0 + (blocks in the row)
        x c (the state is loaded and stored once per row): fitted when the points have two
        row lengths, else r0 = 0 through the one (over-estimating longer rows a little);
      * init and finalize grow with the q tile's rows.
    With one block per tile the kernel has no blocks word: a BOUNDARY tile is then the
    bookkeeping, the branch overhead of one block and one masked block."""
    first = points[0][1]
    bk = round(mean(p.bookkeeping for _, p in points))
    r0, per_block = _fit_rows(points)
    rk = c.block_kv // c.compute_kv
    full = bk + round((c.block_q // c.compute_q) * (r0 + rk * per_block))
    scale = [c.block_q / k.block_q for k, _ in points]
    init = tuple(
        round(mean(p.init[i] * r for (_, p), r in zip(points, scale)))
        for i in range(len(first.init))
    )
    finalize = round(mean(p.finalize * r for (_, p), r in zip(points, scale)))
    column = (seq_len - 1) % c.block_kv // c.compute_kv if seq_len % c.compute_kv else -1
    multi = [(k, p) for k, p in points if k.blocks > 1] or list(points)
    mixed, blocks = [], []
    for index in range(len(first.mixed)):
        overhead = mean((p.mixed[index] - p.bookkeeping) / k.blocks for k, p in multi)
        per_block_costs = [b for _, p in multi for b in p.block[index]]
        f = mean(b[0] for b in per_block_costs if b[0])
        b = mean(b[1] for b in per_block_costs)
        extra = max(x[2] - x[1] for x in per_block_costs)
        if c.blocks == 1:
            mixed.append(bk)
            blocks.append(((0, round(b + overhead), round(b + overhead + extra)),))
            continue
        mixed.append(bk + round(overhead * c.blocks))
        blocks.append(
            tuple(
                (round(f), round(b), round(b + extra) if i % rk == column else round(b))
                for i in range(c.blocks)
            )
        )
    return PathCosts(
        bk,
        full,
        tuple(mixed),
        tuple(blocks),
        init,
        finalize,
        round(mean(p.pipeline for _, p in points)),
    )


def _fit_rows(points) -> tuple[float, float]:
    """(r0, c) of a FULL tile's body per row of blocks, r0 + blocks_in_row * c, by least
    squares over the points (r0 = 0 when they all have one row length)."""
    xs = [k.block_kv // k.compute_kv for k, _ in points]
    ys = [(p.full - p.bookkeeping) / (k.block_q // k.compute_q) for k, p in points]
    if len(set(xs)) < 2:
        return 0.0, mean(y / x for x, y in zip(xs, ys))
    mx, my = mean(xs), mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope
