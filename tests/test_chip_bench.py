"""svgen bench and svgen tune --measure on a CPU: the Splash mask svgen builds from a spec
against brute force, the timing logic with an injected clock, the bench of a small spec in
Pallas's interpreter (outputs checked against the float32 reference), and the refusal without
a TPU (the tuner's own tests: tests/test_measured_tune.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import brute_force_align, dense_keep
from spec_corpus import spec_text
from svgen.chip import bench_table, chip_bench, splash_mask
from svgen.spec import parse_spec

MIXED = """
svgen: 1
name: tiny_mixed
geometry: {frames: 4, height: 8, width: 12, text_tokens: 40}
attention: {heads: 3, head_dim: 128, dtype: bfloat16}
layout: frame_major
patterns:
  spatial:
    any_of:
      - first_frame: {frames: 1}
      - spatial_window: {frames: 1}
  temporal:
    any_of:
      - first_frame: {frames: 1}
      - temporal_stride: {rows: 0, cols: 0}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: runtime
tiling: {block_q: 128, block_kv: 128}
"""


def interpreter_options(**changes) -> chip_bench.Options:
    """One untimed-warm-up call in Pallas's interpreter, Splash at 128-token blocks."""
    base = dict(warmup=0, iters=1, interpret=True, splash_blocks=(128, 128, 128))
    return chip_bench.Options(**{**base, **changes})


def test_splash_mask_is_the_spec_mask_in_kernel_order(compile_text):
    plan, module = compile_text(MIXED)
    seq = int(module.SEQ_LEN)
    padded = splash_mask.padded_length(seq, 128, 256)
    assert padded % 256 == 0 and padded >= seq
    assignment = splash_mask.head_patterns(module)
    assert assignment == (0, 1, 0)  # patterns chosen at run time: every pattern timed
    mask = splash_mask.splash_mask(module, padded, assignment)
    assert mask.shape == (3, padded, padded)
    assert mask.masks[0] is mask.masks[2]  # one object per pattern: Splash deduplicates
    for head, p in enumerate(assignment):
        want = np.zeros((padded, padded), bool)
        want[:seq, :seq] = dense_keep(plan.patterns[p].mask, plan.patterns[p].layout)
        got = mask[head, :, :]
        np.testing.assert_array_equal(got, want)
        # Splash asks for blocks by slices, unaligned to bytes too
        np.testing.assert_array_equal(
            mask.masks[p][(slice(128, 256), slice(13, 200))], want[128:256, 13:200]
        )
    assert not mask[0, seq:, :].any() and not mask[0, :, seq:].any()


ALIGNED_BAND = """
svgen: 1
name: tiny_aligned
geometry: {frames: 6, height: 8, width: 10}
attention: {heads: 2, head_dim: 128, dtype: float32}
layout: temporal_major
mask:
  any_of:
    - band: {width: 90}
    - prefix: {tokens: 50}
tiling: {block_q: 128, block_kv: 128, align: balanced}
"""


def test_an_aligned_spec_is_benched_against_the_mask_its_kernel_runs(compile_text):
    """tiling.align rounds the mask to compute blocks: Splash and the float32 reference get the
    rounded mask (brute force from the exact one), not the exact mask, nor the "every pair of
    a visited block" that the module's boundary_mask says."""
    plan, module = compile_text(ALIGNED_BAND)
    (pattern,) = plan.patterns
    seq = int(module.SEQ_LEN)
    exact = dense_keep(pattern.mask, pattern.layout)
    _, aligned = brute_force_align(exact, 128, 128, "balanced")
    assert (aligned != exact).any()  # the rounding changes the mask here
    padded = splash_mask.padded_length(seq, 128, 128)
    mask = splash_mask.splash_mask(module, padded, (0, 0), plan)
    np.testing.assert_array_equal(mask[0, :seq, :seq], aligned)
    assert not mask[0, seq:, :].any() and not mask[0, :, seq:].any()
    rows = np.array([0, 7, 130, seq - 1])
    np.testing.assert_array_equal(chip_bench._reference_keep(pattern, rows, seq), aligned[rows])
    options = interpreter_options(check_rows=32, dense_blocks=((128, 128, 128),))
    result = chip_bench.bench_spec(parse_spec(ALIGNED_BAND, source="a.yaml"), "v5e", options)
    for key in ("svgen_forward", "splash_mask_forward"):
        assert result[key]["ok"] is True, result[key]


def test_padding_past_twice_the_sequence_is_refused():
    assert splash_mask.padded_length(424, 128, 128, 128) == 512
    assert splash_mask.padded_length(424, 2048, 1024, 1024) == 2048  # one block: allowed
    with pytest.raises(ValueError, match="pad 424 tokens to 12,799,872"):
        splash_mask.padded_length(424, 99999, 128, 128)


def test_time_calls_reports_first_call_and_median_from_the_clock():
    ticks = itertools.count()
    clock = lambda: float(next(ticks)) ** 2  # noqa: E731  - each interval longer than the last
    calls = []
    timing, out = chip_bench.time_calls(
        lambda x: calls.append(x) or np.asarray(x), (7,), warmup=2, iters=3, clock=clock
    )
    assert len(calls) == 1 + 2 + 3 and int(out) == 7
    # first call: 0 -> 1 (1 s); timed calls: clock 2->3, 4->5, 6->7 (5, 9, 13 s)
    assert timing.first_s == 1 and timing.median_s == 9 and timing.min_s == 5


def test_bench_spec_in_the_interpreter_checks_outputs_and_computes_speedups():
    spec = parse_spec(MIXED, source="tiny.yaml")
    ticks = itertools.count()
    options = interpreter_options(check_rows=48, dense_blocks=((128, 128, 128), (99999, 128, 128)))
    seen = []  # the figures recorded so far, at each on_entry call
    result = chip_bench.bench_spec(
        spec,
        "v5e",
        options,
        clock=lambda: float(next(ticks)),
        on_entry=lambda r: seen.append([k for k in r if k.startswith(("svgen_", "splash_"))]),
    )
    assert seen == [
        ["svgen_forward"],
        ["svgen_forward", "splash_dense_forward"],
        ["svgen_forward", "splash_dense_forward", "splash_mask_forward"],
    ]
    assert result["head_patterns"] == ["spatial", "temporal", "spatial"]
    for key in ("svgen_forward", "splash_mask_forward"):
        assert result[key]["ok"] is True, result[key]
        assert result[key]["max_error"] < 2e-2
    dense = result["splash_dense_forward"]
    assert dense["blocks"] == [128, 128, 128]
    # a block size that cannot be built is recorded as infeasible, not as slow, and one that
    # would pad the sequence to millions of tokens is refused before Splash scans its mask
    (infeasible,) = [t for t in dense["tried"] if "error" in t]
    assert infeasible["blocks"] == [99999, 128, 128] and "would pad" in infeasible["error"]
    assert result["speedup_vs_splash_mask_forward"] == pytest.approx(
        result["splash_mask_forward"]["median_ms"] / result["svgen_forward"]["median_ms"], rel=1e-3
    )
    table = bench_table.format_table([result], "cpu")
    assert table[2].startswith("| tiny_mixed | 128x128 | forward |")


def test_a_wrong_output_is_caught(monkeypatch):
    """The check can fail: a kernel whose rows are off the reference is flagged."""
    spec = parse_spec(MIXED, source="tiny.yaml")
    real = chip_bench.svgen_forward

    def broken(module, assignment, interpret):
        fn = real(module, assignment, interpret)
        return lambda q, k, v: fn(q, k, v) + 0.5

    monkeypatch.setattr(chip_bench, "svgen_forward", broken)
    options = chip_bench.Options(warmup=0, iters=1, interpret=True, check_rows=16, splash=False)
    result = chip_bench.bench_spec(spec, "v5e", options)
    assert result["svgen_forward"]["ok"] is False


def test_bench_without_a_tpu_is_one_line_and_exit_2(capsys):
    from svgen.cli import main

    assert main(["bench", "specs/wan21_720p_band.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attached TPU" in err[0]
    assert main(["tune", "--measure", "specs/wan21_720p_band.yaml"]) == 2


@pytest.mark.parametrize(
    "platforms, command",
    [("tpu", "bench"), ("tpu", "tune --measure"), ("cuda", "bench")],
)
def test_jax_platforms_naming_a_missing_platform_is_one_line_and_exit_2(platforms, command):
    """JAX_PLATFORMS=tpu on a machine without one (and `cuda`, whose plugin is not here) leaves
    JAX no backend, which it says with an error of its own: still svgen's one line, exit 2.
    In a child process: JAX starts its backends once a process."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    child = subprocess.run(
        [sys.executable, "-m", "svgen.cli", *command.split(), "examples/first_kernel.yaml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "JAX_PLATFORMS": platforms},
    )
    err = child.stderr.strip().splitlines()
    assert child.returncode == 2, child.stderr
    assert len(err) == 1 and err[0].startswith(f"svgen: error: svgen {command} times kernels")
    assert f"JAX_PLATFORMS={platforms!r}" in err[0]


def test_tiling_option_is_checked():
    from svgen.chip.measured_tune import parse_tiling
    import argparse

    assert parse_tiling("1024x1024") == (1024, 1024, 1024, 1024)
    assert parse_tiling("512x1024/512x512") == (512, 1024, 512, 512)
    with pytest.raises(argparse.ArgumentTypeError, match="BQxBKV"):
        parse_tiling("1024")


def test_remembered_dense_blocks_that_now_fail_are_searched_again(tmp_path):
    """Blocks cached by an earlier process (another libtpu, another backward kernel) that
    no longer compile must not leave dense Splash reported as unable to run."""
    dense = chip_bench.SplashDense(tmp_path)
    dense._store("key", (2048, 1024, 1024))
    timings = {(1024, 1024, 512): 0.2, (512, 512, 512): 0.3}

    def time_blocks(blocks):
        if blocks not in timings:
            raise RuntimeError("RESOURCE_EXHAUSTED: CompileTimeScopedVmemOom")
        return chip_bench.Timing(1.0, timings[blocks], timings[blocks], 1)

    candidates = ((2048, 1024, 1024), (1024, 1024, 512), (512, 512, 512))
    best = chip_bench.SplashDense(tmp_path).best("key", candidates, time_blocks, lambda line: None)
    assert best["blocks"] == (1024, 1024, 512)
    assert [t["blocks"] for t in best["tried"]] == [list(b) for b in candidates]
    assert "error" in best["tried"][0]
    # and the new winner is what the next process starts from
    assert chip_bench.SplashDense(tmp_path)._load()["key"] == [1024, 1024, 512]


def test_dense_blocks_given_are_timed_as_given_not_the_remembered_ones(tmp_path):
    """svgen bench --dense-blocks: one candidate is timed as given, whatever an earlier search
    remembered, and it is not remembered as the best."""
    chip_bench.SplashDense(tmp_path)._store("key", (2048, 1024, 1024))
    timed = []

    def time_blocks(blocks):
        timed.append(blocks)
        return chip_bench.Timing(1.0, 0.2, 0.2, 1)

    best = chip_bench.SplashDense(tmp_path).best(
        "key", ((1024, 1024, 512),), time_blocks, lambda line: None
    )
    assert timed == [(1024, 1024, 512)] and best["blocks"] == (1024, 1024, 512)
    assert chip_bench.SplashDense(tmp_path)._load()["key"] == [2048, 1024, 1024]


def test_dense_blocks_found_by_one_caller_are_reused_by_another(tmp_path):
    """svgen.chip.kernel_ab passes no env, `svgen bench` passes versions(): both must key the
    remembered blocks alike, or every process of a chip session searches dense Splash again."""
    spec = parse_spec(MIXED, source="tiny.yaml")
    options = interpreter_options(check_rows=0, dense_blocks=((128, 128, 128), (256, 256, 256)))
    first = chip_bench.bench_spec(spec, "v5e", options, dense=chip_bench.SplashDense(tmp_path))
    assert len(first["splash_dense_forward"]["tried"]) == 2  # searched
    later = chip_bench.bench_spec(
        spec, "v5e", options, dense=chip_bench.SplashDense(tmp_path), env=chip_bench.versions()
    )
    (retimed,) = later["splash_dense_forward"]["tried"]
    assert retimed["blocks"] == first["splash_dense_forward"]["blocks"]


def test_bench_dense_blocks_option_times_dense_splash_at_those_blocks_only(tmp_path):
    import json

    from svgen.cli import main

    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(MIXED)
    out = tmp_path / "bench.json"
    args = ["bench", str(spec_file), "--interpret", "--iters", "1", "--warmup", "0"]
    args += ["--check-rows", "0", "--splash-blocks", "128", "128", "128"]
    assert main(args + ["--dense-blocks", "256", "256", "128", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["options"]["dense_blocks"] == [[256, 256, 128]]
    (result,) = report["results"]
    assert [t["blocks"] for t in result["splash_dense_forward"]["tried"]] == [[256, 256, 128]]


def test_bench_json_keeps_what_was_measured_when_a_later_spec_fails(tmp_path, monkeypatch):
    """`--json` is rewritten after each figure: a run stopped part way (a time limit on the
    chip, a spec that breaks) keeps the specs already timed and the figures of the one it
    stopped in, marked incomplete."""
    import json

    from svgen.cli import main

    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(MIXED)
    out = tmp_path / "bench.json"
    calls = []

    def fake_bench(spec, target, options, on_entry=lambda result: None, **_):
        calls.append(spec.name)
        if len(calls) == 2:
            on_entry({"spec": spec.name, "svgen_forward": {"median_ms": 2.0, "ok": True}})
            raise RuntimeError("the chip went away")
        return {"spec": spec.name, "svgen_forward": {"median_ms": 1.0, "ok": True}}

    monkeypatch.setattr(chip_bench, "bench_spec", fake_bench)
    monkeypatch.setattr(chip_bench, "commit", lambda: "abc1234")
    args = ["bench", str(spec_file), str(spec_file), "--interpret", "--json", str(out)]
    with pytest.raises(RuntimeError, match="went away"):
        main(args)
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["commit"] == "abc1234"
    first, stopped = report["results"]
    assert first["svgen_forward"]["median_ms"] == 1.0
    assert stopped["svgen_forward"]["median_ms"] == 2.0 and "splash_mask_forward" not in stopped


def test_source_digest_names_the_code_and_changes_with_it(tmp_path):
    assert len(chip_bench.source_digest()) == 16
    (tmp_path / "svgen" / "runtime").mkdir(parents=True)
    (tmp_path / "templates").mkdir()
    kernel = tmp_path / "svgen" / "runtime" / "softmax.py"
    kernel.write_text("x = 1\n")
    (tmp_path / "templates" / "module.py.j2").write_text("{{ x }}\n")
    before = chip_bench.source_digest(tmp_path)
    assert chip_bench.source_digest(tmp_path) == before
    (tmp_path / "notes.txt").write_text("not source\n")  # outside svgen/ and templates/
    assert chip_bench.source_digest(tmp_path) == before
    kernel.write_text("x = 2\n")
    after_kernel = chip_bench.source_digest(tmp_path)
    assert after_kernel != before
    (tmp_path / "templates" / "module.py.j2").write_text("{{ y }}\n")
    assert chip_bench.source_digest(tmp_path) != after_kernel


def test_bench_at_several_tilings_times_splash_once_per_exact_spec(tmp_path, monkeypatch):
    """`--tiling` repeated: each spec at each tiling, in one process; Splash (given the same
    mask, and dense) is timed with the first and its figures shared by the others, with the
    speedups against them; an aligned spec's Splash is timed at each tiling (its rounded mask
    follows the tiling)."""
    import json

    from svgen.cli import main

    exact, aligned = tmp_path / "tiny.yaml", tmp_path / "aligned.yaml"
    exact.write_text(MIXED)
    aligned.write_text(ALIGNED_BAND)
    seen = []

    def fake_bench(spec, target, options, on_entry=lambda result: None, **_):
        t = spec.tiling
        seen.append((spec.name, t.block_q, options.splash))
        result = {
            "spec": spec.name,
            "tiling": {
                "block_q": t.block_q,
                "block_kv": t.block_kv,
                "compute_q": t.cq,
                "compute_kv": t.ckv,
                "align": t.align,
            },
            "svgen_forward": {"median_ms": float(t.block_q), "ok": True},
        }
        if options.splash:
            result["splash_mask_forward"] = {"median_ms": 512.0, "ok": True}
            result["splash_dense_forward"] = {"median_ms": 1024.0}
        return result

    monkeypatch.setattr(chip_bench, "bench_spec", fake_bench)
    out = tmp_path / "bench.json"
    args = ["bench", str(exact), str(aligned), "--interpret", "--json", str(out)]
    assert main(args + ["--tiling", "128x128", "--tiling", "256x256"]) == 0
    assert seen == [
        ("tiny_mixed", 128, True),
        ("tiny_mixed", 256, False),
        ("tiny_aligned", 128, True),
        ("tiny_aligned", 256, True),
    ]
    results = json.loads(out.read_text())["results"]
    second = results[1]
    assert second["tiling"]["block_q"] == 256 and second["splash_from_tiling"]["block_q"] == 128
    assert second["splash_mask_forward"]["median_ms"] == 512.0
    assert second["speedup_vs_splash_mask_forward"] == 2.0  # 512 / 256
    assert second["speedup_vs_splash_dense_forward"] == 4.0
    assert "splash_from_tiling" not in results[3]


def test_program_option_is_checked():
    from svgen.cli.bench import parse_program
    from svgen.core.program import ProgramLimits
    import argparse

    assert parse_program("none") == ProgramLimits()
    assert parse_program("pattern_calls") == ProgramLimits(pattern_calls=True)
    assert parse_program("pattern_calls+straight_words=0+whole_masks") == ProgramLimits(
        straight_words=0, residual_masks=False, pattern_calls=True
    )
    for bad in ("pattern_calls=1", "straight_words", "none+pattern_calls", "everything"):
        with pytest.raises(argparse.ArgumentTypeError, match="pattern_calls, straight_words"):
            parse_program(bad)


def test_bench_times_each_program_asked_for_with_its_code_left_out(tmp_path, monkeypatch):
    """`--program` repeated: the spec once per program, in one process, Splash with the first
    only; the module each time is compiled with that program's code left out (the module's
    own ProgramLimits), and the result names it."""
    from svgen.cli import main
    from svgen.core.program import ProgramLimits

    spec = tmp_path / "tiny.yaml"
    spec.write_text(MIXED)
    seen = []
    real_compile = chip_bench.compile_module

    def fake_bench(spec, target, options, on_entry=lambda result: None, **_):
        _, module = real_compile(spec, target, tmp_path / str(len(seen)), options.program)
        seen.append((module.attention.program, options.splash))
        return {"spec": spec.name, "tiling": {}, "program": options.program.source()}

    monkeypatch.setattr(chip_bench, "bench_spec", fake_bench)
    monkeypatch.setattr(bench_table, "format_table", lambda results, chip: [])
    args = ["bench", str(spec), "--interpret", "--program", "none", "--program", "pattern_calls"]
    assert main(args) == 0
    assert seen == [(ProgramLimits(), True), (ProgramLimits(pattern_calls=True), False)]


# Two patterns chosen at run time, no tiling: svgen picks one (svgen.chip.program_size).
UNTILED = spec_text(
    "tiny_untiled",
    (4, 16, 32),
    2,
    dtype="bfloat16",
    layout="frame_major",
    patterns={"spatial": "{spatial_window: {frames: 1}}", "temporal": "{temporal_stride: {}}"},
    tiling=None,
)


def test_bench_times_the_module_svgen_compile_writes(tmp_path, monkeypatch):
    """With neither --tiling nor --program, `svgen bench` times what `svgen compile --target`
    writes: for a spec with no tiling, the tiling svgen picks and the code it leaves out to
    fit the program budget (here, with a fake count: one kernel per pattern at 1024 x 2048),
    not the spec's default 512 x 512 tiles with everything in."""
    import re

    from svgen.cli import main
    from svgen.core.program import ProgramLimits
    from svgen.chip import program_size

    spec_file = tmp_path / "untiled.yaml"
    spec_file.write_text(UNTILED)

    def fake_count(files, plan):  # over the budget unless one kernel per pattern
        return {"svgen_attention": 30_000 if plan.program.pattern_calls else 90_000}

    monkeypatch.setattr(program_size, "kernel_bundles", fake_count)
    seen = []

    def fake_bench(spec, target, options, on_entry=lambda result: None, **_):
        t = spec.tiling
        seen.append(((t.block_q, t.block_kv, t.cq, t.ckv), options.program))
        return {"spec": spec.name, "tiling": {}, "program": options.program.source()}

    monkeypatch.setattr(chip_bench, "bench_spec", fake_bench)
    monkeypatch.setattr(bench_table, "format_table", lambda results, chip: [])
    assert main(["bench", str(spec_file), "--interpret", "--quiet"]) == 0
    out = tmp_path / "out"
    assert main(["compile", str(spec_file), "--target", "v5e", "--out", str(out), "-q"]) == 0
    module = (out / "tiny_untiled.py").read_text()
    sizes = ("BLOCK_Q", "BLOCK_KV", "COMPUTE_Q", "COMPUTE_KV")
    tiles = tuple(int(re.search(rf"^{name} = (\d+)$", module, re.M).group(1)) for name in sizes)
    assert seen == [((1024, 2048, 512, 512), ProgramLimits(pattern_calls=True))]
    assert tiles == seen[0][0]
    assert "program=kernel.ProgramLimits(pattern_calls=True)" in module
    # Told a tiling, it times that tiling with nothing left out, as before.
    seen.clear()
    assert main(["bench", str(spec_file), "--interpret", "--quiet", "--tiling", "512x512"]) == 0
    assert seen == [((512, 512, 512, 512), ProgramLimits())]
