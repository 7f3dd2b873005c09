"""Block tables for the kernel: the visited tiles of each q tile, as runs and as SMEM pieces.

Classification happens at the compute-block granularity (see `svgen.runtime.forward`: a tile
is cut into compute blocks). Here compute-block kinds become kernel kinds:
  * a FULL compute block holding the end of the sequence's keys (the sequence does not fill
    it) runs as BOUNDARY: its padding keys must be masked out (the boundary mask always drops
    keys >= seq_len); a compute block of padding only (keys or queries) is EMPTY;
  * a tile is FULL when all its compute blocks are FULL (one unmasked straight-line body),
    else BOUNDARY with a `blocks` word holding each compute block's kind (2 bits, row-major);
    a q-padding-only block of an otherwise FULL tile counts as FULL (its rows are discarded);
  * a q tile with no visited tile gets one EMPTY step, which only writes its zero output.
    It names the previous step's kv tile, so the pipeline fetches nothing new for it.
The generated module stores runs (q_block, kv_start, length, kind, blocks) of consecutive kv
tiles of one kind and blocks word, which are short and readable. The kernel's scalar prefetch holds them cut into
pieces of at most `slots` tiles: the smallest `slots` (a power of two) whose table fits the
SMEM budget, so tables stay one entry per visited tile unless that would not fit.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.analysis.classify import TileGrid
from svgen.core.tables import BITS_PER_BLOCK, KIND_MASK, PieceTables, variant_bits
from svgen.core.kinds import TileKind

DEFAULT_SMEM_BUDGET = 1 << 20  # bytes: the SMEM of one TPU v6e TensorCore
MAX_SLOTS = 256


class TableBudgetError(Exception):
    """No piece size fits the SMEM budget; `smallest` is the best tables found."""

    def __init__(self, smallest: PieceTables):
        super().__init__("tables over the SMEM budget")
        self.smallest = smallest


@dataclasses.dataclass(frozen=True)
class BlockTable:
    """One pattern's visited tiles, as the generated module stores them."""

    runs: np.ndarray  # int64 [num_runs, 5]: q_block, kv_start, length, kernel kind, blocks
    # int64 [num_runs]: per compute block of the run's tiles, 2 bits naming the residual mask
    # its BOUNDARY blocks run (svgen.analysis.residuals; 0 the whole mask); None: no variants
    variants: np.ndarray | None = None

    @property
    def visited_steps(self) -> int:
        """Grid steps that do work: visited tiles plus one per q tile with none."""
        return int(self.runs[:, 2].sum())


def _blocks_per_tile(grid: TileGrid, compute: TileGrid) -> tuple[int, int]:
    return grid.block_q // compute.block_q, grid.block_kv // compute.block_kv


def _padded(blocks: np.ndarray, grid: TileGrid, compute: TileGrid, fill) -> np.ndarray:
    """Compute-block values extended to whole tiles; blocks past the compute grid (padding
    only) get `fill`."""
    rq, rk = _blocks_per_tile(grid, compute)
    out = np.full((grid.num_q_blocks * rq, grid.num_kv_blocks * rk), fill, blocks.dtype)
    out[: blocks.shape[0], : blocks.shape[1]] = blocks
    return out


def _per_tile(padded: np.ndarray, grid: TileGrid, compute: TileGrid) -> np.ndarray:
    """[q tiles, kv tiles, blocks of the tile] (row-major inside a tile) of a padded array."""
    rq, rk = _blocks_per_tile(grid, compute)
    nq, nk = grid.num_q_blocks, grid.num_kv_blocks
    return padded.reshape(nq, rq, nk, rk).transpose(0, 2, 1, 3).reshape(nq, nk, rq * rk)


def tile_kinds(compute_kinds: np.ndarray, grid: TileGrid, compute: TileGrid) -> np.ndarray:
    """Tile kinds from compute-block kinds: FULL / EMPTY when every real block is, else
    BOUNDARY (equal to classifying the tiles directly; padding blocks do not count)."""
    if _blocks_per_tile(grid, compute) == (1, 1):
        return compute_kinds
    real = _per_tile(
        _padded(np.ones(compute_kinds.shape, bool), grid, compute, False), grid, compute
    )
    kinds = _per_tile(_padded(compute_kinds, grid, compute, TileKind.EMPTY), grid, compute)
    full = np.all((kinds == TileKind.FULL) | ~real, axis=2)
    empty = np.all((kinds == TileKind.EMPTY) | ~real, axis=2)
    return np.where(full, TileKind.FULL, np.where(empty, TileKind.EMPTY, TileKind.BOUNDARY)).astype(
        np.int8
    )


def kernel_tiles(
    compute_kinds: np.ndarray, grid: TileGrid, compute: TileGrid
) -> tuple[np.ndarray, np.ndarray]:
    """(kernel kind, blocks word), each [q tiles, kv tiles] (see the module docstring)."""
    blocks = compute_kinds.copy()
    if grid.seq_len % compute.block_kv:  # the last real key block holds padding keys
        last = blocks[:, -1]
        last[last == TileKind.FULL] = TileKind.BOUNDARY
    padded = _padded(blocks, grid, compute, TileKind.EMPTY)
    # Blocks of padding rows (real keys): wildcards, FULL where the rest of the tile is.
    q_padding = np.zeros(padded.shape, bool)
    q_padding[blocks.shape[0] :, : blocks.shape[1]] = True
    per_tile = _per_tile(padded, grid, compute)
    wildcard = _per_tile(q_padding, grid, compute)
    all_full = np.all((per_tile == TileKind.FULL) | wildcard, axis=2)
    per_tile = np.where(
        wildcard, np.where(all_full[:, :, None], TileKind.FULL, TileKind.EMPTY), per_tile
    ).astype(np.int64)
    all_empty = np.all(per_tile == TileKind.EMPTY, axis=2)
    kind = np.where(
        all_full, TileKind.FULL, np.where(all_empty, TileKind.EMPTY, TileKind.BOUNDARY)
    ).astype(np.int64)
    if per_tile.shape[2] == 1:  # one compute block per tile: the kind says everything
        return kind, np.zeros(kind.shape, np.int64)
    shifts = BITS_PER_BLOCK * np.arange(per_tile.shape[2], dtype=np.int64)
    word = (per_tile << shifts).sum(axis=2)
    return kind, np.where(kind == TileKind.BOUNDARY, word, 0)


def build_runs(
    kinds: np.ndarray, words: np.ndarray, grid: TileGrid, variants: np.ndarray | None = None
) -> np.ndarray:
    """The visited tiles as runs (q_block, kv_start, length, kind, blocks), row-major; with
    per-tile `variants` words (see `variant_words`) a sixth column holds each run's."""
    q_block, kv_block = np.nonzero(kinds != TileKind.EMPTY)  # row-major: the kernel's order
    kind = kinds[q_block, kv_block].astype(np.int64)
    word = words[q_block, kv_block].astype(np.int64)
    columns = 5 if variants is None else 6
    variant = np.zeros(q_block.size, np.int64)
    if variants is not None:
        variant = variants[q_block, kv_block].astype(np.int64)
    new_run = np.ones(q_block.size, bool)
    new_run[1:] = (
        (q_block[1:] != q_block[:-1])
        | (kv_block[1:] != kv_block[:-1] + 1)
        | (kind[1:] != kind[:-1])
        | (word[1:] != word[:-1])
        | (variant[1:] != variant[:-1])
    )
    first = np.flatnonzero(new_run)
    lengths = np.diff(np.append(first, q_block.size))
    runs = np.stack(
        [q_block[first], kv_block[first], lengths, kind[first], word[first], variant[first]],
        axis=1,
    )[:, :columns]
    return _add_zero_fill_runs(runs.astype(np.int64).reshape(-1, columns), grid.num_q_blocks)


def variant_words(
    block_variant: np.ndarray, kinds: np.ndarray, grid: TileGrid, compute: TileGrid
) -> np.ndarray:
    """Per tile (0 unless BOUNDARY), variant_bits per compute block, row-major inside the
    tile as the blocks word: the residual mask each BOUNDARY block runs."""
    per_tile = _per_tile(_padded(block_variant.astype(np.int64), grid, compute, 0), grid, compute)
    shifts = variant_bits(per_tile.shape[2]) * np.arange(per_tile.shape[2], dtype=np.int64)
    word = (per_tile << shifts).sum(axis=2)
    return np.where(kinds == TileKind.BOUNDARY, word, 0)


def choose_piece_tables(
    runs_per_pattern,
    heads: int,
    smem_budget: int = DEFAULT_SMEM_BUDGET,
    compute_blocks: int = 1,
    flat: bool = False,
    variants_per_pattern=None,
    first_slots: int = 1,
) -> PieceTables:
    """The SMEM tables with the smallest piece size (a power of two) that fits the budget.

    first_slots: where the search starts (a piece size known not to fit below it: the same
    runs with residual-mask words take at least the bytes they take without them).
    Raises TableBudgetError when even MAX_SLOTS-tile pieces do not fit.
    """
    slots = first_slots
    while True:
        tables = PieceTables.from_runs(
            runs_per_pattern, slots, compute_blocks, flat, variants_per_pattern
        )
        if tables.scalar_prefetch_bytes(heads) <= smem_budget:
            return tables
        if slots >= MAX_SLOTS:
            raise TableBudgetError(tables)
        slots *= 2


def _add_zero_fill_runs(runs: np.ndarray, num_q_blocks: int) -> np.ndarray:
    missing = np.setdiff1d(np.arange(num_q_blocks), runs[:, 0])
    if missing.size == 0:
        return runs
    fill = np.zeros((missing.size, runs.shape[1]), np.int64)
    fill[:, 0] = missing
    fill[:, 2] = 1
    fill[:, 3] = TileKind.EMPTY
    merged = np.concatenate([runs, fill])
    merged = merged[np.argsort(merged[:, 0], kind="stable")]
    for r in np.flatnonzero(merged[:, 3] == TileKind.EMPTY):
        if r > 0:  # reuse the kv tile already resident: no DMA for a zero-fill step
            merged[r, 1] = merged[r - 1, 1] + merged[r - 1, 2] - 1
    return merged


def transposed_tiles(
    kinds: np.ndarray, words: np.ndarray, grid: TileGrid, compute: TileGrid
) -> tuple[np.ndarray, np.ndarray]:
    """The backward dk/dv kernel's (kind, blocks word) per (kv tile, q tile), from the
    forward kernel's: the tiles `svgen.core.tables.transposed_runs` finds in the forward
    runs (per kv tile, its q tiles; blocks of a tile row-major over [kv block, q block]),
    without its loop over visited tiles (1.3M at 1.74M tokens with 512 x 512 tiles)."""
    rq, rk = _blocks_per_tile(grid, compute)
    if rq * rk == 1:  # a tile is its one compute block: the same kind, no word
        return kinds.T, np.broadcast_to(np.int8(0), kinds.T.shape)
    # Forward block (i, j) of a tile is bits 2 * (i * rk + j) of its word; transposed, it is
    # block (j, i), bits 2 * (j * rq + i). One block at a time: int8 / int64 [tiles] only.
    full = np.ones(kinds.shape, bool)
    empty = np.ones(kinds.shape, bool)
    word = np.zeros(kinds.shape, np.int64)
    for i in range(rq):
        for j in range(rk):
            block = _forward_block(kinds, words, i * rk + j)
            full &= block == TileKind.FULL
            empty &= block == TileKind.EMPTY
            word |= block.astype(np.int64) << (BITS_PER_BLOCK * (j * rq + i))
    kind = np.where(full, TileKind.FULL, np.where(empty, TileKind.EMPTY, TileKind.BOUNDARY))
    return kind.astype(np.int8).T, np.where(kind == TileKind.BOUNDARY, word, 0).T


def _forward_block(kinds: np.ndarray, words: np.ndarray, index: int) -> np.ndarray:
    """The kind of compute block `index` of every forward tile (FULL tiles: FULL blocks)."""
    bits = (words >> (BITS_PER_BLOCK * index)) & KIND_MASK
    return np.where(
        kinds == TileKind.FULL,
        TileKind.FULL,
        np.where(kinds == TileKind.BOUNDARY, bits, TileKind.EMPTY),
    ).astype(np.int8)
