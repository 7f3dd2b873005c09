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
"""

from __future__ import annotations

import math

import numpy as np

from svgen import ir
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.analysis.tables import build_runs, kernel_tiles
from svgen.runtime.kinds import TileKind
from svgen.runtime.layout import TokenLayout
from svgen.runtime.tables import PieceTables
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
