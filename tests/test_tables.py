"""Block tables: runs and SMEM pieces decode to exactly the visited tiles; budget errors."""

import numpy as np
import pytest

from svgen.analysis import analyze
from svgen.analysis.classify import TileGrid
from svgen.analysis.tables import build_block_table, build_runs, kernel_kinds
from svgen.errors import SpecError
from svgen.runtime.kernel import (KIND_MASK, KV_BLOCK_MASK, KV_BLOCK_SHIFT, Q_BLOCK_SHIFT,
                                  PieceTable)
from svgen.runtime.kinds import TileKind
from svgen.spec import parse_spec


def decode(pieces: PieceTable):
    """(q_block, kv_block, kind) of every active grid step, in grid order, like the kernel."""
    entries = pieces.entries.view(np.uint32).astype(np.int64)
    lengths = np.ones(entries.size, np.int64) if pieces.lengths is None else pieces.lengths
    steps = []
    for entry, length in zip(entries.tolist(), lengths.tolist()):
        for slot in range(pieces.slots):
            if slot < length:
                steps.append((entry >> Q_BLOCK_SHIFT,
                              ((entry >> KV_BLOCK_SHIFT) & KV_BLOCK_MASK) + slot,
                              entry & KIND_MASK))
    return steps


@pytest.mark.parametrize("seed", range(60))
def test_pieces_decode_to_exactly_the_visited_tiles(seed):
    rng = np.random.default_rng(seed)
    nq, nk = (int(x) for x in rng.integers(1, 40, 2))
    kinds = rng.choice([0, 0, 1, 2, 2], size=(nq, nk)).astype(np.int8)
    grid = TileGrid(nq * 128, 128, 128)
    runs = build_runs(kinds, grid)
    # Anywhere from "only the longest pieces fit" to "one entry per step fits".
    longest_fit, one_per_step = 8 * len(runs), 4 * int(runs[:, 2].sum())
    budget = int(rng.integers(min(longest_fit, one_per_step), max(longest_fit, one_per_step) + 9))
    table = build_block_table(kinds, grid, smem_budget=budget)
    expected = []
    kk = kernel_kinds(kinds, grid)
    for q in range(nq):
        visited = [(q, kv, int(kk[q, kv])) for kv in range(nk) if kk[q, kv] != TileKind.EMPTY]
        expected += visited or [None]  # a q tile with nothing visited: one zero-fill step
    got = decode(table.pieces)
    assert len(got) == len(expected) == table.visited_steps
    for g, e in zip(got, expected):
        if e is None:
            assert g[2] == TileKind.EMPTY
        else:
            assert g == e
    assert table.grid_steps >= table.visited_steps
    assert table.scalar_prefetch_bytes == table.pieces.entries.nbytes + (
        0 if table.pieces.lengths is None else table.pieces.lengths.nbytes)


def test_smallest_piece_size_that_fits_is_chosen():
    kinds = np.full((4, 64), TileKind.FULL, np.int8)
    grid = TileGrid(64 * 128, 2048, 128)  # 4 q tiles x 64 kv tiles, all FULL: 4 runs of 64
    assert build_block_table(kinds, grid).pieces.slots == 1
    small = build_block_table(kinds, grid, smem_budget=256)  # 1 KiB at one entry per step
    assert small.pieces.slots == 8 and small.pieces.num_pieces == 32
    assert small.scalar_prefetch_bytes == 256 and small.grid_steps == 256


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
    assert message.startswith("tight.yaml: tiling: pattern 'tight' needs 2,048 bytes")
    assert "bytes of scalar-prefetch tables at 128 x 128 tiles, over the SMEM budget of 500" \
        in message
    assert "tiling {block_q: 512, block_kv: 512} would fit" in message
