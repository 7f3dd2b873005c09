"""bench/kernel_size.py: a kernel's program size as libtpu compiles it for v5e on this host.
Every pattern a module carries adds its code, so two patterns make a larger program."""

from __future__ import annotations

import sys

sys.path.insert(0, "bench")
import kernel_size  # noqa: E402

from svgen.spec import parse_spec  # noqa: E402
from test_chip_bench import MIXED  # noqa: E402

# The same module with one pattern: its temporal candidate left out.
ONE = MIXED.replace("    - {pattern: temporal, layout: temporal_major}\n", "")


def test_a_second_pattern_makes_a_larger_program():
    assert ONE != MIXED
    one = kernel_size.kernel_bundles(parse_spec(ONE, source="one.yaml"), "v5e")
    two = kernel_size.kernel_bundles(parse_spec(MIXED, source="two.yaml"), "v5e")
    assert 0 < one < two


def test_svgen_cost_reads_the_program_and_warns_past_what_the_chip_ran_well():
    from svgen.perf.cost import PROGRAM_BUNDLES_MEASURED, program_caveat

    fine, slow = PROGRAM_BUNDLES_MEASURED
    assert program_caveat(0) is None and program_caveat(fine) is None
    assert "2.1-5.0x" in program_caveat(slow) and f"{slow:,} bundles" in program_caveat(slow)
    assert "not measured" in program_caveat(fine + 1)


def test_svgen_cost_reports_the_program_size_it_compiled(tmp_path, capsys):
    import json

    from svgen.cli import main

    spec = tmp_path / "one.yaml"
    spec.write_text(ONE)
    assert main(["cost", str(spec), "--json", "--no-cache", "--target", "v5e"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = kernel_size.kernel_bundles(parse_spec(ONE, source="one.yaml"), "v5e")
    assert report["paths"]["program"] == expected > 0
