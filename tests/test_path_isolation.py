"""svgen.chip.path_isolation on a CPU: the table rewrites that isolate each path, and one run
of the tool in Pallas's interpreter (the shipped variant checked against the reference)."""

from __future__ import annotations

import json

import numpy as np

from spec_corpus import ANCHOR, any_of, spec_text
from svgen.chip import path_isolation

TINY = spec_text(
    "tiny_band", (4, 8, 16), 2, dtype="bfloat16", mask=any_of(ANCHOR, "{band: {width: 100}}")
)

RUNS = np.array([(0, 0, 2, 2, 0), (0, 2, 1, 1, 0b0110), (1, 1, 3, 1, 0b1001)])


def test_unmasked_runs_every_boundary_block_as_full_on_the_same_walk():
    runs = path_isolation.rewritten_runs(RUNS, "unmasked", q_tiles=2, kv_tiles=4)
    assert runs[:, :3].tolist() == RUNS[:, :3].tolist()
    # blocks 0b0110 = [BOUNDARY, BOUNDARY] -> [FULL, FULL]: 0b1010, its EMPTY blocks (none
    # here) still skipped; 0b1001 = [BOUNDARY, FULL] -> [FULL, FULL]
    assert runs[:, 3].tolist() == [2, 1, 1]
    assert runs[:, 4].tolist() == [0, 0b1010, 0b1010]
    # an EMPTY block stays EMPTY, so the variant computes no more blocks than the spec
    assert path_isolation.unmasked_word(0b100001) == (1, 0b100010)
    assert path_isolation.unmasked_word(0) == (2, 0)


def test_steps_keeps_the_walk_and_computes_nothing():
    runs = path_isolation.rewritten_runs(RUNS, "steps", q_tiles=2, kv_tiles=4)
    assert runs[:, :3].tolist() == RUNS[:, :3].tolist()
    assert runs[:, 3].tolist() == [0, 0, 0]


def test_dense_visits_every_tile_as_full():
    runs = path_isolation.rewritten_runs(RUNS, "dense", q_tiles=2, kv_tiles=4)
    assert runs.tolist() == [[0, 0, 4, 2, 0], [1, 0, 4, 2, 0]]


def test_the_tool_in_the_interpreter(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY)
    out = tmp_path / "paths.json"
    args = [str(spec), "--interpret", "--iters", "1", "--check-rows", "32", "--json", str(out)]
    assert path_isolation.main(args) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["shipped"]["max_error"] < 2e-2
    for variant in path_isolation.VARIANTS:
        assert result[variant]["median_ms"] > 0, variant
    tiles = result["tiles"]
    assert tiles["grid_tiles"] == 2 * 4 * 4 and 0 < tiles["full"] + tiles["boundary"] < 32
    assert "| tiny_band | 128x128/128x128 |" in capsys.readouterr().out
