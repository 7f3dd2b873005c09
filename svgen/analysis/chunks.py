"""KV-cache chunks (`runtime: {kv_cache: {chunk_frames: C}}`): per chunk position, the tiles
one chunked call visits.

A chunked call attends the C frames of one chunk (queries: the chunk's own tokens, a local
row range 0 .. C * height * width) against the cache of the whole video (keys: the full
sequence, in place). Its tiles are the chunk's own: local q tiles start at the chunk's first
token, which is rarely a multiple of the q tile (Self-Forcing's 3 x 30 x 52 chunk is 4,680
tokens), so they are not rows of the full sequence's tile grid.

They are classified exactly all the same, from one classification of the full sequence at a
finer row grain: q blocks of g = gcd(compute_q, chunk tokens) rows, which tile every chunk
and every local compute block of every chunk. A local compute block is FULL (EMPTY) when all
its g-row blocks are, else BOUNDARY; the kernel tiles, their blocks words and runs then come
out of the same functions as the full sequence's (svgen.analysis.tables), on a grid whose
rows are the chunk's. The kv side is the full sequence's grid itself: the cache holds the
video's keys in the same layout.

The mask is the spec's with block-causality over the chunks added (svgen.ir.lower), so a
chunk never reaches keys the cache does not hold yet, and the full-sequence module computes
exactly what the chunks do, one after another.

A rolling cache (`kv_cache: {window_frames: W, sink_frames: S}`) holds S sink frames and a
ring of W frame slots (svgen.core.ring): its kv tiles are the cache's, and a physical kv
block holds at most three runs of video keys (sink, the ring up to its wrap, the rest), each
a constant shift of its slots. Those are classified per chunk position directly from the
rows' key sets (`ring_kinds`): a block is FULL when every real row of a q block keeps every
real key of every run, EMPTY when none keeps any. A mask that keeps a frame the ring has
evicted is refused (`EvictedFrames`, from the same pass over the rows' key sets).
"""

from __future__ import annotations

import math

import numpy as np

from svgen import ir
from svgen.analysis.classify import (
    MAX_UNDECIDED_PAIRS,
    TileGrid,
    classify_tiles,
    evaluated_pairs,
)
from svgen.analysis.intervals import IntervalSet
from svgen.analysis.key_sets import Bounds, RowChunk
from svgen.analysis.rowsets import row_bounds
from svgen.analysis.tables import build_runs, kernel_tiles
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.core.ring import RingCache
from svgen.core.tables import PieceTables
from svgen.spec import Tiling

# A g-row block past the chunk's end (in its last, partial compute block): no rows, no say.
_NO_ROWS = -1


def chunk_tokens(layout: TokenLayout, chunk_frames: int) -> int:
    return chunk_frames * layout.tokens_per_frame


def chunk_grids(
    layout: TokenLayout, tiling: Tiling, chunk_frames: int
) -> tuple[TileGrid, TileGrid]:
    """The kernel's tile grid and compute grid of one chunked call: the chunk's rows against
    the whole sequence's keys."""
    rows = chunk_tokens(layout, chunk_frames)
    tiles = TileGrid(layout.seq_len, tiling.block_q, tiling.block_kv, q_len=rows)
    compute = TileGrid(layout.seq_len, tiling.cq, tiling.ckv, q_len=rows)
    return tiles, compute


def chunk_runs(mask: ir.Node, layout: TokenLayout, tiling: Tiling, chunk_frames: int) -> np.ndarray:
    """int64 [runs, 6]: (position, q_block, kv_start, length, kind, blocks) of every chunk
    position 0 .. frames / chunk_frames - 1, by position; each position's runs as
    `build_runs` gives them (zero-fill steps included) on its chunk's grid."""
    rows = chunk_tokens(layout, chunk_frames)
    tiles, compute = chunk_grids(layout, tiling, chunk_frames)
    grain = math.gcd(tiling.cq, rows)
    fine = classify_tiles(mask, layout, TileGrid(layout.seq_len, grain, tiling.ckv)).kinds
    per_chunk = rows // grain
    per_block = tiling.cq // grain
    local_blocks = -(-rows // tiling.cq)
    out = []
    for position in range(layout.frames // chunk_frames):
        fine_rows = np.full((local_blocks * per_block, fine.shape[1]), _NO_ROWS, np.int8)
        fine_rows[:per_chunk] = fine[position * per_chunk : (position + 1) * per_chunk]
        blocks = fine_rows.reshape(local_blocks, per_block, -1)
        kinds = local_compute_kinds(blocks)
        runs = build_runs(*kernel_tiles(kinds, tiles, compute), tiles)
        out.append(np.concatenate([np.full((len(runs), 1), position, np.int64), runs], axis=1))
    return np.concatenate(out)


def local_compute_kinds(blocks: np.ndarray) -> np.ndarray:
    """[local compute blocks, g-row blocks each, kv blocks] -> each local block's kind."""
    no_rows = blocks == _NO_ROWS
    full = np.all((blocks == TileKind.FULL) | no_rows, axis=1)
    empty = np.all((blocks == TileKind.EMPTY) | no_rows, axis=1)
    return np.where(full, TileKind.FULL, np.where(empty, TileKind.EMPTY, TileKind.BOUNDARY)).astype(
        np.int8
    )


def runs_of_position(runs: np.ndarray, position: int) -> np.ndarray:
    """One position's runs [n, 5] out of `chunk_runs`'s."""
    return runs[runs[:, 0] == position, 1:]


def position_runs(chunked_runs, positions: int) -> list[np.ndarray]:
    """The runs of every (position, pattern), position-major: table pattern index position *
    patterns + pattern, what the kernel's chunked call looks up (svgen.runtime.chunks)."""
    return [runs_of_position(r, c) for c in range(positions) for r in chunked_runs]


def chunk_tables(chunked_runs, slots: int, compute_blocks: int) -> PieceTables:
    positions = int(max(r[:, 0].max() for r in chunked_runs)) + 1
    return PieceTables.from_runs(
        position_runs(chunked_runs, positions), slots, compute_blocks, False
    )


class EvictedFrames(Exception):
    """A chunk's mask keeps a frame its rolling cache has evicted: the first chunk position
    where it does, the oldest such frame, and the ring size every position would need."""

    def __init__(self, position: int, frame: int, need: int):
        super().__init__(position, frame, need)
        self.position, self.frame, self.need = position, frame, need


def ring_runs(mask: ir.Node, layout: TokenLayout, tiling: Tiling, ring: RingCache) -> np.ndarray:
    """`chunk_runs` for a rolling cache: every chunk position's runs on the chunk's q tiles
    against the cache's kv tiles. Raises EvictedFrames when some position's rows keep a
    frame the ring no longer holds (each position's key sets are computed once, for both)."""
    rows = chunk_tokens(layout, ring.chunk_frames)
    cache = ring.cache_frames * layout.tokens_per_frame
    tiles = TileGrid(cache, tiling.block_q, tiling.block_kv, q_len=rows)
    compute = TileGrid(cache, tiling.cq, tiling.ckv, q_len=rows)
    out, evicted, need = [], None, 0
    for position in range(layout.frames // ring.chunk_frames):
        chunk, bounds = _chunk_rows(mask, layout, tiling, ring, position)
        frame = _oldest_evicted_frame(chunk, bounds, ring, position)
        if frame is not None:
            need = max(need, (position + 1) * ring.chunk_frames - frame)
            evicted = evicted or (position, frame)
        if evicted is None:
            kinds = ring_kinds(chunk, bounds, tiling, ring, position)
            runs = build_runs(*kernel_tiles(kinds, tiles, compute), tiles)
            out.append(np.concatenate([np.full((len(runs), 1), position, np.int64), runs], 1))
    if evicted is not None:
        raise EvictedFrames(*evicted, need)
    return np.concatenate(out)


def _chunk_rows(mask, layout: TokenLayout, tiling: Tiling, ring: RingCache, position: int):
    """(the chunk's rows, their key sets): exact for built-ins, and for user predicates too
    where the pairs their proofs leave open fit MAX_UNDECIDED_PAIRS (evaluated with the
    oracle, as classify_tiles does); else bounds."""
    rows = chunk_tokens(layout, ring.chunk_frames)
    chunk = RowChunk(layout, tiling.cq, tiling.ckv, position * rows, rows)
    bounds = row_bounds(mask, chunk)
    if bounds.is_exact:
        return chunk, bounds
    undecided = bounds.hi.intersection(bounds.lo.complement_within(chunk.universe))
    if undecided.total_length() > MAX_UNDECIDED_PAIRS:
        return chunk, bounds
    kept = [line[allowed] for line, _, _, allowed in evaluated_pairs(mask, chunk, undecided)]
    kept = np.concatenate([np.zeros(0, np.int64), *kept])
    return chunk, Bounds.exact(bounds.lo.union(IntervalSet.normalized(kept, kept + 1)))


def ring_kinds(chunk: RowChunk, bounds: Bounds, tiling: Tiling, ring: RingCache, position: int):
    """int8 [chunk's compute q blocks, cache's compute kv blocks]: each block's kind at a
    chunk position, from the chunk rows' key sets (bounds for user predicates: FULL needs
    the certain keys, EMPTY the possible ones)."""
    key_runs = ring.key_runs(position, chunk.layout.tokens_per_frame)
    first, end, shift, block = _block_pieces(key_runs, tiling.ckv)
    base = np.arange(chunk.num_rows, dtype=np.int64)[:, None] * chunk.stride
    lo = (first + shift)[None, :] + base
    hi = (end + shift)[None, :] + base
    starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])

    def kept(s: IntervalSet) -> np.ndarray:  # [rows, kv blocks]
        return np.add.reduceat(_coverage(s, hi) - _coverage(s, lo), starts, axis=1)

    keys = np.add.reduceat(end - first, starts)
    full_rows = kept(bounds.lo) == keys[None, :]
    touched_rows = kept(bounds.hi) > 0
    q_blocks = -(-chunk.num_rows // tiling.cq)
    pad = q_blocks * tiling.cq - chunk.num_rows  # rows past the chunk's end: no say
    full_rows = np.concatenate([full_rows, np.ones((pad, keys.size), bool)])
    touched_rows = np.concatenate([touched_rows, np.zeros((pad, keys.size), bool)])
    full = full_rows.reshape(q_blocks, tiling.cq, -1).all(axis=1)
    empty = ~touched_rows.reshape(q_blocks, tiling.cq, -1).any(axis=1)
    kinds = np.where(full, TileKind.FULL, np.where(empty, TileKind.EMPTY, TileKind.BOUNDARY))
    return kinds.astype(np.int8)


def _block_pieces(key_runs, block: int):
    """The key runs cut at every compute kv block's edge: (first, end, shift, block index)
    per piece, in order."""
    pieces = []
    for first, end, shift in key_runs:
        edges = np.unique(np.r_[first, np.arange(-(-first // block) * block, end, block), end])
        pieces += [(a, b, shift) for a, b in zip(edges[:-1], edges[1:]) if b > a]
    first, end, shift = (np.array(c, np.int64) for c in zip(*pieces))
    return first, end, shift, first // block


def _coverage(s: IntervalSet, points: np.ndarray) -> np.ndarray:
    """How many positions of s lie below each point (same shape as points)."""
    if len(s) == 0:
        return np.zeros(points.shape, np.int64)
    below = np.concatenate([[0], np.cumsum(s.ends - s.starts)])
    i = np.searchsorted(s.ends, points, side="right")  # intervals wholly below
    inside = np.where(i < len(s), points - s.starts[np.minimum(i, len(s) - 1)], 0)
    return below[i] + np.maximum(inside, 0)


def _oldest_evicted_frame(chunk: RowChunk, bounds: Bounds, ring: RingCache, position: int):
    """The oldest frame the chunk's rows may keep that its ring has evicted (frames in
    sink .. the ring's oldest), None when they keep none."""
    newest = (position + 1) * ring.chunk_frames - 1
    oldest_held = newest - ring.window_frames + 1
    if oldest_held <= ring.sink_frames:
        return None
    t = chunk.layout.tokens_per_frame
    base = np.arange(chunk.num_rows, dtype=np.int64) * chunk.stride
    reach = bounds.hi.intersection(IntervalSet(base + ring.sink_frames * t, base + oldest_held * t))
    if len(reach) == 0:
        return None
    return int(((reach.starts % chunk.stride) // t).min())
