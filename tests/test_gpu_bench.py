"""bench/gpu_bench.py as a user runs it: the static table (no GPU), and the timing path in
Pallas interpret mode on a scaled-down spec (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, import_file

SCRIPT = REPO / "bench" / "gpu_bench.py"
STATIC_SPECS = ["wan21_720p_mixed", "wan21_720p_temporal"]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def table_rows(stdout: str) -> list[list[str]]:
    """The markdown table's body rows, cells stripped."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_static_table():
    result = run_bench("--specs", ",".join(STATIC_SPECS))
    assert result.returncode == 0, result.stderr
    assert "static" in result.stdout and "no timing" in result.stdout
    rows = table_rows(result.stdout)
    expected = []
    for name in STATIC_SPECS:
        module = import_file(REPO / "generated" / f"{name}.py")
        for tile in ("64x64", "128x64"):
            expected += [(name, pattern, tile) for pattern in module.PATTERNS]
    assert [tuple(r[:3]) for r in rows] == expected
    for spec, pattern, tile, density, full, boundary, visited, pairs, share, csr in rows:
        where = f"{spec} {pattern} {tile}"
        assert 0 < number(density) <= number(pairs), where  # visited pairs >= kept pairs
        assert number(pairs) <= 1 and 0 < number(visited) <= 1, where
        assert number(full) + number(boundary) > 0, where
        assert abs(number(share) - number(boundary) / (number(full) + number(boundary))) < 1e-3
        assert number(csr) >= 4 * (number(full) + number(boundary)), where


def test_time_refuses_without_gpu_unless_interpreted():
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        return  # a GPU machine would time the full-size specs
    result = run_bench("--time", "--specs", "wan21_720p_spatial")
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr


def test_time_interpret_tiny_prints_side_by_side_table():
    result = run_bench("--time", "--interpret", "--tiny", "--specs", "wan21_720p_mixed")
    assert result.returncode == 0, result.stderr
    assert "MEANINGLESS" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("| spec"))
    for column in ("svgen ms", "dense mha ms", "speedup vs mha", "masked XLA ms"):
        assert column in header
    rows = table_rows(result.stdout)
    assert [(r[0], r[3]) for r in rows] == [
        ("wan21_720p_mixed", "64x64"),
        ("wan21_720p_mixed", "128x64"),
    ]
    for row in rows:
        assert re.fullmatch(r"[\d.]+x", row[6])  # speedup vs mha
        assert float(row[9]) < 0.05  # sparse output matches the masked dense one (bf16)
    assert "zero-padded" in result.stdout
