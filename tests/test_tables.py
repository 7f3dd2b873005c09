"""Block tables: runs and SMEM pieces decode to exactly the visited tiles; budget errors."""

import numpy as np
import pytest

from svgen.analysis import analyze
from svgen.analysis.classify import TileGrid
from svgen.analysis.tables import build_runs, choose_piece_tables, kernel_kinds
from svgen.errors import SpecError
from svgen.runtime.kernel import (KIND_MASK, KV_BLOCK_MASK, KV_BLOCK_SHIFT, Q_BLOCK_SHIFT,
                                  PieceTables)
from svgen.runtime.kinds import TileKind
from svgen.spec import parse_spec


def decode(tables: PieceTables, pattern: int):
    """(q_block, kv_block, kind) of every active grid step of one pattern, like the kernel."""
    first, count = int(tables.first_piece[pattern]), int(tables.num_pieces[pattern])
    entries = tables.entries[first:first + count].view(np.uint32).astype(np.int64)
    lengths = (np.ones(count, np.int64) if tables.lengths is None
               else tables.lengths[first:first + count])
    steps = []
    for entry, length in zip(entries.tolist(), lengths.tolist()):
        for slot in range(tables.slots):
            if slot < length:
                steps.append((entry >> Q_BLOCK_SHIFT,
                              ((entry >> KV_BLOCK_SHIFT) & KV_BLOCK_MASK) + slot,
                              entry & KIND_MASK))
    return steps


def _expected_steps(kinds, grid):
    kk = kernel_kinds(kinds, grid)
    expected = []
    for q in range(kinds.shape[0]):
        visited = [(q, kv, int(kk[q, kv])) for kv in range(kinds.shape[1])
                   if kk[q, kv] != TileKind.EMPTY]
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
        patterns.append((kinds, grid, build_runs(kinds, grid)))
    runs = [r for _, _, r in patterns]
    total_runs = sum(len(r) for r in runs)
    total_steps = sum(int(r[:, 2].sum()) for r in runs)
    # Anywhere from "only the longest pieces fit" to "one entry per step fits".
    lo, hi = 8 * total_runs + 32, 4 * total_steps + 32
    budget = int(rng.integers(min(lo, hi), max(lo, hi) + 1))
    tables = choose_piece_tables(runs, heads=2, smem_budget=budget)
    assert tables.scalar_prefetch_bytes(2) <= budget
    for index, (kinds, grid, pattern_runs) in enumerate(patterns):
        got = decode(tables, index)
        expected = _expected_steps(kinds, grid)
        assert len(got) == len(expected) == int(pattern_runs[:, 2].sum())
        for g, e in zip(got, expected):
            assert g[2] == TileKind.EMPTY if e is None else g == e


def test_smallest_piece_size_that_fits_is_chosen():
    kinds = np.full((4, 64), TileKind.FULL, np.int8)
    grid = TileGrid(64 * 128, 2048, 128)  # 4 q tiles x 64 kv tiles, all FULL: 4 runs of 64
    runs = [build_runs(kinds, grid)]
    assert choose_piece_tables(runs, heads=1).slots == 1
    overhead = 4 + 4 + 4  # per head: pattern, first piece, piece count
    small = choose_piece_tables(runs, heads=1, smem_budget=256 + overhead)  # 1 KiB at 1 per step
    # 4-tile pieces: 64 x (4 + 1) bytes = 320, too many; 8-tile pieces: 32 x 5 = 160.
    assert small.slots == 8 and small.max_pieces == 32 and small.lengths.dtype == np.int8
    assert small.scalar_prefetch_bytes(1) == 32 * 5 + overhead


def test_over_budget_spec_fails_with_bytes_pattern_and_a_tile_size_that_fits():
    spec = parse_spec("""svgen: 1
name: tight
geometry: {frames: 8, height: 16, width: 32}
attention: {heads: 1, head_dim: 128, dtype: float32}
mask: {temporal_stride: {}}
tiling: {block_q: 128, block_kv: 128}
""", source="tight.yaml")
    with pytest.raises(SpecError) as err:
        analyze(spec, smem_budget=500)
    message = str(err.value)
    # 256 runs in 256-tile pieces: 4-byte entries + int16 lengths, + 12 bytes per head
    assert message.startswith("tight.yaml: tiling: pattern 'tight' needs 1,548 bytes")
    assert "bytes of scalar-prefetch tables at 128 x 128 tiles, over the SMEM budget of 500" \
        in message
    assert "tiling {block_q: 512, block_kv: 512} would fit" in message
