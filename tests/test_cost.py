"""`svgen cost`: per-path bundles from libtpu's schedule, and a model that adds up.

The command runs in a subprocess: libtpu must get its dump flags before it starts, and other
tests in this process start it without them.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from svgen.estimate import cost
from svgen.estimate.cost import PathCosts, model_cycles
from svgen.core.tables import PieceTables
from svgen.core.kinds import TileKind

SMALL = """svgen: 1
name: small_cost
geometry: {frames: 7, height: 8, width: 40}  # 2,240 tokens: the last compute block holds padding
attention: {heads: 2, head_dim: 128, dtype: bfloat16}
mask:
  any_of:
    - first_frame: {frames: 1}
    - spatial_window: {frames: 0}
tiling: {block_q: 256, block_kv: 512, compute_q: 128, compute_kv: 256}
"""


_CACHE: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _shared_cost_cache(tmp_path_factory):
    """One cost cache for this module's commands (in each test process): the tests cost the
    same small spec's kernels (its forward under --backward, its dense twin), each compiled
    once; the cache is keyed by the kernels' files, so a spec of other content compiles anew."""
    _CACHE["dir"] = str(tmp_path_factory.mktemp("cost_cache"))
    yield
    _CACHE.clear()


def svgen(tmp_path, *args) -> subprocess.CompletedProcess:
    """`svgen ARGS` in tmp_path, in a process of its own, with the module's cost cache (a
    second call with the same spec reads what the first compiled)."""
    return subprocess.run(
        [sys.executable, "-m", "svgen.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "SVGEN_CACHE_DIR": _CACHE["dir"]},
    )


def cost_json(tmp_path, spec: str, *flags) -> dict:
    """`svgen cost SPEC --json FLAGS` in tmp_path (svgen), its report."""
    result = svgen(tmp_path, "cost", spec, "--json", *flags)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cost_json_on_a_small_spec(tmp_path):
    (tmp_path / "small.yaml").write_text(SMALL)
    report = cost_json(tmp_path, "small.yaml")
    for key in (
        "target",
        "cycles",
        "ms",
        "clock_ghz",
        "paths",
        "steps",
        "dense_cycles",
        "vmem_bytes",
        "smem_bytes",
    ):
        assert key in report
    assert report["target"] == "v6e" and "static" in report["model"]
    assert "key_pass_cycles" not in report  # online: no pass over k
    paths = report["paths"]
    assert 0 < paths["bookkeeping"] < paths["full"]
    assert min(paths["init"]) > 0 and paths["finalize"] > 0 and paths["pipeline"] > 0
    # 2 x 2 compute blocks per tile: a FULL and a BOUNDARY cost for each, all positive.
    assert len(paths["block"][0]) == 4
    assert all(full > 0 and boundary > full for full, boundary, _ in paths["block"][0])
    # The padding test costs more, and only the block column that can hold padding has it.
    padded = [padding - boundary for _, boundary, padding in paths["block"][0]]
    assert all(extra >= 0 for extra in padded) and any(extra > 0 for extra in padded)
    by_path = report["cycles_by_path"]
    assert report["cycles"] == sum(by_path.values())
    assert by_path["full"] == report["steps"]["full"] * paths["full"]
    assert report["ms"] == report["cycles"] / (report["clock_ghz"] * 1e6)
    assert report["dense_cycles"] > report["cycles"]  # the mask skips work
    # Useful work: 4 x head_dim FLOPs per kept pair. Frame 0's 320 rows keep their frame;
    # the other 6 frames' rows keep their frame and frame 0: 320^2 + 6 x 320 x 640 per head.
    use = report["utilisation"]
    assert use["useful_flops"] == 4 * 128 * 2 * (320 * 320 + 6 * 320 * 640)
    assert use["useful_flops_exact"] and use["peak_flops_per_s"] == 918e12
    rate = use["useful_flops"] * report["clock_ghz"] * 1e9 / report["cycles"]
    assert use["useful_flops_per_s"] == pytest.approx(rate, rel=1e-12)
    assert 0 < use["of_peak"] < use["dense_of_peak"] < 1  # the dense kernel has no masks
    # A second run reads the cached per-path costs: no compile, the same numbers.
    again = svgen(tmp_path, "cost", "small.yaml", "--json")
    assert json.loads(again.stdout)["cycles"] == report["cycles"]
    # Dense at its best for the geometry: the spec's own tiling and those of DENSE_TILINGS
    # that fit 2,240 tokens, each the model of a spec that keeps every pair at that tiling.
    best = report["dense_best"]
    assert best["tilings_modelled"] == 3 and best["cycles"] <= report["dense_cycles"]
    bq, bkv, cq, ckv = best["tiling"]
    dense = (
        SMALL.split("mask:")[0].replace("name: small_cost", "name: small_dense")
        + "mask: {prefix: {tokens: 2240}}\n"
        + f"tiling: {{block_q: {bq}, block_kv: {bkv}, compute_q: {cq}, compute_kv: {ckv}}}\n"
    )
    (tmp_path / "dense.yaml").write_text(dense)
    alone = json.loads(svgen(tmp_path, "cost", "dense.yaml", "--json").stdout)
    assert alone["cycles"] == best["cycles"]
    # Every figure is labelled as the model's, in JSON and in words.
    assert "not a measurement" in report["estimate"] and "svgen bench" in report["estimate"]
    text = svgen(tmp_path, "cost", "small.yaml").stdout.splitlines()
    assert text[1].startswith("  every figure below is an estimate from libtpu's static schedule")
    assert any("at this spec's tiling, 256 x 512" in line for line in text), text


def test_cost_backward_on_a_small_spec(tmp_path):
    """`svgen cost --backward`: the kernels of a jax.grad call, each modelled over its own
    tables; the dq read-modify-write traffic of the fused walk is charged; totals add up."""
    (tmp_path / "small.yaml").write_text(SMALL)
    training = cost_json(tmp_path, "small.yaml", "--backward")["training"]
    cycles = training["cycles"]
    assert set(cycles) == {"forward", "dkv", "dq_hbm"}  # dq fused into the dk/dv walk
    assert all(value > 0 for value in cycles.values())
    assert training["total_cycles"] == sum(cycles.values())
    assert training["backward_cycles"] == cycles["dkv"] + cycles["dq_hbm"]
    paths = training["paths"]
    assert paths["dq"] is None
    # The fused body does 5 matmuls to the forward's 2: it costs more than the forward's.
    assert paths["dkv"]["full"] > paths["forward"]["full"] > paths["forward"]["bookkeeping"]
    assert training["dense_total_cycles"] > training["total_cycles"]


def test_model_walks_each_heads_tables():
    """Steps and cycles come from the tables the kernel walks: FULL tiles at the FULL cost,
    BOUNDARY tiles at their overhead plus each compute block's kind's cost."""
    paths = PathCosts(
        bookkeeping=10,
        full=100,
        mixed=(20,),
        block=(((30, 50, 60), (31, 51, 61)),),
        init=(5,),
        finalize=7,
        pipeline=3,
    )
    f, b = TileKind.FULL, TileKind.BOUNDARY
    word = int(b) | (int(f) << 2)  # block 0 BOUNDARY, block 1 FULL
    runs = np.array([[0, 0, 2, f, 0], [0, 2, 1, b, word], [1, 0, 1, b, int(b)]])
    tables = PieceTables.from_runs([runs], 1, compute_blocks=2)
    cycles, steps, by_path = model_cycles(paths, tables, [0, 0, 0])
    assert steps == {"full": 6, "mixed": 6, "empty": 0, "skipped": 0}
    assert by_path["full"] == 6 * 100
    assert by_path["mixed"] == 3 * ((20 + 50 + 31) + (20 + 50))
    assert by_path["init_finalize"] == 3 * 2 * (5 + 7)
    assert cycles == sum(by_path.values())
    # With kv tile 2 holding padding keys, its BOUNDARY blocks cost their padded variant.
    _, _, padded = model_cycles(paths, tables, [0, 0, 0], padding_tile=2)
    assert padded["mixed"] == 3 * ((20 + 60 + 31) + (20 + 50))


@pytest.mark.parametrize("padding_tile, padded_steps", [(2, 0), (1, 1), (0, 1), (3, 1)])
def test_padding_tile_counts_only_the_steps_that_visit_it(padding_tile, padded_steps):
    """A piece of two BOUNDARY tiles (kv 0-1): a padding tile right after it (2) is not one of
    its steps, one inside it is; the next piece (kv 3) holds it alone."""
    paths = PathCosts(
        bookkeeping=10,
        full=100,
        mixed=(20,),
        block=(((30, 50, 60),),),
        init=(5,),
        finalize=7,
        pipeline=3,
    )
    b = TileKind.BOUNDARY
    runs = np.array([[0, 0, 2, b, 0], [0, 3, 1, b, 0]])
    tables = PieceTables.from_runs([runs], 1, compute_blocks=1)
    _, steps, by_path = model_cycles(paths, tables, [0], padding_tile=padding_tile)
    assert steps["mixed"] == 3
    assert by_path["mixed"] == 3 * (20 + 50) + padded_steps * (60 - 50)


def test_cost_of_every_chunk_position(tmp_path):
    """runtime.kv_cache: the chunked call's paths and, per chunk position, its steps (those
    `inspect` counts: the chunk's own tiles) and cycles, which add up as the full call's."""
    text = (
        SMALL.replace("name: small_cost", "name: small_chunks").replace("frames: 7,", "frames: 8,")
        + "runtime: {kv_cache: {chunk_frames: 2}}\n"
    )
    (tmp_path / "chunks.yaml").write_text(text)
    chunks = cost_json(tmp_path, "chunks.yaml")["chunks"]
    inspected = json.loads(svgen(tmp_path, "inspect", "chunks.yaml", "--json").stdout)["kv_cache"]
    assert chunks["chunk_frames"] == inspected["chunk_frames"] == 2
    positions = chunks["positions"]
    assert [p["first_frame"] for p in positions] == [0, 2, 4, 6]
    paths = chunks["paths"]
    for position, steps in zip(positions, inspected["chunk_steps"]):
        walked = position["steps"]
        # Every step of a one-pattern chunk walks a piece of its own: none is skipped.
        assert walked["skipped"] == 0
        assert walked["full"] + walked["mixed"] + walked["empty"] == 2 * steps  # 2 heads
        assert position["cycles"] > walked["full"] * paths["full"]
    assert chunks["total_cycles"] == sum(p["cycles"] for p in positions)
    # The first chunk sees the fewest keys (block-causal): it is the cheapest.
    assert positions[0]["cycles"] == min(p["cycles"] for p in positions)
    text_report = svgen(tmp_path, "cost", "chunks.yaml").stdout
    assert "KV-cache chunks of 2 frame(s)" in text_report and "frames 6-7:" in text_report


def test_cost_of_a_select_spec_bounds_the_call(tmp_path):
    """select: the selection kernel's paths, its PADDED block read from the schedule (the
    last key block holds padding: 2,240 = 8.75 x 256), and the call's two bounds: nothing
    selected (the mask's blocks) and every candidate block selected."""
    text = SMALL.replace("name: small_cost", "name: small_select") + (
        "select:\n  candidate: {spatial_window: {frames: 2}}\n  top_k: {k: 2, max: 4}\n"
    )
    (tmp_path / "select.yaml").write_text(text)
    report = cost_json(tmp_path, "select.yaml")
    paths, bounds = report["paths"], report["select"]
    # 2 x 2 blocks per tile; keys 2,048 .. 2,239 of the last tile are its first block
    # column: only blocks 0 and 2 can be PADDED. A PADDED block is a FULL one plus the
    # padding keys' test, dearer on the kv tile that holds them.
    padded = paths["padded_block"]
    assert len(padded) == 4 and padded[1] == padded[3] == [0, 0]
    full_block = paths["block"][0][0][0]
    assert all(padding >= plain > full_block for plain, padding in (padded[0], padded[2]))
    assert bounds["none"]["cycles"] == report["cycles"]  # the static tables: the mask alone
    assert bounds["all"]["cycles"] > bounds["none"]["cycles"]
    work = {b: bounds[b]["steps"]["full"] + bounds[b]["steps"]["mixed"] for b in ("none", "all")}
    assert work["all"] > work["none"]
    assert report["dense_cycles"] > bounds["all"]["cycles"]
    # At the spec's own k = 2 on blocks drawn from random activations: between the bounds.
    sampled = bounds["sampled"]
    assert bounds["none"]["cycles"] < sampled["cycles"] < bounds["all"]["cycles"]
    work["sampled"] = sampled["steps"]["full"] + sampled["steps"]["mixed"]
    assert work["none"] <= work["sampled"] <= work["all"]
    # The selection program before the kernel (pooling, scores, top-k, tables), counted in
    # libtpu's bundles, pooling charged at least the HBM time of reading q and k once.
    policy = bounds["policy"]
    assert policy["programs"] > 1 and policy["uncounted"] == 0
    assert 0 < policy["pooling"] <= policy["bundles"]
    assert policy["cycles"] == policy["bundles"] - policy["pooling"] + max(
        policy["pooling"], policy["pooling_floor"]
    )
    assert 0 < policy["pooling_floor"] and policy["cycles"] < bounds["none"]["cycles"]
    text = svgen(tmp_path, "cost", "select.yaml").stdout
    assert (
        f"selection per call (pooling, block scores, top_k, tables; XLA programs before the kernel): {policy['cycles']:,} cycles"
        in text
    )
    assert "at the spec's own top_k = 2, on the blocks it selects from normal random q" in text
    assert f"{sampled['cycles']:,} cycles" in text


def test_a_one_block_selection_reads_no_negative_path(tmp_path):
    """A selection over tiles of one compute block has a padded phase of its own: the step's
    bookkeeping is read with it skipped too, so no path's extra bundles come out negative
    (they did: the padded tile's work was taken into every skipped step)."""
    text = SMALL.replace("name: small_cost", "name: small_select_one").replace(
        "tiling: {block_q: 256, block_kv: 512, compute_q: 128, compute_kv: 256}",
        "tiling: {block_q: 256, block_kv: 256}",
    ) + ("select:\n  candidate: {spatial_window: {frames: 2}}\n  top_k: {k: 2, max: 4}\n")
    (tmp_path / "select.yaml").write_text(text)
    paths = cost_json(tmp_path, "select.yaml")["paths"]
    assert len(paths["padded_block"]) == 1  # the one block of a tile: a phase of its own
    assert paths["bookkeeping"] > 0 and paths["full"] > paths["bookkeeping"]
    assert paths["finalize"] > 0 and all(m >= paths["bookkeeping"] for m in paths["mixed"])
    blocks = [x for pattern in paths["block"] for block in pattern for x in block]
    assert blocks and min(blocks) >= 0
    assert min(paths["padded_block"][0]) > 0


def test_sampled_selection_takes_k_selectable_blocks_a_row(compile_text):
    """The blocks `svgen cost` models a select spec's own amount on: k per compute block row
    (fewer where fewer can be chosen), only selectable ones, the same for the same seed."""
    text = SMALL.replace("name: small_cost", "name: small_sampled") + (
        "select:\n  candidate: {spatial_window: {frames: 2}}\n  top_k: {k: 3}\n"
    )
    plan, module = compile_text(text)
    chooser = module.attention.select
    picked = cost.sampled_selection(plan, chooser)
    heads = plan.spec.attention.heads
    assert picked.shape == (heads,) + chooser.selectable.shape
    assert not (picked & ~chooser.selectable).any()
    per_row = np.minimum(3, chooser.selectable.sum(axis=1))
    np.testing.assert_array_equal(
        picked.sum(axis=2), np.broadcast_to(per_row, (heads, len(per_row)))
    )
    np.testing.assert_array_equal(picked, cost.sampled_selection(plan, chooser))
    assert not np.array_equal(picked, cost.sampled_selection(plan, chooser, seed=1))


@pytest.mark.parametrize("runtime", ["", "runtime: {segments: true}\n"])
def test_cost_of_a_bounded_softmax_kernel(tmp_path, runtime):
    """attention.softmax: bounded: every FULL / BOUNDARY phase has an online twin; the paths
    are the bounded ones, `fallback` the online ones, and the bounded FULL tile is the
    cheaper (no running max, no rescale). With run-time tables the twins carry their
    SEGMENT_BOUNDARY branches too."""
    spec = SMALL.replace("dtype: bfloat16}", "dtype: bfloat16, softmax: bounded}") + runtime
    (tmp_path / "small.yaml").write_text(spec)
    report = cost_json(tmp_path, "small.yaml")
    bounded, online = report["paths"], report["paths"]["fallback"]
    assert "fallback" not in online
    assert bounded["bookkeeping"] < bounded["full"] < online["full"]
    for b, o in zip(bounded["block"][0], online["block"][0]):
        assert 0 < b[0] < o[0] and 0 < b[1] < o[1]  # FULL and BOUNDARY blocks both cheaper
    if runtime:
        assert len(bounded["segment_block"][0]) == len(online["segment_block"][0]) == 4
    fallback = report["fallback"]
    assert report["cycles"] < fallback["cycles"] and fallback["dense_cycles"] > 0
    PathCosts.from_json(report["paths"])  # the nested twin reads back
    # The pass over k before the kernel: 2 heads x 2,240 keys x 128 x 2 B read once at
    # v6e's 1.64 TB/s, 1.75 GHz; not in the kernel's cycles.
    assert report["key_pass_cycles"] == int(2 * 2240 * 128 * 2 / 1640e9 * 1.75e9) == 1223
    text = svgen(tmp_path, "cost", "small.yaml").stdout  # the schedule from the cache
    assert "softmax: bounded" in text and "every q tile online" in text
    with_pass = (report["cycles"] + 1223) / 1.75e6
    assert "reads k's 1.1 MB once at 1.64 TB/s): 1,223 cycles = 1 us" in text
    assert f"the call with it: {report['cycles'] + 1223:,} cycles = {with_pass:.2f} ms" in text
