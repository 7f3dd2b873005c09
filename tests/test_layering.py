"""The layering CONTRIBUTING.md promises: reading specs (and the primitive registry) loads
neither JAX nor jinja2 nor the later stages (only svgen.core's NumPy-only token layout, the
one layout type every stage shares); the runtime imports nothing of the compiler, and
svgen.core, the ground floor, nothing of svgen above it."""

from __future__ import annotations

import ast

from helpers import REPO, SPECS, run_python

_LOADED = """
import sys
from svgen.spec import load_spec
for path in sys.argv[1:]:
    load_spec(path)
heavy = (
    "jax",
    "jinja2",
    "svgen.ir",
    "svgen.analysis",
    "svgen.codegen",
    "svgen.core",
    "svgen.runtime",
    "svgen.estimate",
    "svgen.chip",
    "svgen.report",
)
# The token layout every stage shares (and the curves its curve orders walk), and libtpu_env
# (os only), which svgen's own import runs so that libtpu stays quiet in a user's script
# (svgen/__init__.py).
shared = (
    "svgen.core",
    "svgen.core.curves",
    "svgen.core.layout",
    "svgen.runtime",
    "svgen.runtime.libtpu_env",
)
print(" ".join(sorted(m for m in sys.modules if m.startswith(heavy) and m not in shared)))
"""


def test_reading_specs_loads_no_later_stage():
    result = run_python("-c", _LOADED, *map(str, SPECS))
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
            assert name.startswith(("svgen.runtime", "svgen.core")), f"{path.name} imports {name}"


def test_the_ground_floor_imports_nothing_above_it_and_no_jax():
    for path in sorted((REPO / "svgen" / "core").glob("*.py")):
        for name in _svgen_imports(path):
            assert name.startswith("svgen.core"), f"{path.name} imports {name}"
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m.split(".")[0] in ("jax", "jaxlib")}, path.name


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
    result = run_python("-c", _COMPILED, *map(str, SPECS))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def _module_names() -> dict[str, object]:
    """svgen's modules by dotted name (a package by its own name) -> path."""
    names = {}
    for path in (REPO / "svgen").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph():
    """Who imports whom among svgen's modules: every import statement, the ones inside
    functions too (a deferred import is still a dependency, and the way a circle hides).
    `from package import name` is an edge to the module `package.name` where there is one,
    else to the package."""
    import networkx as nx

    names = _module_names()
    graph = nx.DiGraph()
    for name, path in names.items():
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                    for a in node.names
                ]
            else:
                continue
            graph.add_edges_from((name, t) for t in targets if t in names and t != name)
    return graph


def test_no_import_circle():
    import networkx as nx

    circles = sorted(sorted(c) for c in nx.simple_cycles(import_graph()))
    assert circles == [], f"import circles: {circles}"


def test_import_graph_sees_deferred_imports():
    """The graph the circle test reads has the edges it must see: a deferred import inside a
    function (svgen.estimate.measure imports the runtime there) and `from package import module`."""
    graph = import_graph()
    assert graph.has_edge("svgen.estimate.measure", "svgen.runtime.backward")
    assert graph.has_edge("svgen.runtime.kernel", "svgen.runtime.backward")


# CONTRIBUTING's house map: the rooms (a folder of svgen, or ir / cli) each room may import.
# The pipeline reads down this list; core is the ground floor every room may stand on; the
# rooms on the side (estimate, chip) and on top (report, cli) may import any stage, and no
# stage imports them. Of the two on the side, the chip room (what a chip or a toolchain run
# says) may use the static estimate (its program-size count reads libtpu's schedule with
# it), and the estimate never imports the chip room: a figure it gives cannot rest on a
# timing.
MAY_IMPORT = {
    "core": {"core"},
    "spec": {"spec", "core"},
    "ir": {"spec", "ir", "core"},
    "analysis": {"spec", "ir", "analysis", "core"},
    "codegen": {"spec", "ir", "analysis", "codegen", "core"},
    "runtime": {"runtime", "core"},
    "estimate": {"spec", "ir", "analysis", "codegen", "runtime", "core", "estimate"},
    "chip": {"spec", "ir", "analysis", "codegen", "runtime", "core", "estimate", "chip"},
    "report": {"spec", "ir", "analysis", "codegen", "runtime", "core", "report"},
    "cli": {
        "spec",
        "ir",
        "analysis",
        "codegen",
        "runtime",
        "core",
        "estimate",
        "chip",
        "report",
        "cli",
    },
}


def _room(module: str) -> str:
    """svgen.spec.loader -> spec, svgen.ir -> ir, svgen.core.tables -> core."""
    return module.split(".")[1]


def test_each_room_imports_only_what_the_house_map_allows():
    graph = import_graph()
    rooms = {_room(m) for m in graph if m != "svgen"}
    assert rooms == set(MAY_IMPORT), "a room the house map does not name"
    wrong = sorted(
        f"{a} imports {b}"
        for a, b in graph.edges
        if a != "svgen" and b != "svgen" and _room(b) not in MAY_IMPORT[_room(a)]
    )
    assert wrong == []


def _strings_outside_docstrings(path) -> list[str]:
    """Every string constant of a module but its docstrings (a docstring may cite a study as
    the source of a figure; a string the code uses is a message, a path or an import)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


STUDIES = sorted(p.stem for p in (REPO / "bench").glob("*.py"))


def _names_a_study(text: str) -> bool:
    """A study's file, or an import of one (in code a test hands a child process)."""
    return any(
        f"{s}.py" in text or f"import {s}" in text or f"from {s} import" in text for s in STUDIES
    )


def test_no_test_imports_or_runs_a_study():
    """bench/ holds studies (bench/README.md); the tools are svgen.chip's. A test imports no
    study, puts no bench/ on sys.path and names no study's file to load or run."""
    assert len(STUDIES) > 10  # the scripts are where this test looks for them
    wrong = []
    for path in sorted((REPO / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            wrong += [f"{path.name} imports {n}" for n in names if n.split(".")[0] in STUDIES]
            on_path = isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "sys.path.insert",
                "sys.path.append",
            )
            if on_path and "bench" in ast.unparse(node):
                wrong.append(f"{path.name}: {ast.unparse(node)}")
        wrong += [
            f"{path.name}: {t!r}" for t in _strings_outside_docstrings(path) if _names_a_study(t)
        ]
    assert wrong == []


def test_no_string_of_svgen_names_a_study():
    """What svgen prints (and runs) never points into bench/'s scripts: a study is not a tool
    (comments and docstrings may cite one as the source of a figure)."""
    wrong = [
        f"{path.relative_to(REPO)}: {text!r}"
        for path in sorted((REPO / "svgen").rglob("*.py"))
        for text in _strings_outside_docstrings(path)
        if any(f"bench/{s}.py" in text for s in STUDIES)
    ]
    assert wrong == []
