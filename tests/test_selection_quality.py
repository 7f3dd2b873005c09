"""bench/selection_quality.py on small inputs: its generator is reproducible, its metrics are
exact at the ends (the all-True mask), top-k recall never falls as k grows, densities from
block counts equal those of the element masks, and the --quick run prints its table."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
from helpers import REPO

SCRIPT = REPO / "bench" / "selection_quality.py"
COLUMNS = ["mask", "parameter", "density", "recall", "out. rel. L2 err", "sel. blocks/row"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("selection_quality", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def small(bench):
    """A 3 x 8 x 8 video (192 tokens), 2 heads (one of each kind), 32-token compute blocks."""
    geometry = bench.Geometry(3, 8, 8)
    heads = bench.make_heads(5, geometry, 2)
    dense = [bench.dense_reference(h) for h in heads]
    return geometry, heads, dense, bench.Selector(geometry, heads, 32)


def test_the_generator_is_deterministic_for_a_seed(bench):
    geometry = bench.Geometry(2, 4, 6)
    first, again = bench.make_heads(7, geometry, 2), bench.make_heads(7, geometry, 2)
    other = bench.make_heads(8, geometry, 2)
    for a, b, c in zip(first, again, other):
        for name in ("q", "k", "v", "hitters"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert not np.allclose(a.q, c.q), "another seed must draw other activations"
    assert [h.kind for h in first] == ["spatial", "temporal"]


def test_the_all_true_mask_recalls_everything_with_no_error(bench, small):
    geometry, _, dense, _ = small
    n = geometry.seq_len
    quality = bench.mask_quality(dense, [np.ones((n, n), bool)] * len(dense))
    assert quality.density == 1.0
    assert quality.recall == pytest.approx(1.0, abs=1e-12)
    assert quality.error == pytest.approx(0.0, abs=1e-12)
    # and a real mask loses some: the metrics are not constants
    partial = bench.mask_quality(dense, [bench.window_mask(geometry, 0)] * len(dense))
    assert partial.recall < 1.0 - 1e-3 and partial.error > 1e-3


def test_top_k_recall_grows_with_k(bench, small):
    _, _, dense, selector = small
    recalls, densities = [], []
    for k in range(selector.max_k + 1):
        chosen = bench.choose(selector, bench.sel.TOP_K, k)
        quality = bench.mask_quality(dense, selector.keeps(chosen.blocks))
        recalls.append(quality.recall)
        densities.append(quality.density)
        assert chosen.density == pytest.approx(quality.density, abs=1e-12)  # block counts
    assert np.all(np.diff(recalls) >= -1e-12), recalls
    assert np.all(np.diff(densities) > 0), densities
    assert recalls[-1] == pytest.approx(1.0, abs=1e-12)  # every selectable block chosen


def test_the_band_density_formulas_count_the_masks_pairs(bench):
    geometry = bench.Geometry(3, 4, 5)
    n = geometry.seq_len
    for b in (0, 3, 17, n - 1):
        want = bench.band_mask(geometry, b).mean()
        assert bench.anchored_band_density(geometry, b) == pytest.approx(want, abs=1e-12)
        i = np.arange(n)
        alone = (np.abs(i[:, None] - i[None, :]) <= b).mean()
        assert bench.band_density(n, b) == pytest.approx(alone, abs=1e-12)


def test_the_quick_run_prints_the_table(bench, capsys):
    bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "not a real model's" in out
    assert "bench/selection_quality.py --seed 0 --frames 4" in out
    lines = [line for line in out.splitlines() if line.startswith("| mask |")]
    assert len(lines) == 1, out
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    body = out.splitlines()[out.splitlines().index(lines[0]) + 2 :]
    rows = []
    for line in body:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    assert {r[0] for r in rows} >= {"window", "band", "top-k", "top-p"}
    for mask, _, density, recall, error, blocks in rows:
        assert 0 < float(density) <= 1 and 0 <= float(recall) <= 1 and float(error) >= 0
        assert (blocks == "-") == (mask not in ("top-k", "top-p"))
    assert sum(line.startswith(("* top-p:", "* top-k:")) for line in out.splitlines()) == 2
