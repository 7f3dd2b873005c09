"""The layering CONTRIBUTING.md promises: reading specs (and the primitive registry) loads
neither JAX nor jinja2 nor the later stages (only the runtime's NumPy-only token layout, the
one layout type every stage shares); the runtime imports nothing of the compiler."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import REPO, SPECS

_LOADED = """
import sys
from svgen.spec import load_spec
for path in sys.argv[1:]:
    load_spec(path)
heavy = ("jax", "jinja2", "svgen.ir", "svgen.analysis", "svgen.codegen", "svgen.runtime")
shared = ("svgen.runtime", "svgen.runtime.layout")
print(" ".join(sorted(m for m in sys.modules if m.startswith(heavy) and m not in shared)))
"""


def test_reading_specs_loads_no_later_stage():
    result = subprocess.run(
        [sys.executable, "-c", _LOADED, *map(str, SPECS)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def _svgen_imports(path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "svgen":
            names += [f"svgen.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return [n for n in names if n.startswith("svgen.")]


def test_runtime_imports_nothing_of_the_compiler():
    for path in sorted((REPO / "svgen" / "runtime").glob("*.py")):
        for name in _svgen_imports(path):
            assert name.startswith("svgen.runtime"), f"{path.name} imports {name}"


_COMPILED = """
import sys
from svgen import codegen
from svgen.analysis import analyze
from svgen.spec import load_spec
for path in sys.argv[1:]:
    codegen.render(analyze(load_spec(path)), path)
print(" ".join(sorted(m for m in sys.modules if m.startswith("jax.experimental.pallas"))))
"""


def test_compiling_specs_never_imports_pallas():
    """The table format (runs, pieces, transposed tables) is NumPy only: svgen compile
    analyzes and renders every shipped spec without loading Pallas (0.7 s of imports)."""
    result = subprocess.run(
        [sys.executable, "-c", _COMPILED, *map(str, SPECS)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
