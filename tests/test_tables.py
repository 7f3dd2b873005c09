"""Block tables: runs and SMEM pieces decode to exactly the visited tiles; budget errors."""

import numpy as np
import pytest

from svgen.analysis import analyze
from svgen.analysis.classify import TileGrid
from svgen.analysis.tables import (
    MAX_SLOTS,
    build_runs,
    choose_piece_tables,
    kernel_tiles,
    tile_kinds,
)
from svgen.spec.errors import SpecError
from svgen.core.tables import (
    KIND_MASK,
    KV_BLOCK_MASK,
    KV_BLOCK_SHIFT,
    Q_BLOCK_SHIFT,
    PieceTables,
    split_runs,
)
from svgen.core.kinds import TileKind
from svgen.spec import parse_spec


def decode(tables: PieceTables, pattern: int):
    """(q_block, kv_block, kind) of every active grid step of one pattern, like the kernel."""
    first, count = int(tables.first_piece[pattern]), int(tables.num_pieces[pattern])
    entries = tables.entries[first : first + count].view(np.uint32).astype(np.int64)
    lengths = (
        np.ones(count, np.int64)
        if tables.lengths is None
        else tables.lengths[first : first + count]
    )
    steps = []
    for entry, length in zip(entries.tolist(), lengths.tolist()):
        for slot in range(tables.slots):
            if slot < length:
                steps.append(
                    (
                        entry >> Q_BLOCK_SHIFT,
                        ((entry >> KV_BLOCK_SHIFT) & KV_BLOCK_MASK) + slot,
                        entry & KIND_MASK,
                    )
                )
    return steps


def runs_of(kinds, grid):
    """Runs of tiles that are one compute block each."""
    return build_runs(*kernel_tiles(kinds, grid, grid), grid)


def _expected_steps(kinds, grid):
    kk = kernel_tiles(kinds, grid, grid)[0]
    expected = []
    for q in range(kinds.shape[0]):
        visited = [
            (q, kv, int(kk[q, kv])) for kv in range(kinds.shape[1]) if kk[q, kv] != TileKind.EMPTY
        ]
        expected += visited or [None]  # a q tile with nothing visited: one zero-fill step
    return expected


@pytest.mark.parametrize("seed", range(60))
def test_pieces_decode_to_exactly_the_visited_tiles(seed):
    rng = np.random.default_rng(seed)
    patterns = []
    for _ in range(int(rng.integers(1, 4))):
        nq, nk = (int(x) for x in rng.integers(1, 40, 2))
        kinds = rng.choice([0, 0, 1, 2, 2], size=(nq, nk)).astype(np.int8)
        # nq x nk tiles, the last kv tile partly padding (its FULL tiles run as BOUNDARY).
        grid = TileGrid(nq * nk * 128 - 5, nk * 128, nq * 128)
        assert (grid.num_q_blocks, grid.num_kv_blocks) == (nq, nk)
        patterns.append((kinds, grid, runs_of(kinds, grid)))
    runs = [r for _, _, r in patterns]
    # Anywhere from "only the longest pieces fit" to "one entry per step fits"; on even seeds
    # (when the two differ) strictly below the latter, so that pieces hold several tiles.
    longest = min(
        PieceTables.from_runs(runs, 2**k).scalar_prefetch_bytes(2)
        for k in range(1, MAX_SLOTS.bit_length())
    )
    one_per_step = PieceTables.from_runs(runs, 1).scalar_prefetch_bytes(2)
    force = seed % 2 == 0 and longest < one_per_step
    budget = int(
        rng.integers(longest, one_per_step)
        if force
        else rng.integers(min(longest, one_per_step), max(longest, one_per_step) + 64)
    )
    tables = choose_piece_tables(runs, heads=2, smem_budget=budget)
    assert tables.scalar_prefetch_bytes(2) <= budget
    if force:
        assert tables.slots > 1
    for index, (kinds, grid, pattern_runs) in enumerate(patterns):
        got = decode(tables, index)
        expected = _expected_steps(kinds, grid)
        assert len(got) == len(expected) == int(pattern_runs[:, 2].sum())
        previous = None
        for g, e in zip(got, expected):
            if e is None:  # zero-fill: it names the kv tile already resident, fetching nothing
                assert g[2] == TileKind.EMPTY
                assert g[1] == (0 if previous is None else previous[1])
            else:
                assert g == e
            previous = g


def test_smallest_piece_size_that_fits_is_chosen():
    kinds = np.full((4, 64), TileKind.FULL, np.int8)
    grid = TileGrid(64 * 128, 2048, 128)  # 4 q tiles x 64 kv tiles, all FULL: 4 runs of 64
    runs = [runs_of(kinds, grid)]
    assert choose_piece_tables(runs, heads=1).slots == 1
    overhead = 4 + 4 + 4  # per head: pattern, first piece, piece count
    small = choose_piece_tables(runs, heads=1, smem_budget=256 + overhead)  # 1 KiB at 1 per step
    # 4-tile pieces: 64 x (4 + 1) bytes = 320, too many; 8-tile pieces: 32 x 5 = 160.
    assert small.slots == 8 and small.max_pieces == 32 and small.lengths.dtype == np.int8
    assert small.scalar_prefetch_bytes(1) == 32 * 5 + overhead


def test_over_budget_spec_fails_with_bytes_pattern_and_a_tile_size_that_fits():
    spec = parse_spec(
        """svgen: 1
name: tight
geometry: {frames: 8, height: 16, width: 32}
attention: {heads: 1, head_dim: 128, dtype: float32}
mask: {temporal_stride: {}}
tiling: {block_q: 128, block_kv: 128}
""",
        source="tight.yaml",
    )
    with pytest.raises(SpecError) as err:
        analyze(spec, smem_budget=500)
    message = str(err.value)
    # 256 runs in 256-tile pieces: 4-byte entries + int16 lengths, + 12 bytes per head
    assert message.startswith("tight.yaml: tiling: pattern 'tight' needs 1,548 bytes")
    assert (
        "bytes of scalar-prefetch tables at 128 x 128 tiles, over the SMEM budget of 500" in message
    )
    assert "tiling {block_q: 512, block_kv: 512} would fit" in message


def _brute_kernel_tiles(compute_kinds, grid, compute):
    """kernel_tiles, one tile at a time, straight from the rules in tables.py's docstring."""
    rq, rk = grid.block_q // compute.block_q, grid.block_kv // compute.block_kv
    ncq, nck = compute_kinds.shape
    kinds = np.zeros((grid.num_q_blocks, grid.num_kv_blocks), np.int64)
    words = np.zeros_like(kinds)
    for i in range(grid.num_q_blocks):
        for j in range(grid.num_kv_blocks):
            block_kinds = []
            for a in range(rq):
                for b in range(rk):
                    r, c = i * rq + a, j * rk + b
                    if c >= nck:
                        k = TileKind.EMPTY  # padding keys only
                    elif r >= ncq:
                        k = None  # padding rows only
                    else:
                        k = int(compute_kinds[r, c])
                        if k == TileKind.FULL and c == nck - 1 and grid.seq_len % compute.block_kv:
                            k = TileKind.BOUNDARY  # holds the end of the real keys
                    block_kinds.append(k)
            real = [k for k in block_kinds if k is not None]
            full = all(k == TileKind.FULL for k in real)
            block_kinds = [
                (TileKind.FULL if full else TileKind.EMPTY) if k is None else k for k in block_kinds
            ]
            if full:
                kinds[i, j] = TileKind.FULL
            elif all(k == TileKind.EMPTY for k in block_kinds):
                kinds[i, j] = TileKind.EMPTY
            else:
                kinds[i, j] = TileKind.BOUNDARY
                if rq * rk > 1:
                    words[i, j] = sum(int(k) << (2 * n) for n, k in enumerate(block_kinds))
    return kinds, words


@pytest.mark.parametrize("seed", range(40))
def test_two_level_tiles_match_a_tile_by_tile_reading(seed):
    rng = np.random.default_rng(seed)
    cq, ckv = (int(x) for x in rng.choice([128, 256], 2))
    bq, bkv = cq * int(rng.integers(1, 4)), ckv * int(rng.integers(1, 5))
    seq_len = int(rng.integers(1, 12)) * 128 + int(rng.integers(0, 128)) + 1
    grid, compute = TileGrid(seq_len, bq, bkv), TileGrid(seq_len, cq, ckv)
    compute_kinds = rng.choice(
        [0, 1, 2, 2], size=(compute.num_q_blocks, compute.num_kv_blocks)
    ).astype(np.int8)
    kinds, words = kernel_tiles(compute_kinds, grid, compute)
    want_kinds, want_words = _brute_kernel_tiles(compute_kinds, grid, compute)
    np.testing.assert_array_equal(kinds, want_kinds)
    np.testing.assert_array_equal(words, want_words)
    # Tile kinds for reports: FULL / EMPTY iff every real compute block is.
    reported = tile_kinds(compute_kinds, grid, compute)
    for i in range(grid.num_q_blocks):
        for j in range(grid.num_kv_blocks):
            rows = slice(i * bq // cq, (i + 1) * bq // cq)
            cols = slice(j * bkv // ckv, (j + 1) * bkv // ckv)
            inside = compute_kinds[rows, cols]
            want = (
                TileKind.FULL
                if np.all(inside == TileKind.FULL)
                else TileKind.EMPTY
                if np.all(inside == TileKind.EMPTY)
                else TileKind.BOUNDARY
            )
            assert reported[i, j] == want
    # The blocks words survive the SMEM tables (narrow integer types, read back masked).
    runs = build_runs(kinds, words, grid)
    tables = PieceTables.from_runs([runs], 1, (bq // cq) * (bkv // ckv))
    if (bq // cq) * (bkv // ckv) > 1:
        stored = tables.blocks.astype(np.int64) & ((1 << (8 * tables.blocks.itemsize)) - 1)
        np.testing.assert_array_equal(stored, split_runs(runs, 1)[:, 4])
    else:
        assert tables.blocks is None


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("slots", [1, 2, 8, 64])
def test_reported_table_bytes_are_the_scalar_prefetch_operands_bytes(slots, flat):
    """The SMEM bytes the compiler reports and budgets are exactly what the kernel's
    scalar-prefetch operands hold (per head, per step when flat, and the pieces)."""
    import jax.numpy as jnp

    from svgen.runtime.steps import head_operands

    rng = np.random.default_rng(slots)
    runs = []
    for nq, nk in ((9, 30), (12, 17)):
        kinds = rng.choice([0, 1, 2, 2, 2], size=(nq, nk)).astype(np.int8)
        runs.append(runs_of(kinds, TileGrid(nq * nk * 128, nk * 128, nq * 128)))
    tables = PieceTables.from_runs(runs, slots, compute_blocks=4, flat=flat)
    head_pattern = np.array([0, 1, 1, 0, 1])
    operands, _ = head_operands(tables, jnp.asarray(head_pattern), head_pattern)
    actual = sum(int(np.asarray(x).nbytes) for x in operands) + sum(
        t.nbytes for t in tables.piece_operands()
    )
    assert tables.scalar_prefetch_bytes(len(head_pattern)) == actual
    if slots > 1:
        assert tables.lengths is not None and tables.lengths.itemsize == 1
