"""Shared helpers: brute-force oracles, and compiling a spec into an importable module."""

from __future__ import annotations

import importlib.util
import itertools
import pathlib
import sys

import numpy as np
import pytest

from svgen import codegen
from svgen.analysis import analyze
from svgen.runtime.kinds import TileKind
from svgen.spec import parse_spec

REPO = pathlib.Path(__file__).resolve().parent.parent
SPECS = sorted((REPO / "specs").glob("*.yaml"))
_module_counter = itertools.count()


def dense_keep(mask, layout) -> np.ndarray:
    """keep[q, k] for every real pair, from the IR oracle (small geometries only)."""
    c = layout.coordinates(np.arange(layout.seq_len))
    return mask.evaluate(c.reshape(-1, 1), c.reshape(1, -1))


def brute_force_kinds(keep: np.ndarray, block_q: int, block_kv: int) -> np.ndarray:
    seq_len = keep.shape[0]
    nq, nk = -(-seq_len // block_q), -(-seq_len // block_kv)
    kinds = np.empty((nq, nk), np.int8)
    for i in range(nq):
        for j in range(nk):
            tile = keep[i * block_q:(i + 1) * block_q, j * block_kv:(j + 1) * block_kv]
            kinds[i, j] = (TileKind.FULL if tile.all() else
                           TileKind.BOUNDARY if tile.any() else TileKind.EMPTY)
    return kinds


def import_file(path: pathlib.Path):
    name = f"_svgen_test_module_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compile_spec_text(text: str, out_dir: pathlib.Path, **analyze_options):
    """Analyze + render a spec given as YAML text; import the generated module."""
    spec = parse_spec(text, source="test.yaml")
    plan = analyze(spec, **analyze_options)
    out_dir.mkdir(parents=True, exist_ok=True)
    for filename, data in codegen.render(plan, "specs/test.yaml").items():
        (out_dir / filename).write_bytes(data)
    return plan, import_file(out_dir / codegen.module_filename(spec.name))


@pytest.fixture
def compile_text(tmp_path):
    counter = itertools.count()

    def run(text: str, **analyze_options):
        return compile_spec_text(text, tmp_path / f"gen{next(counter)}", **analyze_options)

    return run
