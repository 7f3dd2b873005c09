"""Tables refined on device: the compile-time superset of visits, narrowed by run-time data.

The compiler classifies every (q tile, kv tile) pair of a pattern and stores the visited tiles
as runs (q_block, kv_start, length, kind, blocks); see svgen.analysis.tables for the rules.
Run-time data (segment ids of packed batches, valid lengths, activation-driven selection) can
only *remove* pairs: a compute block can only go down, FULL -> BOUNDARY -> EMPTY. This module
turns the static superset into one call's tables, in jnp, under jit, with no host round trip
and no recompilation when the data change.

Contract
--------
`StaticVisits.from_runs(runs, rq, rk)` (NumPy, once, at import): the pattern's V visited
tiles in the kernel's order (by q tile, then kv tile), each with its q tile, kv tile, static
kind and static `word`: 2 bits per compute block, row-major over the tile's rq x rk blocks,
the kind of each block (a FULL tile's word is every block FULL, unlike the runs' `blocks`,
which is 0 there; with one compute block per tile the word is the tile's kind). A q tile the
compiler left with a zero-fill step has no visit.

`refine(visits, words, slots)` (jnp): `words` int32 [V], each visit's refined word (2 bits of
0/1/2 per block). It returns `RefinedPieces(entries, lengths, blocks, num_pieces)`: arrays of
the static length `visits.max_pieces`, in the dtypes of `PieceTables.from_runs(..., slots,
rq * rk)` (lengths None when slots == 1, blocks None with one compute block per tile), and a
traced int32 piece count. The first num_pieces pieces are exactly the compile-time tables of
the refined kinds, because each step below is the compile-time rule written as a scan:
  * a visit's kind follows from its word as in `kernel_tiles`: every block FULL -> FULL,
    every block EMPTY -> dropped, else BOUNDARY keeping the word (0 in the table otherwise);
    with one compute block per tile the word is the kind (SEGMENT_BOUNDARY included);
  * kept visits merge into runs as in `build_runs`: a kept visit continues the run of the
    visit just before it in static order when that one is kept, is the previous kv tile of
    the same q tile, and has the same kind and word (kept visits of one run are consecutive
    static visits, so "previous kept visit" is simply "previous visit");
  * runs are cut into pieces of at most `slots` tiles from their start, as in `split_runs`;
  * a q tile left with no kept visit gets one EMPTY step of length 1 naming the previous
    step's kv tile (the last kept visit of an earlier q tile, 0 when there is none), as in
    `_add_zero_fill_runs`. This is recomputed for the q tiles the compiler already gave a
    zero-fill step too: the previous step's kv tile moves when its visit is dropped.
Entries past num_pieces repeat the last piece (its entry, length and word): what the kernel's
per-head walk reads anyway (it clamps its piece index to the head's last), so any read of
them names tiles already resident and fetches nothing, and no table holds garbage.

Static maximum: `max_pieces` = the sum over q tiles of max(1, visits of the q tile), i.e.
the static step count (the compile-time pieces with slots == 1). A q tile with n >= 1 visits
emits either one zero-fill step or at least one kept visit per piece, so at most max(1, n)
pieces; the bound is reached for any slots (a word sequence alternating FULL and BOUNDARY
tiles makes every visit its own run), so it cannot be tighter without knowing the words.

Segment ids
-----------
`block_segment_ranges(segment_ids, block, num_blocks)` gives per compute block row (or
column) the min and max segment id of its real tokens. Positions past the array (the padding
of the last tiles) count for nothing: a block of padding only has an empty range (lo > hi).
`segment_words(visits, q_lo, q_hi, kv_lo, kv_hi)` refines each block of each visit:
  * EMPTY when it was statically EMPTY or the query and key ranges are disjoint (a block
    with no real keys has an empty range: disjoint from everything);
  * its static kind when both ranges are one and the same segment;
  * else SEGMENT_BOUNDARY (3, the one value 2 bits hold that no static table uses): the
    kernel tests the pattern's mask and the segment ids per element there, and only there.
  * A block with no real query rows (the last q tile reaching past the sequence) is a
    wildcard, as in `kernel_tiles`: FULL when every other block of the tile ends FULL, else
    EMPTY (its rows are discarded); statically EMPTY ones stay EMPTY.
Padding keys need no rule of their own: the compile-time word of a block holding the end of
the keys is never FULL (`kernel_tiles` runs it as BOUNDARY), and refinement never raises a
block, so it stays BOUNDARY and the kernel's mask drops keys >= seq_len. Sound for any ids
(never EMPTY where a same-segment pair exists, never FULL where one is dropped); with ids
numbered 0, 1, 2, ... in sequence order, EMPTY is exact at block level (disjoint ranges iff no
shared segment). Ids must be int32 (any values).

Cost: segment_words is O(V * rq * rk) elementwise work plus four gathers of V * rq (or rk)
values; refine is a few dozen O(V + q tiles) elementwise ops and gathers, four cumulative
scans (two sums, two maxima) and one scatter per output array, all at static shapes: one
compile for every run-time value, vmap-able over a batch (each element its own tables).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from svgen.core.kinds import TileKind
from svgen.core.tables import (
    BITS_PER_BLOCK,
    KIND_MASK,
    KV_BLOCK_SHIFT,
    as_runs,
    blocks_dtype,
    pack_pieces,
)

# The kind of a compute block (or of a tile of one compute block) whose rows and keys span
# run-time segments: the kernels test the pattern's mask and the segment ids there. A block
# inside one segment keeps its static kind and skips the segment test (the kernels' code for
# this kind exists only where run-time tables are read; the compiler never emits it).
SEGMENT_BOUNDARY = 3

_INT32_MAX = np.iinfo(np.int32).max
_INT32_MIN = np.iinfo(np.int32).min


def _as_int32(word: int) -> int:
    """A word of up to 32 bits as the int32 with the same bits (16 FULL blocks set bit 31)."""
    return int(np.array(word, np.int64).astype(np.uint32).view(np.int32))


@dataclasses.dataclass(frozen=True, eq=False)
class StaticVisits:
    """One pattern's statically visited tiles, in the kernel's order (NumPy constants)."""

    q_tile: np.ndarray  # int32 [V]
    kv_tile: np.ndarray  # int32 [V]
    kind: np.ndarray  # int8 [V]: FULL or BOUNDARY
    word: np.ndarray  # int32 [V]: each compute block's static kind, 2 bits, row-major
    first_visit: np.ndarray  # int32 [num_q_tiles + 1]: q tile t's visits are [t] .. [t + 1]
    q_blocks_per_tile: int  # rq
    kv_blocks_per_tile: int  # rk

    @classmethod
    def from_runs(
        cls, runs, q_blocks_per_tile: int = 1, kv_blocks_per_tile: int = 1
    ) -> "StaticVisits":
        """The visits of compile-time runs (4 or 5 columns), which must list every q tile
        (a zero-fill EMPTY run for those that visit nothing), sorted as the kernel walks."""
        runs = as_runs(runs)
        compute_blocks = q_blocks_per_tile * kv_blocks_per_tile
        if compute_blocks * BITS_PER_BLOCK > 32:
            raise ValueError(f"{compute_blocks} compute blocks per tile: at most 16 fit a word")
        num_q_tiles = int(runs[:, 0].max()) + 1 if len(runs) else 0
        if not np.array_equal(np.unique(runs[:, 0]), np.arange(num_q_tiles)):
            raise ValueError("the runs must name every q tile (zero-fill runs included)")
        runs = runs[runs[:, 3] != TileKind.EMPTY]  # zero-fill steps: recomputed by refine
        run = np.repeat(np.arange(len(runs)), runs[:, 2])
        offset = np.arange(len(run)) - np.repeat(np.cumsum(runs[:, 2]) - runs[:, 2], runs[:, 2])
        q_tile, kv_tile = runs[run, 0], runs[run, 1] + offset
        order = q_tile * (int(kv_tile.max(initial=0)) + 1) + kv_tile
        if np.any(np.diff(order) <= 0):
            raise ValueError("the runs' tiles must be distinct and sorted by q tile, kv tile")
        kind = runs[run, 3]
        full = sum(int(TileKind.FULL) << (BITS_PER_BLOCK * b) for b in range(compute_blocks))
        if compute_blocks == 1:
            word = kind
        else:
            word = np.where(kind == TileKind.FULL, full, runs[run, 4])
        first_visit = np.searchsorted(q_tile, np.arange(num_q_tiles + 1))
        return cls(
            q_tile.astype(np.int32),
            kv_tile.astype(np.int32),
            kind.astype(np.int8),
            word.astype(np.int64).astype(np.uint32).view(np.int32),
            first_visit.astype(np.int32),
            q_blocks_per_tile,
            kv_blocks_per_tile,
        )

    @property
    def num_visits(self) -> int:
        return len(self.q_tile)

    @property
    def num_q_tiles(self) -> int:
        return len(self.first_visit) - 1

    @property
    def compute_blocks(self) -> int:
        return self.q_blocks_per_tile * self.kv_blocks_per_tile

    @property
    def max_pieces(self) -> int:
        """The most pieces `refine` can emit, for any words and slots (see the docstring)."""
        return int(np.maximum(np.diff(self.first_visit), 1).sum())

    @property
    def full_word(self) -> int:
        """The word of a tile whose compute blocks are all FULL (as int32)."""
        bits = [int(TileKind.FULL) << (BITS_PER_BLOCK * b) for b in range(self.compute_blocks)]
        return _as_int32(sum(bits))


class RefinedPieces(NamedTuple):
    """One pattern's pieces for one call (a pytree: jit and vmap return it as is)."""

    entries: jnp.ndarray  # int32 [max_pieces]
    lengths: jnp.ndarray | None  # int8/int16 [max_pieces], None when slots == 1
    blocks: jnp.ndarray | None  # int8/16/32 [max_pieces], None with one compute block per tile
    num_pieces: jnp.ndarray  # int32 []: pieces past it repeat the last one
    # int32 [max_pieces]: per piece, which of its SEGMENT_BOUNDARY blocks a selection chose
    # (bit b: block b, row-major); None without a selection across segments
    chosen: jnp.ndarray | None = None


def refine(visits: StaticVisits, words, slots: int, chosen=None) -> RefinedPieces:
    """The call's pieces, for refined words int32 [V] (see the module docstring). chosen
    (a selection across segments, svgen.runtime.select): int32 [V], each visit's chosen
    word (`chosen_bits`); visits merge into one piece only when these are equal too, and
    the pieces carry it."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    words = jnp.asarray(words, jnp.int32)
    if words.shape != (visits.num_visits,):
        raise ValueError(f"words must be [{visits.num_visits}], got {words.shape}")
    kind, word = _tile_kinds(visits, words)
    keep = kind != TileKind.EMPTY
    merged_by = word if chosen is None else (word, jnp.asarray(chosen, jnp.int32))
    piece_start = _piece_starts(visits, keep, kind, merged_by, slots)
    zero_fill, zero_fill_kv = _zero_fills(visits, keep)

    # Candidate steps in the kernel's order (a q tile's visits, then its zero-fill step:
    # only one of the two ever emits); `at`: where each lands, `size` when it does not.
    size = visits.max_pieces
    visit_position, fill_position, num_pieces = _positions(visits, piece_start, zero_fill)
    fill_at = jnp.where(zero_fill, fill_position, size)
    at = jnp.concatenate([jnp.where(piece_start, visit_position, size), fill_at])

    entries = jnp.concatenate(
        [
            _q_bits(visits.q_tile) | (jnp.asarray(visits.kv_tile) << KV_BLOCK_SHIFT) | kind,
            _q_bits(np.arange(visits.num_q_tiles)) | (zero_fill_kv << KV_BLOCK_SHIFT),
        ]
    )  # zero-fill steps: kind EMPTY = 0
    entries = _pad_with_last(_scatter(at, entries, size), num_pieces)

    lengths = None
    if slots > 1:
        # Every kept visit adds one to its piece; a zero-fill step is one step long.
        kept_at = jnp.concatenate([jnp.where(keep, visit_position, size), fill_at])
        lengths = jnp.zeros(size, jnp.int32).at[kept_at].add(1, mode="drop")
        dtype = np.int8 if slots < 128 else np.int16
        lengths = _pad_with_last(lengths, num_pieces).astype(dtype)

    blocks = None
    if visits.compute_blocks > 1:
        values = jnp.concatenate([word, jnp.zeros(visits.num_q_tiles, jnp.int32)])
        blocks = _pad_with_last(_scatter(at, values, size), num_pieces)
        # Keep the low bits, wrapping into the sign bit, as PieceTables.from_runs does.
        blocks = blocks.astype(blocks_dtype(visits.compute_blocks))
    if chosen is not None:
        values = jnp.concatenate([chosen, jnp.zeros(visits.num_q_tiles, jnp.int32)])
        chosen = _pad_with_last(_scatter(at, values.astype(jnp.int32), size), num_pieces)
    return RefinedPieces(entries, lengths, blocks, num_pieces.astype(jnp.int32), chosen)


def _tile_kinds(visits: StaticVisits, words):
    """(kind, table word) of each visit, from its refined word, as `kernel_tiles` decides.
    With one compute block per tile the word is the kind (SEGMENT_BOUNDARY included) and the
    table holds no word."""
    if visits.compute_blocks == 1:
        return words, jnp.zeros_like(words)
    kind = jnp.where(
        words == visits.full_word,
        TileKind.FULL,
        jnp.where(words == 0, TileKind.EMPTY, TileKind.BOUNDARY),
    ).astype(jnp.int32)
    return kind, jnp.where(kind == TileKind.BOUNDARY, words, 0)


def _piece_starts(visits: StaticVisits, keep, kind, words, slots: int):
    """Kept visits that open a piece: a new run, or `slots` tiles into one. words: the
    visits' words, or a tuple of word arrays that must all be equal to continue a run."""
    q, kv = visits.q_tile, visits.kv_tile
    # Static: the visit before is the previous kv tile of the same q tile.
    adjacent = np.zeros(visits.num_visits, bool)
    adjacent[1:] = (q[1:] == q[:-1]) & (kv[1:] == kv[:-1] + 1)
    same_as_previous = jnp.asarray(adjacent[1:]) & keep[1:] & keep[:-1] & (kind[1:] == kind[:-1])
    for word in words if isinstance(words, tuple) else (words,):
        same_as_previous = same_as_previous & (word[1:] == word[:-1])
    continues = jnp.zeros_like(keep).at[1:].set(same_as_previous)
    run_start = keep & ~continues
    index = jnp.arange(visits.num_visits, dtype=jnp.int32)
    # A kept visit's run starts at the latest run start at or before it.
    start = lax.cummax(jnp.where(run_start, index, -1))
    return keep & ((index - start) % slots == 0)


def _zero_fills(visits: StaticVisits, keep):
    """Per q tile: whether it keeps no visit, and the kv tile its zero-fill step names (that
    of the last kept visit of an earlier q tile, 0 when none)."""
    if visits.num_visits == 0:  # nothing visited: every q tile a zero-fill step at kv 0
        return jnp.ones(visits.num_q_tiles, bool), jnp.zeros(visits.num_q_tiles, jnp.int32)
    kept_before = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(keep, dtype=jnp.int32)])
    first, last = visits.first_visit[:-1], visits.first_visit[1:]
    zero_fill = kept_before[last] == kept_before[first]
    index = jnp.arange(visits.num_visits, dtype=jnp.int32)
    # The last kept visit before each visit (-1: none), read at each q tile's first visit.
    last_kept = lax.cummax(jnp.where(keep, index, -1))
    previous = jnp.concatenate([jnp.full(1, -1, jnp.int32), last_kept])[first]
    kv = jnp.where(previous >= 0, jnp.asarray(visits.kv_tile)[jnp.maximum(previous, 0)], 0)
    return zero_fill, kv.astype(jnp.int32)


def _positions(visits: StaticVisits, piece_start, zero_fill):
    """Each visit's and each zero-fill step's place in the output (for a kept visit: that of
    its piece), and the piece count: a running count over the candidate steps in the order
    q tile 0's visits, its zero-fill step, q tile 1's visits, ... (static: a gather)."""
    visit_slot = np.arange(visits.num_visits) + visits.q_tile
    fill_slot = visits.first_visit[1:] + np.arange(visits.num_q_tiles)
    order = np.argsort(np.concatenate([visit_slot, fill_slot]))
    emits = jnp.concatenate([piece_start, zero_fill]).astype(jnp.int32)[order]
    position = jnp.cumsum(emits) - 1
    return position[visit_slot], position[fill_slot], position[-1] + 1


def _q_bits(q_tile) -> jnp.ndarray:
    """The q tile's bits of packed entries (static; bit 31 may be set)."""
    return jnp.asarray(pack_pieces(q_tile, np.zeros_like(q_tile), np.zeros_like(q_tile)))


def _scatter(at, values, size: int):
    """values at positions `at` (distinct; `size` and past are dropped) of a zero array."""
    return jnp.zeros(size, values.dtype).at[at].set(values, mode="drop")


def _pad_with_last(table, count):
    """Entries past `count` repeat entry count - 1 (count >= 1: every q tile has a step)."""
    return jnp.where(jnp.arange(table.shape[0]) < count, table, table[count - 1])


def block_segment_ranges(segment_ids, block: int, num_blocks: int | None = None):
    """(lo, hi), int32 [num_blocks]: the least and greatest segment id of each block of
    `block` consecutive tokens of `segment_ids` (int32 [seq]). Positions past seq (up to
    num_blocks * block, default the blocks that hold seq) are padding and count for nothing:
    a block of padding only gets lo = INT32_MAX > hi = INT32_MIN, an empty range."""
    segment_ids = jnp.asarray(segment_ids)
    if segment_ids.ndim != 1 or segment_ids.dtype != jnp.int32:
        raise ValueError(
            f"segment ids must be int32 [seq], got {segment_ids.dtype}[{segment_ids.shape}]"
        )
    seq = segment_ids.shape[0]
    num_blocks = -(-seq // block) if num_blocks is None else num_blocks
    padding = num_blocks * block - seq
    if padding < 0:
        raise ValueError(f"{seq} tokens do not fit {num_blocks} blocks of {block}")
    # The identities of min and max: padding never widens a range.
    lo = jnp.pad(segment_ids, (0, padding), constant_values=_INT32_MAX)
    hi = jnp.pad(segment_ids, (0, padding), constant_values=_INT32_MIN)
    return lo.reshape(num_blocks, block).min(1), hi.reshape(num_blocks, block).max(1)


def block_segment_bits(segment_ids, block: int, num_blocks: int):
    """int32 [num_blocks]: per block of `block` tokens, bit (id & 31) set for every
    non-negative id it holds (negative ids and positions past the array set none). Two blocks
    whose bits do not meet share no non-negative id: with fewer than 32 distinct ids, or ids
    that differ mod 32, that decides EMPTY exactly where ranges cannot (ids out of order,
    such as prompts packed after their videos)."""
    segment_ids = jnp.asarray(segment_ids, jnp.int32)
    padding = num_blocks * block - segment_ids.shape[0]
    bits = jnp.where(segment_ids >= 0, jnp.left_shift(jnp.int32(1), segment_ids & 31), jnp.int32(0))
    bits = jnp.pad(bits, (0, padding)).reshape(num_blocks, block)
    return lax.reduce(bits, jnp.int32(0), lax.bitwise_or, (1,))


def block_segments(row_ids, col_ids, row_block: int, col_block: int, rows: int, cols: int):
    """What `segment_block_kinds` reads of one walk's ids: the ranges of its `rows` blocks of
    `row_block` row ids and `cols` blocks of `col_block` column ids, then their bits (exact
    EMPTY for up to 32 ids in any order; negative ids set no bit, never pairing):
    (row lo, row hi, col lo, col hi, row bits, col bits)."""
    return (
        *block_segment_ranges(row_ids, row_block, rows),
        *block_segment_ranges(col_ids, col_block, cols),
        block_segment_bits(row_ids, row_block, rows),
        block_segment_bits(col_ids, col_block, cols),
    )


def segment_words(visits: StaticVisits, *ranges, **options):
    """int32 [V]: each visit's word refined by segments: `segment_block_kinds` packed."""
    return pack_words(visits, segment_block_kinds(visits, *ranges, **options))


def pack_words(visits: StaticVisits, kinds):
    """int32 [V]: kinds int32 [V, rq, rk] as words, 2 bits per block, row-major."""
    rq, rk = visits.q_blocks_per_tile, visits.kv_blocks_per_tile
    shifts = BITS_PER_BLOCK * np.arange(rq * rk).reshape(rq, rk)
    # Disjoint bit fields: the sum is their OR (int32 wraps into the sign bit at 16 blocks).
    return jnp.sum(kinds.astype(jnp.int32) << jnp.asarray(shifts), axis=(1, 2), dtype=jnp.int32)


def chosen_bits(visits: StaticVisits, chosen):
    """int32 [V]: bool [V, rq, rk] as one bit per block, row-major (a piece's chosen word:
    which of its SEGMENT_BOUNDARY blocks a selection chose, svgen.runtime.select)."""
    rq, rk = visits.q_blocks_per_tile, visits.kv_blocks_per_tile
    shifts = np.arange(rq * rk).reshape(rq, rk)
    return jnp.sum(chosen.astype(jnp.int32) << jnp.asarray(shifts), axis=(1, 2), dtype=jnp.int32)


def segment_block_kinds(
    visits: StaticVisits,
    q_lo,
    q_hi,
    kv_lo,
    kv_hi,
    q_bits=None,
    kv_bits=None,
    frame_kinds=None,
    frame_start=None,
    static_kinds=None,
    across_anyway=None,
):
    """int32 [V, rq, rk]: each visit's block kinds refined by segments (see the module
    docstring). static_kinds (a selection's, svgen.runtime.select): int32 [V, rq, rk], the
    kinds to refine instead of the visits' static words (selected blocks raised to FULL);
    across_anyway: bool [V, rq, rk], blocks that run as SEGMENT_BOUNDARY even inside one
    segment (a selected block holding the end of the keys: that kind tests them). q_lo,
    q_hi: int32 [num_q_tiles * rq], per compute block row; kv_lo, kv_hi: int32 [at least
    (last visited kv tile + 1) * rk], per compute block column (`block_segment_ranges`).
    q_bits, kv_bits (optional, `block_segment_bits`, the same shapes): blocks whose bits do
    not meet are disjoint too; pass them only when negative ids never pair with anything
    (svgen.runtime.segments makes every negative id -1 as a query and -2 as a key).
    frame_kinds (per-video frames, svgen.runtime.video_frames): int32 [V, rq, rk], each
    block's kind at the segment starts its pairs can have. Inside one segment it is the
    block's kind (capped by the static kind); a BOUNDARY one runs as SEGMENT_BOUNDARY, whose
    mask reads the shifted frames, unless frame_start (int32 [V, rq, rk], the segment's
    start) is 0, where the sequence's frames are the video's and the static code is right.
    Across segments its EMPTY drops the block."""
    rq, rk = visits.q_blocks_per_tile, visits.kv_blocks_per_tile
    if jnp.shape(q_lo) != (visits.num_q_tiles * rq,) or jnp.shape(q_hi) != jnp.shape(q_lo):
        raise ValueError(f"q ranges must be [{visits.num_q_tiles * rq}], got {jnp.shape(q_lo)}")
    need = (int(visits.kv_tile.max(initial=-1)) + 1) * rk
    if jnp.ndim(kv_lo) != 1 or jnp.shape(kv_lo)[0] < need or jnp.shape(kv_hi) != jnp.shape(kv_lo):
        raise ValueError(f"kv ranges must be [at least {need}], got {jnp.shape(kv_lo)}")
    # Static: each visit's block rows and columns, and its blocks' static kinds [V, rq, rk].
    rows = visits.q_tile[:, None] * rq + np.arange(rq)
    cols = visits.kv_tile[:, None] * rk + np.arange(rk)
    if static_kinds is None:
        shifts = BITS_PER_BLOCK * np.arange(rq * rk).reshape(rq, rk)
        static = (visits.word.view(np.uint32)[:, None, None] >> shifts) & KIND_MASK
        static = static.astype(np.int32)
    else:
        static = jnp.asarray(static_kinds, jnp.int32)

    ql, qh = (jnp.asarray(x, jnp.int32)[rows][:, :, None] for x in (q_lo, q_hi))
    kl, kh = (jnp.asarray(x, jnp.int32)[cols][:, None, :] for x in (kv_lo, kv_hi))
    no_queries = ql > qh
    disjoint = (qh < kl) | (kh < ql) | (kl > kh)
    if q_bits is not None:
        qb = jnp.asarray(q_bits, jnp.int32)[rows][:, :, None]
        kb = jnp.asarray(kv_bits, jnp.int32)[cols][:, None, :]
        disjoint = disjoint | ((qb & kb) == 0)
    one_segment = (ql == qh) & (kl == kh) & (ql == kl)
    if across_anyway is not None:
        one_segment = one_segment & ~across_anyway
    inside, across = static, SEGMENT_BOUNDARY
    if frame_kinds is not None:
        frame_kinds = jnp.asarray(frame_kinds, jnp.int32)
        inside = jnp.minimum(frame_kinds, static)
        moved = jnp.asarray(frame_start, jnp.int32) != 0
        inside = jnp.where((inside == TileKind.BOUNDARY) & moved, SEGMENT_BOUNDARY, inside)
        across = jnp.where(frame_kinds == TileKind.EMPTY, TileKind.EMPTY, SEGMENT_BOUNDARY)
    block = jnp.where(
        (static == TileKind.EMPTY) | disjoint,
        TileKind.EMPTY,
        jnp.where(one_segment, inside, across),
    )
    # Blocks of padding rows only: FULL where the rest of the tile is (one unmasked body),
    # else EMPTY, as at compile time; statically EMPTY ones stay EMPTY.
    wildcard = no_queries & (static != TileKind.EMPTY)
    rest_full = jnp.all((block == TileKind.FULL) | no_queries, axis=(1, 2), keepdims=True)
    return jnp.where(wildcard, jnp.where(rest_full, TileKind.FULL, TileKind.EMPTY), block)
