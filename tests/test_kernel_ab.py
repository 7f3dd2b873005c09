"""svgen.chip.kernel_ab's settings on a CPU: the svgen.runtime constants it sets for the "before"
kernel (parsed strictly, set while that module is built and traced, restored after), and one
run of the tool in Pallas's interpreter whose "before" runs fewer straight-line bodies."""

from __future__ import annotations

import argparse
import json
import types

import pytest

from svgen.chip import kernel_ab
from svgen.core import straight
from svgen.runtime import kernel

from helpers import REPO, straight_band
from kernel_helpers import POISONED, check_per_head, mixed_inputs

BAND = straight_band("ab_band")


def test_runtime_settings_are_parsed_strictly():
    assert kernel_ab.parse_runtime_setting("straight.MAX_WORDS=2") == ("straight", "MAX_WORDS", 2)
    assert kernel_ab.parse_runtime_setting("backward.FUSED_DQ=False")[2] is False
    for bad in (
        "MAX_WORDS=2",
        "straight.max_words=2",
        "straight.MAX_WORDS",
        "straight.X=os.system",
    ):
        with pytest.raises(argparse.ArgumentTypeError):
            kernel_ab.parse_runtime_setting(bad)


def test_overrides_hold_inside_the_block_only_and_refuse_unknown_names(compile_text):
    with kernel_ab.runtime_overrides([("straight", "MAX_WORDS", 0)]):
        assert straight.MAX_WORDS == 0
        _, module = compile_text(BAND)
        assert module.attention.codes[0].straight_words == ()
    assert straight.MAX_WORDS == 2
    _, module = compile_text(BAND)
    assert module.attention.codes[0].straight_words  # today's kernel has bodies
    with pytest.raises(SystemExit, match="has no constant MAX_WORD"):
        with kernel_ab.runtime_overrides([("straight", "MAX_WORD", 0)]):
            pass
    assert straight.MAX_WORDS == 2


def test_a_run_in_the_interpreter_times_before_and_after(tmp_path, capsys):
    (tmp_path / "band.yaml").write_text(BAND)
    out = tmp_path / "ab.json"
    argv = [str(tmp_path / "band.yaml"), "--runtime", "straight.MAX_WORDS=0", "--iters", "1"]
    assert kernel_ab.main(argv + ["--interpret", "--target", "v5e", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["runtime_before"] == {"straight.MAX_WORDS": 0}
    (result,) = report["specs"]
    assert result["before"]["forward"]["max_error"] < 1e-4  # checked against the reference
    assert result["svgen_forward"]["ok"] is True
    assert "| ab_band | forward |" in capsys.readouterr().out
    assert straight.MAX_WORDS == 2


def test_without_residual_masks_every_boundary_block_runs_the_whole_mask(compile_text):
    """kernel.RESIDUAL_MASKS=False (what kernel_ab times against today's kernel): no variants
    table, no residual branches, and the output still the mask's."""
    text = (REPO / "bench" / "specs" / "features" / "residual.yaml").read_text()
    _, module = compile_text(text)
    assert module.attention.tables.variants is not None and module.attention.codes[0].residual_masks
    with kernel_ab.runtime_overrides([("kernel", "RESIDUAL_MASKS", False)]):
        plan, module = compile_text(text)
    assert kernel.RESIDUAL_MASKS is True
    assert module.attention.tables.variants is None
    assert module.attention.codes[0].residual_masks == ()
    q, k, v = mixed_inputs(plan, "float32", seed=5, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, [0, 0], "float32")


def test_variants_each_time_one_more_kernel_in_the_same_process(tmp_path, capsys):
    """--variant twice: two "before" kernels against today's (compiled once), each checked
    against the reference; --no-splash times svgen alone."""
    (tmp_path / "band.yaml").write_text(BAND)
    out = tmp_path / "ab.json"
    argv = [str(tmp_path / "band.yaml"), "--variant", "straight.MAX_WORDS=0"]
    argv += ["--variant", "straight.MAX_WORDS=1,kernel.RESIDUAL_MASKS=False", "--iters", "1"]
    argv += ["--no-splash", "--interpret", "--target", "v5e", "--json", str(out)]
    assert kernel_ab.main(argv) == 0
    report = json.loads(out.read_text())
    labels = ["straight.MAX_WORDS=0", "straight.MAX_WORDS=1,kernel.RESIDUAL_MASKS=False"]
    assert report["variants"] == labels
    (result,) = report["specs"]
    assert list(result["variants"]) == labels
    for label in labels:
        assert result["variants"][label]["forward"]["max_error"] < 1e-4
    assert "splash_mask_forward" not in result
    table = capsys.readouterr().out
    assert all(f"| ab_band | forward | {label} |" in table for label in labels)
    assert straight.MAX_WORDS == 2 and kernel.RESIDUAL_MASKS is True


def test_a_variant_that_fails_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    calls = []

    def fail_first(spec, chip, settings, options, progress, runtime):
        calls.append(runtime)
        if len(calls) == 1:
            raise RuntimeError("scoped vmem exceeded\nmore detail")
        return {"forward": {"median_ms": 1.0}}

    monkeypatch.setattr(kernel_ab, "time_before", fail_first)
    spec = types.SimpleNamespace(name="band")
    lines = []
    first = kernel_ab.time_variant(spec, "v5e", [], None, lines.append, ())
    assert first == {"forward": {"error": "RuntimeError: scoped vmem exceeded"}}
    assert lines == ["band: failed: RuntimeError: scoped vmem exceeded"]
    assert kernel_ab.time_variant(spec, "v5e", [], None, lines.append, ()) == {
        "forward": {"median_ms": 1.0}
    }
