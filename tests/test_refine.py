"""Tables refined on device (svgen.runtime.refine) against the compile-time path as oracle:
the refined kinds go through `build_runs` / `kernel_tiles` and `PieceTables.from_runs`, and
the on-device pieces must equal them exactly; segment refinement is checked sound against a
brute-force classification of (static mask AND same segment)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import brute_force_kinds
from svgen.analysis.classify import TileGrid
from svgen.analysis.tables import build_runs, kernel_tiles
from svgen.core.kinds import TileKind
from svgen.runtime.refine import (
    SEGMENT_BOUNDARY,
    StaticVisits,
    block_segment_bits,
    block_segment_ranges,
    refine,
    segment_words,
)
from svgen.core.tables import BITS_PER_BLOCK, PieceTables

EMPTY, BOUNDARY, FULL = int(TileKind.EMPTY), int(TileKind.BOUNDARY), int(TileKind.FULL)
SHAPES = [(1, 1), (2, 1), (2, 2)]  # compute blocks per tile: rq x rk
SLOTS = [1, 2, 4]
CQ, CKV = 4, 4  # compute block sizes (tokens)


@dataclasses.dataclass
class Pattern:
    """A static pattern as the compiler builds it, and its visits."""

    compute_kinds: np.ndarray  # [compute rows, compute cols] of the real tokens
    grid: TileGrid
    compute: TileGrid
    runs: np.ndarray
    visits: StaticVisits

    @property
    def rq(self) -> int:
        return self.visits.q_blocks_per_tile

    @property
    def rk(self) -> int:
        return self.visits.kv_blocks_per_tile


def compile_pattern(compute_kinds, seq: int, rq: int, rk: int) -> Pattern:
    """The compile-time path: compute-block kinds -> kernel tiles -> runs -> visits."""
    grid, compute = TileGrid(seq, rq * CQ, rk * CKV), TileGrid(seq, CQ, CKV)
    runs = build_runs(*kernel_tiles(compute_kinds, grid, compute), grid)
    return Pattern(compute_kinds, grid, compute, runs, StaticVisits.from_runs(runs, rq, rk))


def random_pattern(rng, rq: int, rk: int) -> Pattern:
    """Random compute-block kinds on a sequence that rarely fills its last tiles."""
    seq = int(rng.integers(1, 90))
    shape = (-(-seq // CQ), -(-seq // CKV))
    weights = rng.dirichlet(np.ones(3)) if rng.random() < 0.8 else [1.0, 0.0, 0.0]
    kinds = rng.choice([EMPTY, BOUNDARY, FULL], size=shape, p=weights).astype(np.int8)
    return compile_pattern(kinds, seq, rq, rk)


def pack_words(blocks: np.ndarray) -> np.ndarray:
    """int32 words of per-block kinds [V, compute blocks] (2 bits each, row-major)."""
    shifts = BITS_PER_BLOCK * np.arange(blocks.shape[1], dtype=np.int64)
    return (blocks.astype(np.int64) << shifts).sum(1).astype(np.uint32).view(np.int32)


def unpack_words(words, compute_blocks: int) -> np.ndarray:
    shifts = BITS_PER_BLOCK * np.arange(compute_blocks)
    return (np.asarray(words).view(np.uint32)[:, None] >> shifts) & 3


def oracle_tables(pattern: Pattern, words, slots: int) -> PieceTables:
    """The compile-time tables of the tile kinds the refined words say (NumPy)."""
    visits = pattern.visits
    cb = visits.compute_blocks
    blocks = unpack_words(words, cb)
    kind = np.where(
        (blocks == FULL).all(1), FULL, np.where((blocks == EMPTY).all(1), EMPTY, BOUNDARY)
    )
    if cb == 1:  # the word is the tile's kind, SEGMENT_BOUNDARY included
        kind = blocks[:, 0]
    shape = (pattern.grid.num_q_blocks, pattern.grid.num_kv_blocks)
    kinds, table_words = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    kinds[visits.q_tile, visits.kv_tile] = kind
    if cb > 1:
        word = np.asarray(words).view(np.uint32).astype(np.int64)
        table_words[visits.q_tile, visits.kv_tile] = np.where(kind == BOUNDARY, word, 0)
    runs = build_runs(kinds, table_words, pattern.grid)
    return PieceTables.from_runs([runs], slots, cb)


@functools.lru_cache(maxsize=None)
def jitted_refine(visits: StaticVisits, slots: int):
    return jax.jit(lambda words: refine(visits, words, slots))


def assert_tables_equal(got, expected: PieceTables, visits: StaticVisits):
    n = int(got.num_pieces)
    assert n == int(expected.num_pieces[0])
    assert 1 <= n <= visits.max_pieces
    pairs = [(got.entries, expected.entries), (got.lengths, expected.lengths)]
    pairs.append((got.blocks, expected.blocks))
    for table, want in pairs:
        if want is None:
            assert table is None
            continue
        table = np.asarray(table)
        assert table.dtype == want.dtype and table.shape == (visits.max_pieces,)
        np.testing.assert_array_equal(table[:n], want)
        # Past num_pieces: the last piece, repeated (what the kernel's clamped read sees).
        np.testing.assert_array_equal(table[n:], np.full(visits.max_pieces - n, want[-1]))


def word_cases(rng, pattern: Pattern) -> dict[str, np.ndarray]:
    """Refined words of many kinds: static, all dropped, random, q tiles dropped, ..."""
    visits = pattern.visits
    v, cb = visits.num_visits, visits.compute_blocks
    static = unpack_words(visits.word, cb)
    lower = rng.integers(0, 3, size=(v, cb))
    refined = np.where(static == FULL, lower, np.where(static == BOUNDARY, lower % 2, EMPTY))
    dropped_rows = rng.random(visits.num_q_tiles) < 0.5
    rows_dropped = np.where(dropped_rows[visits.q_tile][:, None], EMPTY, static)
    sparse = np.where(rng.random((v, 1)) < 0.15, static, EMPTY)
    anything = rng.integers(0, 3, size=(v, cb))
    # Whole tiles set to one kind at random: long runs, merges and splits of runs.
    tiles = np.repeat(rng.choice([EMPTY, BOUNDARY, FULL], size=(v, 1)), cb, axis=1)
    cases = {
        "static": static,
        "dropped": np.zeros((v, cb), np.int64),
        "refined": refined,
        "rows_dropped": rows_dropped,
        "sparse": sparse,
        "anything": anything,
        "tiles": tiles,
    }
    return {name: pack_words(blocks) for name, blocks in cases.items()}


def refined_compute_blocks(rng, pattern: Pattern):
    """The whole compile-time path: a refined compute-block grid (each block only lowered)
    through kernel_tiles, as (the words it implies per static visit, kinds, words grids)."""
    visits, static = pattern.visits, pattern.compute_kinds
    lowered = rng.integers(0, 3, size=static.shape)
    refined = np.where(static == FULL, lowered, np.where(static == BOUNDARY, lowered % 2, EMPTY))
    kind, word = kernel_tiles(refined.astype(np.int8), pattern.grid, pattern.compute)
    # Every refined visit is a static one; its word is its blocks' kinds (FULL tiles: all).
    assert set(zip(*np.nonzero(kind))) <= set(zip(visits.q_tile, visits.kv_tile))
    tile_kind = kind[visits.q_tile, visits.kv_tile]
    if visits.compute_blocks == 1:
        return tile_kind.astype(np.int32), kind, word
    words = word[visits.q_tile, visits.kv_tile].astype(np.uint32).view(np.int32)
    full = pack_words(np.full((1, visits.compute_blocks), FULL))[0]
    return np.where(tile_kind == FULL, full, words).astype(np.int32), kind, word


@pytest.mark.parametrize("rq, rk", SHAPES)
@pytest.mark.parametrize("seed", range(5))
def test_refined_pieces_equal_the_compile_time_tables(seed, rq, rk):
    rng = np.random.default_rng([seed, rq, rk])
    pattern = random_pattern(rng, rq, rk)
    visits = pattern.visits
    cases = word_cases(rng, pattern)
    np.testing.assert_array_equal(cases["static"], visits.word)
    lowered_words, lowered_kind, lowered_word = refined_compute_blocks(rng, pattern)
    lowered_runs = build_runs(lowered_kind, lowered_word, pattern.grid)
    for slots in SLOTS:
        run = jitted_refine(visits, slots)  # one compile for all the cases
        # With the static words the static tables come back, whatever the piece size.
        expected = PieceTables.from_runs([pattern.runs], slots, visits.compute_blocks)
        assert_tables_equal(run(visits.word), expected, visits)
        for words in cases.values():
            assert_tables_equal(run(words), oracle_tables(pattern, words, slots), visits)
        expected = PieceTables.from_runs([lowered_runs], slots, visits.compute_blocks)
        assert_tables_equal(run(lowered_words), expected, visits)
        assert run._cache_size() == 1


@pytest.mark.parametrize("slots", SLOTS)
def test_the_static_maximum_is_reached(slots):
    """Alternating FULL and BOUNDARY tiles make every visit its own piece: the bound holds
    with equality, and a q tile with nothing left takes exactly one step."""
    seq = 64
    kinds = np.full((seq // CQ, seq // CKV), FULL, np.int8)
    kinds[3] = EMPTY  # a q tile the compiler already fills with zeros
    pattern = compile_pattern(kinds, seq, 1, 1)
    visits = pattern.visits
    assert visits.max_pieces == visits.num_visits + 1
    words = np.where(visits.kv_tile % 2 == 0, FULL, BOUNDARY).astype(np.int32)
    got = jitted_refine(visits, slots)(words)
    assert int(got.num_pieces) == visits.max_pieces
    assert_tables_equal(got, oracle_tables(pattern, words, slots), visits)
    got = jitted_refine(visits, slots)(np.zeros(visits.num_visits, np.int32))
    assert int(got.num_pieces) == visits.num_q_tiles


def test_a_pattern_that_visits_nothing():
    pattern = compile_pattern(np.zeros((5, 5), np.int8), 20, 1, 1)
    assert pattern.visits.num_visits == 0 and pattern.visits.max_pieces == 5
    for slots in SLOTS:
        got = jitted_refine(pattern.visits, slots)(np.zeros(0, np.int32))
        assert_tables_equal(got, PieceTables.from_runs([pattern.runs], slots), pattern.visits)


def test_bad_runs_and_words_are_refused():
    pattern = compile_pattern(np.full((4, 4), FULL, np.int8), 16, 1, 1)
    with pytest.raises(ValueError, match="every q tile"):
        StaticVisits.from_runs(pattern.runs[pattern.runs[:, 0] != 1])
    with pytest.raises(ValueError, match="sorted"):
        StaticVisits.from_runs(pattern.runs[::-1])
    with pytest.raises(ValueError, match="words must be"):
        refine(pattern.visits, np.zeros(3, np.int32), 1)


# Segment ids ---------------------------------------------------------------------------


def random_keep(rng, seq: int) -> np.ndarray:
    """A static mask [seq, seq] with FULL, EMPTY and mixed compute blocks."""
    nq, nk = -(-seq // CQ), -(-seq // CKV)
    choice = rng.choice(3, size=(nq, nk), p=rng.dirichlet(np.ones(3)))
    per_block = np.repeat(np.repeat(choice, CQ, 0), CKV, 1)[:seq, :seq]
    return np.where(
        per_block == 2, True, np.where(per_block == 0, False, rng.random((seq, seq)) < 0.5)
    )


def random_segments(rng, seq: int, mode: str) -> np.ndarray:
    """Per-token segment ids: contiguous segments (one-token ones included) numbered in
    order, with gaps, relabelled out of order, one segment, or one per token."""
    if mode == "one":
        return np.full(seq, int(rng.integers(-5, 5)), np.int32)
    if mode == "each":
        return np.arange(seq, dtype=np.int32)
    cuts = np.flatnonzero(rng.random(seq - 1) < rng.choice([0.05, 0.2, 0.6])) + 1
    ids = np.zeros(seq, np.int64)
    ids[cuts] = 1
    ids = np.cumsum(ids)  # 0, 1, 2, ... in order
    if mode == "gaps":
        ids = np.cumsum(rng.integers(1, 4, size=ids.max() + 1))[ids] - 100
    elif mode == "shuffled":
        ids = rng.permutation(ids.max() + 1)[ids]
    return ids.astype(np.int32)


MODES = ["consecutive", "gaps", "shuffled", "one", "each"]


def segment_pipeline(pattern: Pattern, slots: int):
    """jit(segment ids [seq] -> (refined words, pieces)): what a kernel wrapper would run."""
    visits = pattern.visits
    q_rows = visits.num_q_tiles * pattern.rq
    kv_cols = pattern.grid.num_kv_blocks * pattern.rk

    def run(ids):
        q_lo, q_hi = block_segment_ranges(ids, CQ, q_rows)
        kv_lo, kv_hi = block_segment_ranges(ids, CKV, kv_cols)
        words = segment_words(visits, q_lo, q_hi, kv_lo, kv_hi)
        return words, refine(visits, words, slots)

    return jax.jit(run)


def check_segment_words(pattern: Pattern, keep, ids, words, consecutive: bool):
    """Sound against (keep AND same segment) per compute block; exact where the rule says."""
    visits, seq = pattern.visits, pattern.grid.seq_len
    rq, rk = pattern.rq, pattern.rk
    kept = keep & (ids[:, None] == ids[None, :])
    static = unpack_words(visits.word, visits.compute_blocks).reshape(-1, rq, rk)
    got = unpack_words(words, visits.compute_blocks).reshape(-1, rq, rk)
    for v in range(visits.num_visits):
        row0, col0 = visits.q_tile[v] * rq, visits.kv_tile[v] * rk
        real_row = [(row0 + i) * CQ < seq for i in range(rq)]
        for i in range(rq):
            for j in range(rk):
                s, g = int(static[v, i, j]), int(got[v, i, j])
                assert g == EMPTY or s != EMPTY, "a block went up"
                assert g != FULL or s == FULL, "a block went up"
                rows = slice((row0 + i) * CQ, (row0 + i + 1) * CQ)
                cols = slice((col0 + j) * CKV, (col0 + j + 1) * CKV)
                if not real_row[i]:  # padding rows only: the compile-time wildcard rule
                    others = [got[v, a, b] for a in range(rq) for b in range(rk) if real_row[a]]
                    wildcard = FULL if all(o == FULL for o in others) else EMPTY
                    assert g == (EMPTY if s == EMPTY else wildcard)
                    continue
                block, same = kept[rows, cols], ids[rows][:, None] == ids[cols][None, :]
                if g == EMPTY:
                    assert not block.any(), "EMPTY where a pair is kept"
                if g == FULL:
                    assert block.all(), "FULL where a pair is dropped"
                    assert (col0 + j + 1) * CKV <= seq, "FULL over padding keys"
                if same.size and same.all() and len(np.unique(ids[rows])) == 1:
                    assert g == s, "a block inside one segment lost its static kind"
                elif g != EMPTY:
                    assert g == SEGMENT_BOUNDARY, "a block across segments skips their test"
                if consecutive and s != EMPTY:
                    assert (g == EMPTY) == (not same.any()), "EMPTY is exact for ids in order"


@pytest.mark.parametrize("rq, rk", SHAPES)
@pytest.mark.parametrize("seed", range(5))
def test_segment_words_are_sound(seed, rq, rk):
    rng = np.random.default_rng([seed, rq, rk, 2])
    seq = int(rng.integers(2, 70))
    keep = random_keep(rng, seq)
    pattern = compile_pattern(brute_force_kinds(keep, CQ, CKV), seq, rq, rk)
    slots = SLOTS[seed % len(SLOTS)]
    run = segment_pipeline(pattern, slots)
    for mode in MODES:
        for _ in range(3):
            ids = random_segments(rng, seq, mode)
            words, pieces = run(ids)
            words = np.asarray(words)
            check_segment_words(pattern, keep, ids, words, mode in ("consecutive", "each"))
            assert_tables_equal(pieces, oracle_tables(pattern, words, slots), pattern.visits)
            if mode == "one":  # one segment changes nothing
                np.testing.assert_array_equal(words, pattern.visits.word)
    assert run._cache_size() == 1  # one compile for every segment layout


def test_block_segment_ranges_ignore_padding():
    ids = jnp.array([3, 3, 4, 7, 7, 2, 9], jnp.int32)
    lo, hi = block_segment_ranges(ids, 3, 4)
    np.testing.assert_array_equal(lo, [3, 2, 9, np.iinfo(np.int32).max])
    np.testing.assert_array_equal(hi, [4, 7, 9, np.iinfo(np.int32).min])
    with pytest.raises(ValueError, match="int32"):
        block_segment_ranges(ids.astype(jnp.int16), 3)
    with pytest.raises(ValueError, match="do not fit"):
        block_segment_ranges(ids, 3, 2)


def test_one_compile_and_vmap_over_a_batch_of_segment_layouts():
    rng = np.random.default_rng(7)
    seq, rq, rk, slots = 45, 2, 2, 2
    keep = random_keep(rng, seq)
    pattern = compile_pattern(brute_force_kinds(keep, CQ, CKV), seq, rq, rk)
    run = segment_pipeline(pattern, slots)
    batch = np.stack([random_segments(rng, seq, MODES[b % len(MODES)]) for b in range(6)])
    singles = [run(ids) for ids in batch]
    assert run._cache_size() == 1
    words, pieces = jax.jit(jax.vmap(run))(batch)
    assert pieces.entries.shape == (len(batch), pattern.visits.max_pieces)
    for b, (single_words, single) in enumerate(singles):
        np.testing.assert_array_equal(words[b], single_words)
        for got, want in zip(pieces, single):
            if want is not None:
                np.testing.assert_array_equal(got[b], want)
        assert_tables_equal(
            jax.tree.map(lambda x: x[b], pieces),
            oracle_tables(pattern, np.asarray(single_words), slots),
            pattern.visits,
        )


@pytest.mark.parametrize("rq, rk", SHAPES)
def test_segment_bits_make_empty_exact_for_ids_in_any_order(rq, rk):
    """With bits (ids < 32, shuffled, as prompts packed after their videos are), a statically
    visited block is EMPTY exactly when its queries and keys share no id; still sound."""
    rng = np.random.default_rng([rq, rk, 9])
    seq = int(rng.integers(20, 70))
    keep = random_keep(rng, seq)
    pattern = compile_pattern(brute_force_kinds(keep, CQ, CKV), seq, rq, rk)
    visits = pattern.visits
    q_rows, kv_cols = visits.num_q_tiles * rq, pattern.grid.num_kv_blocks * rk

    @jax.jit
    def words_of(ids):
        q_lo, q_hi = block_segment_ranges(ids, CQ, q_rows)
        kv_lo, kv_hi = block_segment_ranges(ids, CKV, kv_cols)
        q_bits = block_segment_bits(ids, CQ, q_rows)
        kv_bits = block_segment_bits(ids, CKV, kv_cols)
        return segment_words(visits, q_lo, q_hi, kv_lo, kv_hi, q_bits, kv_bits)

    np.testing.assert_array_equal(
        block_segment_bits(jnp.asarray([0, 3, -1, 33, 5], jnp.int32), 2, 3), [9, 2, 32]
    )
    for _ in range(8):
        ids = np.sort(rng.integers(0, 12, size=seq)).astype(np.int32)
        ids = rng.permutation(12)[ids].astype(np.int32)  # segments out of order
        words = np.asarray(words_of(ids))
        check_segment_words(pattern, keep, ids, words, consecutive=True)
