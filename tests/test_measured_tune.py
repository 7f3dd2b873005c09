"""svgen tune --measure on a CPU, with a fake chip (chip_bench.bench_spec monkeypatched): the
cache key follows the kernels' source, a failure is retried once by a later run and then kept
with both reasons, each candidate keeps its spread, and the winner's margin over the
runner-up is weighed against it (a tie within noise says so, in the table, the JSON and
--apply)."""

from __future__ import annotations

import json

import pytest

from spec_corpus import SPATIAL, spec_text
from svgen.chip import chip_bench, measured_tune
from svgen.estimate import measure
from svgen.spec import parse_spec

TINY = spec_text("tiny", (4, 8, 12, 40), 3, dtype="bfloat16", layout="frame_major", mask=SPATIAL)
# Besides the spec's own 128 x 128 tiling: the candidates each test times.
TILINGS = ((256, 256, 256, 256), (512, 512, 512, 512))


class FakeChip:
    """bench_spec's stand-in: per (block_q, block_kv), a (median ms, fastest ms) timing of 5
    runs, or a list of failure reasons given one per call; 20 ms for a tile named in neither,
    or once its failures have run out."""

    def __init__(self, timings=None, failures=None):
        self.timings = timings or {}
        self.failures = {tile: list(reasons) for tile, reasons in (failures or {}).items()}
        self.calls = []

    def __call__(self, spec, target, options, clock=None):
        tile = (spec.tiling.block_q, spec.tiling.block_kv)
        self.calls.append(tile)
        if self.failures.get(tile):
            return {"svgen_forward": {"error": self.failures[tile].pop(0)}}
        median, fastest = self.timings.get(tile, (20.0, 19.0))
        return {"svgen_forward": {"median_ms": median, "min_ms": fastest, "runs": 5, "ok": True}}


@pytest.fixture
def spec(monkeypatch, tmp_path):
    monkeypatch.setenv("SVGEN_CACHE_DIR", str(tmp_path / "cache"))
    return parse_spec(TINY, source="tiny.yaml")


def _tune(spec, **kw):
    return measured_tune.tune(spec, "v5e", backward=False, env={}, tilings=TILINGS, **kw)


def _by_tile(trials):
    return {t.tiling[:2]: t for t in trials}


def test_measured_tune_records_infeasible_candidates_and_keeps_its_budget(monkeypatch, spec):
    chip = FakeChip(
        timings={(128, 128): (5.0, 4.9), (256, 256): (3.0, 2.9)},
        failures={(512, 512): ["CompileTimeScopedVmemOom"] * 2},
    )
    monkeypatch.setattr(chip_bench, "bench_spec", chip)
    trials = _tune(spec)
    assert [t.tiling[:2] for t in trials] == [(256, 256), (128, 128), (512, 512)]
    assert trials[-1].ms is None and "VmemOom" in trials[-1].error
    again = _tune(spec)
    assert [t.cached for t in again] == [True, True, False]  # only the failure is timed again
    spent = _tune(spec, budget_s=-1)
    assert all(t.cached for t in spent)  # cached per chip, versions, digests, tiling
    untimed = measured_tune.tune(spec, "v5e", backward=True, env={}, tilings=TILINGS, budget_s=-1)
    assert all(t.ms is None and "budget" in t.error for t in untimed)


def test_the_cache_key_follows_the_kernels_source(monkeypatch, spec):
    chip = FakeChip()
    monkeypatch.setattr(chip_bench, "bench_spec", chip)
    monkeypatch.setattr(measure, "kernel_source_digest", lambda: "kernels as they were")
    _tune(spec)
    assert len(chip.calls) == 3
    assert all(t.cached for t in _tune(spec)) and len(chip.calls) == 3
    monkeypatch.setattr(measure, "kernel_source_digest", lambda: "a kernel edited")
    assert not any(t.cached for t in _tune(spec))  # no timing of the old kernels survives
    assert len(chip.calls) == 6


def test_a_failure_is_retried_once_by_a_later_run_then_kept_with_both_reasons(monkeypatch, spec):
    chip = FakeChip(failures={(512, 512): ["the host was busy", "CompileTimeScopedVmemOom"]})
    monkeypatch.setattr(chip_bench, "bench_spec", chip)
    first = _by_tile(_tune(spec))[(512, 512)]
    assert first.failures == ("forward: the host was busy",)
    assert "retried on the next run" in first.note()
    second = _by_tile(_tune(spec))[(512, 512)]
    assert not second.cached and chip.calls.count((512, 512)) == 2
    assert second.failures == ("forward: the host was busy", "forward: CompileTimeScopedVmemOom")
    third = _by_tile(_tune(spec))[(512, 512)]
    assert third.cached and chip.calls.count((512, 512)) == 2  # out of attempts: not timed
    assert "the host was busy" in third.note() and "VmemOom" in third.note()
    table = "\n".join(measured_tune.format_table(_tune(spec), "v5e", False))
    assert "forward: the host was busy; retried: forward: CompileTimeScopedVmemOom" in table


def test_a_retry_that_runs_is_a_timing_that_remembers_the_failure(monkeypatch, spec):
    chip = FakeChip(failures={(512, 512): ["the host was busy"]})
    monkeypatch.setattr(chip_bench, "bench_spec", chip)
    _tune(spec)
    retried = _by_tile(_tune(spec))[(512, 512)]
    assert retried.ms == 20.0 and retried.note() == "failed once before: forward: the host was busy"
    assert _by_tile(_tune(spec))[(512, 512)].cached


def test_spread_and_margin_come_from_the_timings(monkeypatch, spec):
    chip = FakeChip(timings={(256, 256): (10.0, 9.9), (128, 128): (10.08, 10.0)})
    monkeypatch.setattr(chip_bench, "bench_spec", chip)
    trials = _tune(spec)
    best = trials[0]
    assert best.tiling[:2] == (256, 256) and best.min_ms == 9.9 and best.runs == 5
    assert best.spread == pytest.approx(0.01)
    assert trials[1].spread == pytest.approx(0.08 / 10.08)
    verdict = measured_tune.verdict(trials)
    assert verdict.runner_up.tiling[:2] == (128, 128)
    assert verdict.margin == pytest.approx(0.08 / 10.08)
    assert verdict.noise == pytest.approx(0.01 + 0.08 / 10.08)


def test_one_run_has_no_spread_and_its_margin_is_not_weighed():
    one_run = [
        measured_tune.Trial((128, 128, 128, 128), 10.0, {}, min_ms=10.0, runs=1),
        measured_tune.Trial((256, 256, 256, 256), 11.0, {}, min_ms=11.0, runs=1),
    ]
    verdict = measured_tune.verdict(one_run)
    assert verdict.noise is None and verdict.tie is None
    assert "not weighed" in verdict.sentence()


@pytest.mark.parametrize(
    "runner_up, tie",
    [((10.08, 10.0), True), ((12.0, 11.9), False)],
    ids=["close pair", "clear winner"],
)
def test_a_margin_inside_the_noise_is_called_a_tie(monkeypatch, spec, runner_up, tie):
    chip = FakeChip(timings={(256, 256): (10.0, 9.9), (128, 128): runner_up})
    monkeypatch.setattr(chip_bench, "bench_spec", chip)
    table = measured_tune.format_table(_tune(spec), "v5e", False)
    assert table[0].startswith("| tiling | forward ms on v5e (median) | fastest run ms | spread |")
    assert "| 256x256 | 10.00 | 9.90 | 1.00 % |" in table[2]
    if tie:
        assert table[-1] == (
            "#1 (256x256) beats #2 (128x128) by 0.79 %, inside the 1.79 % spread of the two: "
            "a tie within noise"
        )
    else:
        assert "tie" not in table[-1] and "outside the 1.83 % spread" in table[-1]


def _cli(monkeypatch, tmp_path, timings, *extra):
    from svgen.cli import main

    monkeypatch.setattr(chip_bench, "bench_spec", FakeChip(timings=timings))
    monkeypatch.setattr(chip_bench, "versions", lambda: {})
    # The tuner's own candidates with the spec's 128 x 128: 20 ms where `timings` names none.
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path, main(["tune", "--measure", "--interpret", *extra, str(path)])


def test_the_json_carries_each_spread_and_the_verdict(monkeypatch, spec, tmp_path, capsys):
    timings = {(128, 128): (10.0, 9.9), (512, 512): (10.08, 10.0)}
    _, code = _cli(monkeypatch, tmp_path, timings, "--json")
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    first = out["trials"][0]
    assert first["min_ms"] == 9.9 and first["spread"] == pytest.approx(0.01)
    assert first["attempts"] == 1 and first["failures"] == []
    assert out["verdict"]["winner"] == "128x128" and out["verdict"]["tie_within_noise"] is True
    assert out["verdict"]["says"].endswith("a tie within noise")


def test_apply_writes_the_fastest_of_a_tie_and_says_so(monkeypatch, spec, tmp_path, capsys):
    timings = {(512, 512): (10.0, 9.9), (128, 128): (10.08, 10.0)}
    path, code = _cli(monkeypatch, tmp_path, timings, "--apply")
    assert code == 0
    assert "applying the fastest, though #1 (512x512)" in capsys.readouterr().err
    assert "v5e: {block_q: 512, block_kv: 512}" in path.read_text()


def test_apply_of_a_clear_winner_mentions_no_tie(monkeypatch, spec, tmp_path, capsys):
    timings = {(512, 512): (10.0, 9.9), (128, 128): (12.0, 11.9)}
    path, code = _cli(monkeypatch, tmp_path, timings, "--apply")
    assert code == 0
    assert "tie" not in capsys.readouterr().err
    assert "v5e: {block_q: 512, block_kv: 512}" in path.read_text()
