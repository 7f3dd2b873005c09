"""svgen.chip.gpu_bench as a user runs it (python -m): the static table (no GPU), the
deviceless compile facts of svgen's GPU kernel next to JAX's dense Pallas flash attention (the
toolchain of `.gpu-aot` must be installed: the README's developer install; without it the test
fails), and the timing path in Pallas interpret mode on a scaled-down spec (no timing
asserted)."""

from __future__ import annotations

import dataclasses
import re
import subprocess

from helpers import REPO, run_python

from svgen.analysis import analyze
from svgen.spec import GpuTiling, load_spec

STATIC_SPECS = ["wan21_720p_mixed", "wan21_720p_temporal"]
COMPILE_SPEC = "wan21_720p_band"


def run_bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_python("-m", "svgen.chip.gpu_bench", *args, timeout=timeout)


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
    expected, plans = [], {}
    for name in STATIC_SPECS:
        spec = load_spec(REPO / "specs" / f"{name}.yaml")
        for bq, bkv in ((64, 64), (128, 64)):
            gpu = GpuTiling(block_q=bq, block_kv=bkv)
            plan = analyze(dataclasses.replace(spec, gpu=gpu), target_name="h100")
            tile = f"{bq}x{bkv}"
            plans[name, tile] = plan
            expected += [(name, p.name, tile) for p in plan.patterns]
    assert [tuple(r[:3]) for r in rows] == expected
    for spec, pattern, tile, density, full, boundary, visited, pairs, share, csr in rows:
        where = f"{spec} {pattern} {tile}"
        assert 0 < number(density) <= number(pairs), where  # visited pairs >= kept pairs
        assert number(pairs) <= 1 and 0 < number(visited) <= 1, where
        assert number(full) + number(boundary) > 0, where
        assert abs(number(share) - number(boundary) / (number(full) + number(boundary))) < 1e-3
        assert number(csr) >= 4 * (number(full) + number(boundary)), where
        # the counts are those of the GPU plan's tables (what `svgen compile --target h100` runs)
        plan = plans[spec, tile]
        index = [p.name for p in plan.patterns].index(pattern)
        assert number(full) + number(boundary) == plan.tables.visited(index), where
        assert number(csr) == plan.tables.nbytes, where
        assert abs(number(density) - plan.patterns[index].density) < 1e-4, where


def test_compile_facts_svgen_and_dense_mha():
    result = run_bench("--compile", "--specs", COMPILE_SPEC, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "compile facts, not times" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("| spec"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:11] == [
        "spec",
        "kernel",
        "tile",
        "grid",
        "threads",
        "shared memory",
        "registers",
        "spills (store / load bytes)",
        "wgmma",
        "tiles per head (of all)",
        "vs dense",
    ]
    rows = table_rows(result.stdout)
    assert [tuple(r[:2]) for r in rows] == [(COMPILE_SPEC, "svgen"), (COMPILE_SPEC, "dense mha")]
    svgen, dense = rows
    for row in rows:
        assert number(row[4]) > 0, row  # threads
        assert 0 < number(row[5]) <= 232_448, row  # shared memory, within an H100 block's
        assert number(row[6]) > 0, row  # registers (ptxas)
        assert re.fullmatch(r"\d[\d,]* / \d[\d,]*", row[7]), row  # spills
        assert number(row[8]) > 0, row  # wgmma
    # svgen: one program per (q tile, head) at the spec's default gpu tiling, 4 warps
    assert svgen[2].startswith("64x64") and svgen[3] == "[1182, 10]" and svgen[4] == "128"
    # dense: all 128 x 128 tiles of the sequence padded to 75,648, 8 warps for head_dim 128
    assert dense[2] == "128x128" and dense[3] == "[591, 1, 10]" and dense[4] == "256"
    assert dense[9] == "349,281 (1.0000)" and number(dense[10]) == 1
    visited = re.fullmatch(r"([\d,]+) \(([\d.]+)\)", svgen[9])
    assert visited and 0 < number(svgen[10]) < 1
    assert abs(number(svgen[10]) - float(visited[2])) < 1e-3  # same padded length, 64x64 tiles
    assert "zero-padded to 75,648" in result.stdout


def test_time_refuses_without_gpu_unless_interpreted():
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        return  # a GPU machine would time the full-size specs
    result = run_bench("--time", "--specs", "wan21_720p_spatial")
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr


def test_time_interpret_tiny_prints_side_by_side_table():
    """Also a select spec (its reference mask is the call's own selection) and a KV-cache one
    (scaled down keeping its frames, so its chunk frames still divide them)."""
    specs = ("wan21_720p_mixed", "wan21_720p_select", "self_forcing_chunks")
    result = run_bench("--time", "--interpret", "--tiny", "--specs", ",".join(specs))
    assert result.returncode == 0, result.stderr
    assert "MEANINGLESS" in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("| spec"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    for column in ("svgen ms", "dense mha ms", "speedup vs mha", "masked XLA ms"):
        assert column in columns
    rows = table_rows(result.stdout)
    assert [(r[0], r[3]) for r in rows] == [
        (s, t) for s in sorted(specs) for t in ("64x64", "128x64")
    ]
    for row in rows:
        cell = dict(zip(columns, row))
        assert re.fullmatch(r"[\d.]+x", cell["speedup vs mha"])
        assert cell["dense cuDNN ms"] == "-"  # GPU only
        assert float(cell["max abs diff vs f32"]) < 0.05  # every row checked (bf16)
    assert "zero-padded" in result.stdout
