"""Tile classification: EMPTY / BOUNDARY / FULL for every (q tile, kv tile) pair.

Three paths, all exact for built-ins, in every layout: masks whose keys do not depend on the
query's frame (a temporal head, frame-major) from one frame's rows
(`_classify_frame_invariant`); other masks made only of per-axis built-ins (windows, temporal
strides, cube windows, first frames, causal and block-causal frames, text, and any / all /
not of them) from exact pair counts over product boxes of coordinates
(`svgen.analysis.product`: no per-row key sets, so a 3-D window costs its blocks, not ~175
intervals per row); every other mask through the row sets:

Query rows are processed in chunks of whole q tiles. For each chunk, the mask's row bounds
(`rowsets`) are turned into per-tile counts with two difference arrays:
  * `full_rows[t, j]`: rows of q tile t whose certainly-allowed keys cover all real keys of
    kv tile j; the tile is FULL when that is every real row of t;
  * `touching_rows[t, j]`: rows whose possibly-allowed keys meet kv tile j; the tile is EMPTY
    when that is zero.
Both cost O(intervals), never O(rows x tiles). Padding rows and keys are outside every
interval, so they never make a tile non-empty, and "full" means every *real* pair.

Sound by construction (lo <= keep <= hi); exact when lo == hi, i.e. for built-in primitives.

With `count_pairs` (what `tiling.align` needs) the same chunks also yield the kept pairs of
every BOUNDARY block (interval lengths cut at block edges, added up with bincount) and, per q
block, how many rows have keys at all and how many have none in the last kv block column:
O(intervals) again, never an N x N array.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from svgen import ir
from svgen.analysis import axis_terms, product
from svgen.analysis.intervals import IntervalSet, ragged_arange
from svgen.analysis.key_sets import RowChunk
from svgen.analysis.rowsets import row_bounds
from svgen.core.layout import FRAME_MAJOR, TokenLayout
from svgen.core.kinds import TileKind

# Chunk size: at most this many rows, and about this many intervals (a temporal head in
# frame-major order emits one interval per frame per row, a spatial window in temporal-major
# order one per place): bounds the memory of a chunk while keeping NumPy calls large.
TARGET_ROWS_PER_CHUNK = 1 << 15
TARGET_INTERVALS_PER_CHUNK = 1 << 22
# User predicates: up to this many pairs left open by the proofs are evaluated exactly (which
# settles the count and the tile kinds); beyond it, counts are bounds and tiles stay BOUNDARY.
MAX_UNDECIDED_PAIRS = 1 << 26
# ... in batches of this many pairs: the oracle keeps a few arrays of this size per node of
# the predicate, tens of MB each.
PAIRS_PER_BATCH = 1 << 20


@dataclasses.dataclass(frozen=True)
class TileGrid:
    seq_len: int
    block_q: int
    block_kv: int
    # Rows when they are not the keys' seq_len: a KV-cache chunk's (svgen.analysis.chunks).
    q_len: int | None = None

    @property
    def num_q_blocks(self) -> int:
        return -(-(self.q_len or self.seq_len) // self.block_q)

    @property
    def num_kv_blocks(self) -> int:
        return -(-self.seq_len // self.block_kv)

    @property
    def padded_seq_len(self) -> int:
        return max(self.num_q_blocks * self.block_q, self.num_kv_blocks * self.block_kv)

    def real_pairs(self, q: np.ndarray, kv: np.ndarray) -> np.ndarray:
        """Real (query, key) pairs of blocks (q, kv) (int64, broadcast): the last row and
        column of blocks are cut short by the end of the sequence."""
        rows = np.minimum((q + 1) * self.block_q, self.seq_len) - q * self.block_q
        keys = np.minimum((kv + 1) * self.block_kv, self.seq_len) - kv * self.block_kv
        return np.asarray(rows, np.int64) * keys


@dataclasses.dataclass(frozen=True)
class PairCounts:
    """What aligning a classification needs besides the kinds (see svgen.analysis.align):
    FULL blocks keep all their real pairs and EMPTY ones none, so only BOUNDARY blocks are
    counted; rows are counted per q block, all that `rows_emptied` depends on."""

    boundary_index: np.ndarray  # int64 [n]: flat q_block * num_kv_blocks + kv_block, sorted
    boundary_pairs: np.ndarray  # int64 [n]: kept real pairs of each of those blocks
    rows_with_keys: np.ndarray  # int64 [num_q_blocks]: real rows allowed at least one key
    rows_without_last: np.ndarray  # int64 [num_q_blocks]: ... and none in the last kv block


@dataclasses.dataclass(frozen=True)
class Classification:
    kinds: np.ndarray  # int8 [num_q_blocks, num_kv_blocks] of TileKind
    kept_pairs: int  # exact number of allowed real (q, k) pairs (lower bound if not exact)
    kept_pairs_upper: int  # equal to kept_pairs when exact
    unproven_tiles: int  # BOUNDARY tiles that might be EMPTY or FULL, unsettled (over budget)
    pairs: PairCounts | None = None  # only with count_pairs, and only when exact

    @property
    def density_is_exact(self) -> bool:
        return self.kept_pairs == self.kept_pairs_upper


def classify_tiles(
    mask: ir.Node,
    layout: TokenLayout,
    grid: TileGrid,
    progress: Callable[[int, int], None] | None = None,
    count_pairs: bool = False,
) -> Classification:
    """Kinds per (q block, kv block) of `grid`, and the kept-pair count; with `count_pairs`,
    also `PairCounts` (None when a user predicate left pairs unevaluated: counts would be
    bounds)."""
    if (
        layout.text_tokens == 0
        and layout.frames > 1
        and layout.order == FRAME_MAJOR
        and mask.frame_invariant()
        and not count_pairs
    ):
        return _classify_frame_invariant(mask, layout, grid, progress)
    if axis_terms.applies(mask, layout):
        # Per-axis masks: exact counts per block from product boxes, no per-row sets.
        return _classify_per_axis(mask, layout, grid, progress, count_pairs)
    nq, nk = grid.num_q_blocks, grid.num_kv_blocks
    kinds = np.empty((nq, nk), np.int8)
    max_tiles_per_chunk = max(1, TARGET_ROWS_PER_CHUNK // grid.block_q)
    tiles_per_chunk = 1  # the first chunk measures how many intervals a row needs
    lower = upper = counted = unproven = 0
    budget = MAX_UNDECIDED_PAIRS
    counter = _PairCounter(grid) if count_pairs else None
    first_tile = 0
    while first_tile < nq:
        last_tile = min(first_tile + tiles_per_chunk, nq)
        first_row = first_tile * grid.block_q
        chunk = RowChunk(
            layout,
            grid.block_q,
            grid.block_kv,
            first_row,
            min(last_tile * grid.block_q, layout.seq_len) - first_row,
        )
        bounds = row_bounds(mask, chunk)
        real_rows = _real_rows(chunk, first_tile, last_tile)[:, None]
        full = _full_rows(chunk, bounds.lo, nk) == real_rows
        touched = _touching_rows(chunk, bounds.hi, nk) > 0
        chunk_kinds = _tile_kinds(full, touched)
        lower += bounds.lo.total_length()
        upper += bounds.hi.total_length()
        evaluated = None
        if not bounds.is_exact:
            # Pairs the proofs left open (possible but not certain). Within the budget they
            # are evaluated with the oracle, which settles both the count and the tile kinds.
            undecided = bounds.hi.intersection(bounds.lo.complement_within(chunk.universe))
            maybe_empty = _touching_rows(chunk, bounds.lo, nk) == 0
            maybe_full = _full_rows(chunk, bounds.hi, nk) == real_rows
            open_tiles = (chunk_kinds == TileKind.BOUNDARY) & (maybe_empty | maybe_full)
            if undecided.total_length() <= budget:
                budget -= undecided.total_length()
                evaluated = _evaluate_open_pairs(mask, chunk, undecided, nk)
                allowed, per_tile_allowed, per_tile_open = evaluated[:3]
                counted += allowed
                chunk_kinds[open_tiles & maybe_empty & (per_tile_allowed == 0)] = TileKind.EMPTY
                chunk_kinds[open_tiles & maybe_full & (per_tile_allowed == per_tile_open)] = (
                    TileKind.FULL
                )
            else:
                budget = -1  # counts are bounds from here on
                unproven += int(np.count_nonzero(open_tiles))
        kinds[first_tile:last_tile] = chunk_kinds
        if counter is not None:
            counter.add(chunk, first_tile, chunk_kinds, bounds.lo, evaluated)
        if progress is not None:
            progress(last_tile, nq)
        per_tile = (len(bounds.lo) + len(bounds.hi)) / (last_tile - first_tile) + 1
        tiles_per_chunk = int(
            np.clip(TARGET_INTERVALS_PER_CHUNK // per_tile, 1, max_tiles_per_chunk)
        )
        first_tile = last_tile
    kept = lower + counted
    exact = budget >= 0
    pairs = counter.result() if counter is not None and exact else None
    return Classification(kinds, kept, kept if exact else upper, unproven, pairs)


def _classify_per_axis(mask, layout, grid, progress, count_pairs: bool) -> Classification:
    """Per-axis masks (svgen.analysis.product): exact, pair counts included."""
    got = product.classify_product(mask, layout, grid, progress, boundary_counts=count_pairs)
    pairs = None
    if count_pairs:
        pairs = PairCounts(
            got.boundary_index, got.boundary_pairs, *product.rows_with_keys(layout, mask, grid)
        )
    return Classification(got.kinds, got.kept, got.kept, 0, pairs)


def _classify_frame_invariant(
    mask: ir.Node, layout: TokenLayout, grid: TileGrid, progress
) -> Classification:
    """For masks whose row sets do not depend on the query's frame (a temporal head).

    Query rows (f, p) and (f', p) allow the same keys, so the row sets of one frame's S rows
    say everything: per kv tile j, cover[p, j] (does row p cover / touch tile j) is summed over
    the rows of each q tile through prefix sums over p, a q tile's rows being the positions
    v0..v1, i.e. p = v mod S. Work: S rows instead of N.
    """
    s, nq, nk = layout.tokens_per_frame, grid.num_q_blocks, grid.num_kv_blocks
    chunk = RowChunk(layout, grid.block_q, grid.block_kv, 0, s)
    bounds = row_bounds(mask, chunk)  # exact: frame-invariant masks contain no user predicate
    one_tile_chunk = RowChunk(layout, s, grid.block_kv, 0, s)  # all S rows as "q tile 0"
    first = np.arange(nq, dtype=np.int64) * grid.block_q
    last = np.minimum(first + grid.block_q, layout.seq_len)
    # The sum of cover[v mod S] over v in [a, b) is F(b) - F(a) with
    # F(x) = (x // S) * prefix[S] + prefix[x mod S]: only these prefix rows are needed.
    wanted = np.concatenate([first % s, last % s, [s]])

    def rows_over(runs_of, bound):
        prefix = _row_prefix_sums(one_tile_chunk, bound, nk, runs_of, wanted)
        at_first, at_last, period = prefix[:nq], prefix[nq : 2 * nq], prefix[-1].astype(np.int64)
        return (last // s)[:, None] * period + at_last - (first // s)[:, None] * period - at_first

    full = rows_over(_full_runs, bounds.lo) == (last - first)[:, None]
    touched = rows_over(_touching_runs, bounds.hi) > 0
    if progress is not None:
        progress(nq, nq)
    kept = bounds.lo.total_length() * layout.frames
    return Classification(_tile_kinds(full, touched), kept, kept, 0)


def _tile_kinds(full: np.ndarray, touched: np.ndarray) -> np.ndarray:
    """FULL where every real row covers the tile, else BOUNDARY where any row meets it."""
    return np.where(
        full, TileKind.FULL, np.where(touched, TileKind.BOUNDARY, TileKind.EMPTY)
    ).astype(np.int8)


PREFIX_ROWS_PER_BLOCK = 1024


def _row_prefix_sums(
    chunk: RowChunk, s: IntervalSet, nk: int, runs_of, wanted: np.ndarray
) -> np.ndarray:
    """prefix[i, j] = number of rows < wanted[i] whose runs (full or touching) contain kv
    tile j. Rows are streamed in blocks, so memory is O(block x nk + wanted x nk)."""
    row = s.starts // chunk.stride
    _, first, last = runs_of(chunk, s)
    keep = last > first
    row, first, last = row[keep], first[keep], last[keep]
    order = np.argsort(wanted, kind="stable")
    out = np.zeros((wanted.size, nk), np.int32)
    running = np.zeros(nk, np.int32)
    width = nk + 1
    w = 0
    for lo in range(0, chunk.num_rows + 1, PREFIX_ROWS_PER_BLOCK):
        hi = min(lo + PREFIX_ROWS_PER_BLOCK, chunk.num_rows)
        sel = (row >= lo) & (row < hi)
        local = (row[sel] - lo) * width
        diff = np.bincount(local + first[sel], minlength=(hi - lo) * width) - np.bincount(
            local + last[sel], minlength=(hi - lo) * width
        )
        cover = np.cumsum(diff.reshape(hi - lo, width), axis=1)[:, :nk].astype(np.int32)
        block_prefix = running + np.concatenate(
            [np.zeros((1, nk), np.int32), np.cumsum(cover, axis=0, dtype=np.int32)]
        )
        # Rows lo..hi of the prefix are block_prefix[0..hi-lo].
        while w < wanted.size and wanted[order[w]] <= hi:
            out[order[w]] = block_prefix[wanted[order[w]] - lo]
            w += 1
        running = block_prefix[-1]
    return out


def _real_rows(chunk: RowChunk, first_tile: int, last_tile: int) -> np.ndarray:
    starts = np.arange(first_tile, last_tile) * chunk.block_q
    return np.minimum(starts + chunk.block_q, chunk.layout.seq_len) - starts


def _split_rows(chunk: RowChunk, s: IntervalSet):
    row = s.starts // chunk.stride
    base = row * chunk.stride
    return chunk.q_tile_of(row), s.starts - base, s.ends - base


def _count_runs(chunk: RowChunk, q_tile, first, last, nk) -> np.ndarray:
    """counts[t, j] = number of runs [first, last) of q tile t containing kv tile j."""
    num_tiles = chunk.num_q_tiles
    keep = last > first
    width = nk + 1
    index = np.concatenate([q_tile[keep] * width + first[keep], q_tile[keep] * width + last[keep]])
    weight = np.concatenate([np.ones(keep.sum()), -np.ones(keep.sum())])
    diff = np.bincount(index, weight, minlength=num_tiles * width).reshape(num_tiles, width)
    return np.cumsum(diff, axis=1)[:, :nk].astype(np.int64)


def _full_runs(chunk: RowChunk, s: IntervalSet):
    """Per interval: its q tile and the kv tiles [first, last) it covers entirely."""
    q_tile, start, end = _split_rows(chunk, s)
    bkv = chunk.block_kv
    first = -(-start // bkv)
    # An interval reaching the last real key covers the real part of the last tile.
    last = np.where(end >= chunk.layout.seq_len, -(-chunk.layout.seq_len // bkv), end // bkv)
    return q_tile, first, last


def _touching_runs(chunk: RowChunk, s: IntervalSet):
    """Per interval: its q tile and the kv tiles [first, last) it meets."""
    q_tile, start, end = _split_rows(chunk, s)
    bkv = chunk.block_kv
    return q_tile, start // bkv, -(-end // bkv)


def _full_rows(chunk: RowChunk, s: IntervalSet, nk: int) -> np.ndarray:
    return _count_runs(chunk, *_full_runs(chunk, s), nk)


def _touching_rows(chunk: RowChunk, s: IntervalSet, nk: int) -> np.ndarray:
    return _count_runs(chunk, *_touching_runs(chunk, s), nk)


def evaluated_pairs(mask: ir.Node, chunk: RowChunk, pairs: IntervalSet):
    """The oracle over `pairs` (intervals on the chunk's line), PAIRS_PER_BATCH at a time:
    per batch (line positions, local rows, keys, allowed bool)."""
    lengths = pairs.ends - pairs.starts
    cuts = np.searchsorted(np.cumsum(lengths), np.arange(0, lengths.sum(), PAIRS_PER_BATCH))
    edges = sorted(set(cuts.tolist()) | {0, len(pairs)})
    for lo, hi in zip(edges[:-1], edges[1:]):
        line = np.repeat(pairs.starts[lo:hi], lengths[lo:hi]) + ragged_arange(lengths[lo:hi])
        row = line // chunk.stride
        key = line - row * chunk.stride
        q = chunk.layout.coordinates(chunk.first_row + row)
        yield line, row, key, mask.evaluate(q, chunk.layout.coordinates(key))


def _evaluate_open_pairs(mask: ir.Node, chunk: RowChunk, pairs: IntervalSet, nk: int):
    """Evaluate `pairs` (row, key intervals) with the dense oracle, in batches.

    Returns (allowed pairs, allowed per tile, evaluated per tile, allowed per row, allowed per
    row in the last kv tile), tiles indexed as the chunk's [q tile, kv tile], rows local.
    """
    num_tiles = chunk.num_q_tiles
    per_tile_allowed = np.zeros(num_tiles * nk, np.int64)
    per_tile_open = np.zeros(num_tiles * nk, np.int64)
    per_row = np.zeros(chunk.num_rows, np.int64)
    per_row_last = np.zeros(chunk.num_rows, np.int64)
    for _, row, key, allowed in evaluated_pairs(mask, chunk, pairs):
        tile = chunk.q_tile_of(row) * nk + key // chunk.block_kv
        per_tile_allowed += np.bincount(tile, allowed, minlength=per_tile_allowed.size).astype(
            np.int64
        )
        per_tile_open += np.bincount(tile, minlength=per_tile_open.size)
        per_row += np.bincount(row, allowed, minlength=per_row.size).astype(np.int64)
        last = allowed & (key // chunk.block_kv == nk - 1)
        per_row_last += np.bincount(row, last, minlength=per_row.size).astype(np.int64)
    shape = (num_tiles, nk)
    return (
        int(per_tile_allowed.sum()),
        per_tile_allowed.reshape(shape),
        per_tile_open.reshape(shape),
        per_row,
        per_row_last,
    )


class _PairCounter:
    """Accumulates `PairCounts` chunk by chunk (see classify_tiles)."""

    def __init__(self, grid: TileGrid):
        self.grid = grid
        self.index: list[np.ndarray] = []
        self.pairs: list[np.ndarray] = []
        self.rows_with_keys = np.zeros(grid.num_q_blocks, np.int64)
        self.rows_without_last = np.zeros(grid.num_q_blocks, np.int64)

    def add(
        self,
        chunk: RowChunk,
        first_tile: int,
        chunk_kinds: np.ndarray,
        certain: IntervalSet,
        evaluated,
    ) -> None:
        nk = self.grid.num_kv_blocks
        per_block = _pairs_per_block(chunk, certain, nk)
        per_row, per_row_last = _pairs_per_row(chunk, certain, nk)
        if evaluated is not None:
            per_block += evaluated[1]
            per_row += evaluated[3]
            per_row_last += evaluated[4]
        local = np.flatnonzero(chunk_kinds.ravel() == TileKind.BOUNDARY)
        self.index.append(first_tile * nk + local)
        self.pairs.append(per_block.ravel()[local])
        q_block = chunk.q_tile_of(np.arange(chunk.num_rows)) + first_tile
        has = per_row > 0
        self.rows_with_keys += np.bincount(q_block[has], minlength=self.grid.num_q_blocks)
        self.rows_without_last += np.bincount(
            q_block[has & (per_row_last == 0)], minlength=self.grid.num_q_blocks
        )

    def result(self) -> PairCounts:
        def joined(parts):
            return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

        return PairCounts(
            joined(self.index), joined(self.pairs), self.rows_with_keys, self.rows_without_last
        )


def _pairs_per_block(chunk: RowChunk, s: IntervalSet, nk: int) -> np.ndarray:
    """counts[t, j] = allowed pairs of the chunk's q tile t in kv tile j, from the intervals:
    the kv tiles an interval covers whole through a difference array, the (at most two) it
    cuts by its length there."""
    q_tile, start, end = _split_rows(chunk, s)
    bkv = chunk.block_kv
    first, last = start // bkv, (end - 1) // bkv  # the kv tiles it meets (inclusive)
    whole_from = -(-start // bkv)  # kv tiles [whole_from, whole_to) lie inside it entirely
    whole_to = end // bkv
    counts = bkv * _count_runs(chunk, q_tile, whole_from, whole_to, nk)
    width = nk + 1
    one = (first == last) & (whole_to <= whole_from)  # inside one kv tile, not all of it
    cut_head = ~one & (start % bkv != 0)
    cut_tail = ~one & (end % bkv != 0)
    index = np.concatenate(
        [
            q_tile[one] * width + first[one],
            q_tile[cut_head] * width + first[cut_head],
            q_tile[cut_tail] * width + last[cut_tail],
        ]
    )
    length = np.concatenate(
        [
            end[one] - start[one],
            whole_from[cut_head] * bkv - start[cut_head],
            end[cut_tail] - whole_to[cut_tail] * bkv,
        ]
    )
    partial = np.bincount(index, length, minlength=chunk.num_q_tiles * width)
    return counts + np.rint(partial).astype(np.int64).reshape(-1, width)[:, :nk]


def _pairs_per_row(chunk: RowChunk, s: IntervalSet, nk: int) -> tuple[np.ndarray, np.ndarray]:
    """(allowed keys, allowed keys in the last kv tile) per local row of the chunk."""
    row = s.starts // chunk.stride
    start, end = s.starts - row * chunk.stride, s.ends - row * chunk.stride
    last_start = (nk - 1) * chunk.block_kv
    in_last = np.maximum(end - np.maximum(start, last_start), 0)
    return (
        np.rint(np.bincount(row, end - start, minlength=chunk.num_rows)).astype(np.int64),
        np.rint(np.bincount(row, in_last, minlength=chunk.num_rows)).astype(np.int64),
    )
