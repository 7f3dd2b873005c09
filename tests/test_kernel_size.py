"""svgen.chip.kernel_size: a kernel's program size as libtpu compiles it for v5e on this host.
Every pattern a module carries adds its code, so two patterns make a larger program."""

from __future__ import annotations

import os

from helpers import REPO, run_python
from spec_corpus import TINY_MIXED as MIXED

# The same module with one pattern: its temporal candidate left out.
ONE = MIXED.replace("    - {pattern: temporal, layout: temporal_major}\n", "")


def _run(*args: str) -> str:
    # libtpu takes its bundle-dump flags only when it loads: a fresh process, as `svgen cost` runs.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = run_python(*args, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_second_pattern_makes_a_larger_program_and_svgen_cost_reports_it(tmp_path):
    import json
    import re

    (tmp_path / "one.yaml").write_text(ONE)
    (tmp_path / "two.yaml").write_text(MIXED)
    specs = (str(tmp_path / "one.yaml"), str(tmp_path / "two.yaml"))
    table = _run("-m", "svgen.chip.kernel_size", *specs)
    one, two = (int(n.replace(",", "")) for n in re.findall(r"\| ([0-9,]+) \|", table))
    assert ONE != MIXED and 0 < one < two
    report = json.loads(
        _run(
            "-m",
            "svgen.cli",
            "cost",
            str(tmp_path / "one.yaml"),
            "--json",
            "--no-cache",
            "--target",
            "v5e",
        )
    )
    assert report["paths"]["program"] == one


def test_svgen_cost_reads_the_program_and_warns_past_what_the_chip_ran_well():
    from svgen.analysis.targets import V5E_MEASURED
    from svgen.estimate.cost import program_caveat

    # the figures come from the one record of what the chip showed (svgen report checks it)
    fine, slow = V5E_MEASURED.program_fast_bundles, V5E_MEASURED.program_slow_bundles
    lo, hi = V5E_MEASURED.program_slowdown
    assert program_caveat(0) is None and program_caveat(fine) is None
    assert f"{lo:.1f}-{hi:.1f}x" in program_caveat(slow)
    assert f"{slow:,} bundles" in program_caveat(slow)
    assert "not measured" in program_caveat(fine + 1)
    assert "--program" not in program_caveat(slow)
    both = program_caveat(slow, residual_masks=True, straight_words=True)
    # svgen bench's own options, each a module timed in the same process
    assert "`svgen bench --program whole_masks --program straight_words=0`" in both
    assert "straight" not in program_caveat(slow, residual_masks=True)
