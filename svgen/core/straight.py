"""Straight-line BOUNDARY tiles: the commonest blocks words of a pattern, each run as one
straight-line body instead of a branch per compute block. NumPy only (the cost model reads it).

A BOUNDARY tile runs each compute block in a branch of its own (FULL, BOUNDARY, skipped, by
the tile's `blocks` word), and the scheduler cannot overlap one branch's softmax with the next
block's QK^T as it does along a FULL tile's straight-line body: a FULL block in a BOUNDARY
tile costs ~5% more than one in a FULL tile (v6e, `svgen cost`: 2,178 against 2,068 bundles
per 1024 x 1024 block with the bounded softmax; 2,314 against 2,290 online), and every block
pays its branch. Yet a pattern's BOUNDARY tiles have few distinct words: a band's edge tiles
repeat along the diagonal, an aligned mask's mixed tiles are a few runs of FULL blocks. So the
tables of each pattern are counted here, and its best MAX_WORDS words get a body of their own
in the forward kernel: per row of compute blocks, the word's non-empty blocks one after
another, the row's softmax state in values (svgen.runtime.forward, `straight`). Any other
word takes the per-block branches.

A word is worth a body for the blocks it joins: per tile, its non-empty blocks less its
non-empty rows (a row's first block starts the row's chain). Words with BOUNDARY blocks qualify
only where the pattern runs its whole mask (a pattern with residual masks picks a variant per
block at run time, which a straight body cannot). A BOUNDARY block in the block column that
can hold padding keys runs without the padding test in a straight body, so on the one kv tile
that holds them the word takes the per-block branches (`avoid_padding_tile`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.core.kinds import TileKind
from svgen.core.tables import BITS_PER_BLOCK, KIND_MASK, KernelShape, as_runs

# Words of a pattern that get a straight-line body: each is a body of up to 16 compute blocks
# (twice with `softmax: bounded`), and the kernel's program grows with every one. Two, as the
# chip measured (TPU v5e, bench/kernel_ab.py at 4c33b46, docs/measured.md): the blog spec at
# 1024x2048 / 1024x512 ran 138.80 ms with 8 (a 71K-bundle program), 71.80 with 2 and 72.07
# with none; at 1024x1024 / 1024x512 75.62 with 8, 75.56 with 2, 76.04 with none.
MAX_WORDS = 2
# ... and only words that join at least this share of the pattern's non-empty blocks in
# BOUNDARY tiles: below it a body buys nothing a cost model could see.
MIN_JOINED_SHARE = 0.03


@dataclasses.dataclass(frozen=True)
class StraightWord:
    """A blocks word with a straight-line body."""

    word: int  # the tile's blocks word (BITS_PER_BLOCK per compute block, row-major)
    avoid_padding_tile: bool  # a BOUNDARY block in the padding column: per-block there

    def kinds(self, compute_blocks: int) -> tuple[int, ...]:
        return block_kinds(self.word, compute_blocks)


def block_kinds(word: int, compute_blocks: int) -> tuple[int, ...]:
    """The TileKind of each compute block of a blocks word, row-major."""
    return tuple((word >> (BITS_PER_BLOCK * b)) & KIND_MASK for b in range(compute_blocks))


def word_glyphs(word: int, rows: int, cols: int) -> str:
    """A blocks word as its rows of tile-map glyphs, e.g. ###+/##++ (# FULL, + BOUNDARY,
    . EMPTY)."""
    kinds = block_kinds(word, rows * cols)
    return "/".join(
        "".join(TileKind(k).glyph for k in kinds[r * cols : (r + 1) * cols]) for r in range(rows)
    )


def word_steps(runs, words: tuple[StraightWord, ...]) -> tuple[list[int], int]:
    """(steps of each word's BOUNDARY tiles, steps of every BOUNDARY tile) in a pattern's runs."""
    runs = as_runs(runs)
    mixed = runs[runs[:, 3] == TileKind.BOUNDARY]
    steps = [int(mixed[mixed[:, 4] == w.word, 2].sum()) for w in words]
    return steps, int(mixed[:, 2].sum())


def joined_blocks(word: int, shape: KernelShape) -> int:
    """Blocks a straight body joins onto the one before them in their row: per tile, its
    non-empty blocks less its non-empty rows."""
    kinds = np.array(block_kinds(word, shape.compute_blocks)).reshape(
        shape.q_blocks_per_tile, shape.kv_blocks_per_tile
    )
    busy = kinds != TileKind.EMPTY
    return int(busy.sum() - busy.any(axis=1).sum())


def straight_words(
    runs, shape: KernelShape, whole_mask: bool, max_words: int | None = None
) -> tuple[StraightWord, ...]:
    """The words of a pattern's BOUNDARY tiles (its runs) that get a straight-line body, best
    first (ties: the smaller word). whole_mask: the pattern's BOUNDARY blocks run its whole
    mask (it has no residual masks), so words with BOUNDARY blocks qualify. max_words: at most
    this many (None: MAX_WORDS; the compiler lowers it to keep a program under its budget)."""
    max_words = MAX_WORDS if max_words is None else max_words
    if shape.compute_blocks == 1 or max_words == 0:
        return ()
    runs = as_runs(runs)
    mixed = runs[runs[:, 3] == TileKind.BOUNDARY]
    if not len(mixed):
        return ()
    words, inverse = np.unique(mixed[:, 4], return_inverse=True)
    steps = np.bincount(inverse.ravel(), weights=mixed[:, 2]).astype(np.int64)
    busy_blocks = 0
    scored = []
    for word, count in zip(words.tolist(), steps.tolist()):
        kinds = block_kinds(word, shape.compute_blocks)
        busy_blocks += count * sum(k != TileKind.EMPTY for k in kinds)
        if any(k not in (TileKind.EMPTY, TileKind.FULL, TileKind.BOUNDARY) for k in kinds):
            continue
        if not whole_mask and TileKind.BOUNDARY in kinds:
            continue
        joined = count * joined_blocks(word, shape)
        if joined:
            scored.append((joined, word))
    scored.sort(key=lambda s: (-s[0], s[1]))
    chosen = [(j, w) for j, w in scored[:max_words] if j >= MIN_JOINED_SHARE * busy_blocks]
    return tuple(StraightWord(w, _boundary_in_padding_column(w, shape)) for _, w in chosen)


def _boundary_in_padding_column(word: int, shape: KernelShape) -> bool:
    if shape.padding_kv_tile is None:
        return False
    kinds = block_kinds(word, shape.compute_blocks)
    return any(
        kind == TileKind.BOUNDARY
        for index, kind in enumerate(kinds)
        if index % shape.kv_blocks_per_tile == shape.padding_block_column
    )
