"""Hostile spec files: each ends in seconds with exit status 2 and one error naming file,
line and key, no traceback, and nothing written.

The corpus is what an outside review found hanging, exhausting memory or crashing the
compiler (alias bombs, ref fan-out, huge and deeply nested expressions, deep YAML, integers
past 2**63, huge geometries, long ref chains, characters YAML refuses), plus spec and
pattern names that would shadow other modules. Each text is written to a scratch folder and
compiled in-process through the command line, as a user would run it.

Then hostile commands, on specs that are fine: generated file names that collide across
specs, output paths that are files or missing folders, meaningless budgets, `svgen cost`
refusals, `svgen tune --apply` on specs it cannot rewrite. Each ends with exit status 2, a
message (file:line:col and key where it is about a spec), no traceback, nothing written.
"""

from __future__ import annotations

import re
import time

import pytest

from svgen.cli import main
from svgen.spec.limits import MAX_EXPR_DEPTH, MAX_HEADS, MAX_PARAM, MAX_SPEC_BYTES, MAX_YAML_NODES

from helpers import run_svgen

HEAD = """\
svgen: 1
name: hostile
geometry: {frames: 2, height: 2, width: 2}
attention: {heads: 1, head_dim: 128, dtype: float32}
"""
TILING = "tiling: {block_q: 128, block_kv: 128}\n"


def _spec(mask: str = "{causal_frames: {}}", extra: str = "", head: str = HEAD) -> str:
    return f"{head}mask: {mask}\n{extra}{TILING}"


def _sub(old: str, new: str, text: str | None = None) -> str:
    text = _spec() if text is None else text
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _alias_bomb() -> str:
    """Billion laughs: nine levels of nine aliases each, about 10^9 nodes, under 1 KB."""
    lines = [HEAD.rstrip("\n"), "patterns:", '  a: &a {expr: "f_q < 1"}']
    prev = "a"
    for name in "bcdefghi":
        items = ", ".join(f"*{prev}" for _ in range(9))
        lines.append(f"  {name}: &{name} {{any_of: [{items}]}}")
        prev = name
    lines.append("mask: *i")
    return "\n".join(lines) + "\n" + TILING


def _list_bomb() -> str:
    """The classic form: lists of aliased lists under an unknown key."""
    lines = [HEAD.rstrip("\n"), 'lol: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"l{name}: &{name} [" + ", ".join(f"*{prev}" for _ in range(8)) + "]")
        prev = name
    lines.append("mask: {causal_frames: {}}")
    return "\n".join(lines) + "\n" + TILING


def _ref_fanout(levels: int = 40) -> str:
    """Each pattern names the next one twice: 2^levels leaves once refs are expanded."""
    lines = [HEAD.rstrip("\n"), "mask: {ref: p0}", "patterns:"]
    for i in range(levels):
        lines.append(f"  p{i}: {{any_of: [{{ref: p{i + 1}}}, {{ref: p{i + 1}}}]}}")
    lines.append(f"  p{levels}: {{band: {{width: 1}}}}")
    return "\n".join(lines) + "\n" + TILING


def _ref_chain(length: int = 2000, wrap: str = "{ref: NEXT}") -> str:
    lines = [HEAD.rstrip("\n"), "mask: {ref: p0}", "patterns:"]
    for i in range(length):
        lines.append(f"  p{i}: " + wrap.replace("NEXT", f"p{i + 1}"))
    lines.append(f"  p{length}: {{band: {{width: 1}}}}")
    return "\n".join(lines) + "\n" + TILING


def _many_patterns(count: int) -> str:
    lines = [HEAD.rstrip("\n"), "mask: {ref: p0}", "patterns:"]
    lines += [f"  p{i}: {{band: {{width: {i}}}}}" for i in range(count)]
    return "\n".join(lines) + "\n" + TILING


def _block_nesting(depth: int) -> str:
    """YAML nested by indentation (block style), one `not:` per level."""
    lines = [HEAD.rstrip("\n"), "mask:"]
    lines += [" " * (i + 1) + "not:" for i in range(depth)]
    lines.append(" " * (depth + 1) + "text: {}")
    return "\n".join(lines) + "\n" + TILING


def _two_candidates(geometry: str) -> str:
    return (
        HEAD.replace("{frames: 2, height: 2, width: 2}", geometry)
        + "patterns: {a: {text: {}}, b: {causal_frames: {}}}\n"
        + "heads: {candidates: [{pattern: a}, {pattern: b}], assign: runtime}\n"
        + TILING
    )


# (id, spec text, the key the message must name (None: the file as a whole; ":line:col": a
# YAML error there), a word the message must contain)
CASES = [
    # -- YAML aliases
    ("alias_bomb_in_masks", _alias_bomb(), "patterns.", "MAX_YAML_NODES"),
    ("alias_bomb_lists", _list_bomb(), "l", "MAX_YAML_NODES"),
    ("alias_recursive", _spec("&m {not: *m}"), "mask.not", "contains it"),
    # -- refs
    ("ref_fanout", _ref_fanout(), "patterns.p", "MAX_MASK_SIZE"),
    ("ref_chain_2000", _ref_chain(), "patterns.p64", "MAX_PATTERNS"),
    ("ref_chain_2000_not", _ref_chain(wrap="{not: {ref: NEXT}}"), "patterns.p64", "MAX_PATTERNS"),
    (
        "ref_chain_deep",
        _ref_chain(60, wrap="{not: {not: {ref: NEXT}}}"),
        "patterns.p",
        "MAX_MASK_DEPTH",
    ),
    ("too_many_patterns", _many_patterns(65), "patterns.p64", "MAX_PATTERNS"),
    (
        "mask_too_large",
        _spec("{any_of: [" + ", ".join(["{text: {}}"] * 600) + "]}"),
        "mask.any_of",
        "MAX_MASK_SIZE",
    ),
    # -- expr
    (
        "expr_20000_terms",
        _spec('{expr: "' + "f_q + " * 20000 + '0 < 1"}'),
        "mask.expr",
        "MAX_EXPR_CHARS",
    ),
    (
        "expr_too_many_tokens",
        _spec('{expr: "' + "f_q+" * 300 + '0 < 1"}'),
        "mask.expr",
        "MAX_EXPR_TOKENS",
    ),
    (
        "expr_deep_parens",
        _spec('{expr: "' + "(" * 40 + "f_q" + ")" * 40 + ' < 1"}'),
        "mask.expr",
        "MAX_EXPR_DEPTH",
    ),
    (
        "expr_very_deep_parens",
        _spec('{expr: "' + "(" * 2000 + "f_q" + ")" * 2000 + ' < 1"}'),
        "mask.expr",
        "MAX_EXPR_",
    ),
    ("expr_deep_not", _spec('{expr: "' + "not " * 40 + 'f_q < 1"}'), "mask.expr", "MAX_EXPR_DEPTH"),
    ("expr_deep_minus", _spec('{expr: "' + "-" * 40 + 'f_q < 1"}'), "mask.expr", "MAX_EXPR_DEPTH"),
    (
        "expr_deep_calls",
        _spec('{expr: "' + "abs(" * 40 + "f_q" + ")" * 40 + ' < 1"}'),
        "mask.expr",
        "MAX_EXPR_DEPTH",
    ),
    (
        "expr_huge_literal",
        _spec('{expr: "f_q < ' + "9" * 3000 + '"}'),
        "mask.expr",
        "MAX_EXPR_LITERAL",
    ),
    ("expr_literal_2_63", _spec(f'{{expr: "f_q < {2**63}"}}'), "mask.expr", "MAX_EXPR_LITERAL"),
    (
        "expr_alias_repeated",
        _spec(
            '{any_of: [&e {expr: "' + "f_q + " * 120 + '1 < 2"}, ' + ", ".join(["*e"] * 10) + "]}"
        ),
        "mask.any_of",
        "MAX_MASK_SIZE",
    ),
    # -- YAML nesting
    ("yaml_deep_flow_lists", _spec("[" * 1000 + "]" * 1000), "mask", "MAX_YAML_DEPTH"),
    (
        "yaml_deep_flow_masks",
        _spec("{not: " * 1000 + "{text: {}}" + "}" * 1000),
        "mask.not",
        "MAX_YAML_DEPTH",
    ),
    ("yaml_deep_block", _block_nesting(300), "mask.not", "MAX_YAML_DEPTH"),
    (
        "yaml_many_nodes",
        _spec(extra="junk: [" + "1," * (MAX_YAML_NODES + 10) + "1]\n"),
        "junk",
        "MAX_YAML_NODES",
    ),
    # -- integers
    ("frames_2_31", _sub("frames: 2,", f"frames: {2**31},"), "geometry.frames", "MAX_SEQ_LEN"),
    ("frames_2_63", _sub("frames: 2,", f"frames: {2**63},"), "geometry.frames", "MAX_SEQ_LEN"),
    ("height_2_64", _sub("height: 2,", f"height: {2**64},"), "geometry.height", "MAX_SEQ_LEN"),
    (
        "width_5000_digits",
        _sub("width: 2}", "width: " + "7" * 5000 + "}"),
        "geometry.width",
        "cannot read",
    ),
    (
        "text_tokens_2_63",
        _sub("width: 2}", f"width: 2, text_tokens: {2**63}}}"),
        "geometry.text_tokens",
        "MAX_SEQ_LEN",
    ),
    ("heads_2_63", _sub("heads: 1,", f"heads: {2**63},"), "attention.heads", "MAX_HEADS"),
    (
        "heads_too_many",
        _sub("heads: 1,", f"heads: {MAX_HEADS + 1},"),
        "attention.heads",
        "MAX_HEADS",
    ),
    ("band_width_2_63", _spec(f"{{band: {{width: {2**63}}}}}"), "mask.band.width", "MAX_PARAM"),
    ("band_width_negative", _spec("{band: {width: -5}}"), "mask.band.width", "non-negative"),
    (
        "prefix_tokens_huge",
        _spec(f"{{prefix: {{tokens: {2**100}}}}}"),
        "mask.prefix.tokens",
        "MAX_PARAM",
    ),
    (
        "window_rows_huge",
        _spec(f"{{spatial_window: {{frames: 1, rows: {MAX_PARAM + 1}}}}}"),
        "mask.spatial_window.rows",
        "MAX_PARAM",
    ),
    (
        "stride_huge",
        _spec(f"{{temporal_stride: {{stride: {2**63}}}}}"),
        "mask.temporal_stride.stride",
        "MAX_PARAM",
    ),
    (
        "block_q_2_63",
        _sub("block_q: 128", f"block_q: {2**63}"),
        "tiling.block_q",
        "multiple of 128",
    ),
    ("svgen_2_63", _sub("svgen: 1", f"svgen: {2**63}"), "svgen", "must be 1"),
    # -- geometry too large to analyze
    (
        "sequence_too_long",
        _sub("{frames: 2, height: 2, width: 2}", "{frames: 1000000, height: 1000, width: 1000}"),
        "geometry",
        "MAX_SEQ_LEN",
    ),
    (
        "tile_grid_too_large",
        _sub("{frames: 2, height: 2, width: 2}", "{frames: 256, height: 64, width: 64}"),
        "tiling",
        "MAX_TILE_PAIRS",
    ),
    (
        "tile_grid_two_candidates",
        _two_candidates("{frames: 100, height: 64, width: 64}"),
        "tiling",
        "MAX_TILE_PAIRS",
    ),
    # -- the file itself
    ("file_too_large", _spec() + "#" * (MAX_SPEC_BYTES + 1) + "\n", None, "MAX_SPEC_BYTES"),
    ("long_unknown_key", _spec() + "k" * 1000 + ": 1\n", "kkkk", "unknown key"),
    (
        "long_string_value",
        _spec(extra="layout: " + "x" * 100000 + "\n"),
        "layout",
        "must be one of",
    ),
    (
        "long_number_value",
        _sub("heads: 1,", "heads: 1." + "5" * 100000 + ","),
        "attention.heads",
        "must be a positive integer",
    ),
    ("long_name", _sub("name: hostile", "name: " + "n" * 100000), "name", "at most 64"),
    ("endless_key", _spec() + "k" * 100000 + ": 1\n", None, "YAML syntax error"),
    # -- characters YAML refuses (its reader's error is raised before any node is composed)
    ("control_char_in_comment", _spec() + "# a \x07 bell\n", ":7:5", "U+0007"),
    ("nul_in_expr", _spec('{expr: "f_q <\x00 1"}'), ":5:20", "U+0000"),
    ("nul_in_name", _sub("name: hostile", "name: host\x00ile"), ":2:11", "U+0000"),
    ("nul_escaped_in_name", _sub("name: hostile", 'name: "host\\0ile"'), "name", "spec name"),
    ("nul_escaped_in_expr", _spec('{expr: "f_q <\\0 1"}'), "mask.expr", "unexpected"),
]

# Names that would shadow a module, a builtin or be a keyword: as the spec name (the
# generated module's file name) and as a pattern name.
RESERVED_NAMES = [
    "jax",
    "numpy",
    "svgen",
    "yaml",
    "jinja2",
    "sympy",
    "networkx",
    "os",
    "sys",
    "typing",
    "json",
    "math",
    "time",
    "random",
    "this",
    "class",
    "def",
    "lambda",
    "list",
    "print",
    "abs",
    "min",
]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path


def _compile_hostile(project, capsys, text: str) -> tuple[str, str]:
    """Compile ``text`` as specs/hostile.yaml; check the promises that hold for every hostile
    file; return (the spec path as given, stderr)."""
    spec = project / "specs" / "hostile.yaml"
    spec.write_text(text)
    start = time.perf_counter()
    status = main(["compile", str(spec), "--out", str(project / "out")])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert status == 2, err
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert "Traceback" not in out + err
    assert err.count("svgen: error:") == 1, err
    assert len(err) < 2000, err  # one message, not a flood
    assert list((project / "out").iterdir()) == []
    assert str(spec) in err
    return str(spec), err


def _error_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("svgen: error:"))


@pytest.mark.parametrize("case_id,text,key,word", CASES, ids=[c[0] for c in CASES])
def test_hostile_spec_is_refused_quickly_and_cleanly(project, capsys, case_id, text, key, word):
    spec, err = _compile_hostile(project, capsys, text)
    line = _error_line(err)
    assert word in line, line
    if key is None:  # about the file as a whole, or a YAML syntax error
        assert line.startswith(f"svgen: error: {spec}"), line
        return
    if key.startswith(":"):  # a YAML error at a line and column, about no key
        assert line.startswith(f"svgen: error: {spec}{key}: YAML syntax error: "), line
        return
    # file:line:column: key: message
    match = re.match(rf"svgen: error: {re.escape(spec)}:(\d+):(\d+): (\S+): ", line)
    assert match, line
    assert match.group(3).startswith(key), line


@pytest.mark.parametrize("name", RESERVED_NAMES)
def test_reserved_spec_names_are_refused(project, capsys, name):
    spec, err = _compile_hostile(project, capsys, _sub("name: hostile", f"name: {name}"))
    line = _error_line(err)
    assert f"{spec}:2:7: name: '{name}' is a" in line, line
    assert "choose another" in line


@pytest.mark.parametrize("name", RESERVED_NAMES)
def test_reserved_pattern_names_are_refused(project, capsys, name):
    text = _spec("{ref: " + name + "}", extra=f"patterns:\n  {name}: {{text: {{}}}}\n")
    spec, err = _compile_hostile(project, capsys, text)
    line = _error_line(err)
    assert f"{spec}:7:3: patterns.{name}: '{name}' is a" in line, line


def test_limits_leave_room_for_real_specs(project, capsys):
    """Just under each limit still compiles: deep masks, a big expr, many patterns."""
    deep = "{not: " * 63 + "{text: {}}" + "}" * 63
    depth = MAX_EXPR_DEPTH - 1
    expr = "(" * depth + "f_q" + ")" * depth + " + " + "w_k + " * 80 + "0 >= 0"
    patterns = "patterns:\n" + "".join(f"  p{i}: {{band: {{width: {i}}}}}\n" for i in range(64))
    text = _spec(f'{{any_of: [{deep}, {{expr: "{expr}"}}, {{ref: p0}}]}}', extra=patterns)
    spec = project / "specs" / "fine.yaml"
    spec.write_text(text.replace("name: hostile", "name: fine"))
    assert main(["compile", str(spec), "--out", str(project / "out"), "--quiet"]) == 0, (
        capsys.readouterr().err
    )
    assert (project / "out" / "fine.py").exists()


# -- hostile commands: each ends with exit status 2, a clear message, no traceback, and
# nothing written (the scratch project's files are the same bytes before and after).

SMALL = HEAD.replace("{frames: 2, height: 2, width: 2}", "{frames: 2, height: 8, width: 16}")


def _files(root) -> dict:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _refused(project, capsys, argv: list[str], *words: str) -> str:
    """Run the command line in-process; check the promises; return stderr."""
    before = _files(project)
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse refuses its own arguments this way
        status = exc.code
    out, err = capsys.readouterr()
    assert status == 2, err
    assert "Traceback" not in out + err
    for word in words:
        assert word in err, err
    assert _files(project) == before
    return err


def _write(project, name: str, text: str):
    path = project / "specs" / f"{name}.yaml"
    path.write_text(text.replace("name: hostile", f"name: {name}"))
    return path


def _compiled(argv: list[str]) -> None:
    assert main(argv + ["--quiet"]) == 0


@pytest.mark.parametrize("gpu_first", [True, False])
def test_a_gpu_module_name_never_replaces_another_specs_module(project, capsys, gpu_first):
    """`b48 --target h100` writes b48_gpu.py, a TPU compile of the spec named `b48_gpu`
    too: whichever comes second is refused, naming both specs."""
    gpu = _write(project, "b48", _spec())
    tpu = _write(project, "b48_gpu", _spec())
    out = str(project / "out")
    gpu_run = ["compile", str(gpu), "--out", out, "--target", "h100", "--no-gpu-check"]
    tpu_run = ["compile", str(tpu), "--out", out]
    first, second = (gpu_run, tpu_run) if gpu_first else (tpu_run, gpu_run)
    _compiled(first)
    err = _refused(project, capsys, second, "generated file names must not collide")
    line = _error_line(err)
    assert f"b48_gpu.py was generated from {(gpu if gpu_first else tpu).resolve()}" in line
    assert f"compiling {tpu if gpu_first else gpu} would replace it" in line
    # The same spec again is no collision.
    _compiled(first)


def _two_patterns(a: str, b: str) -> str:
    return SMALL + (
        f"patterns: {{{a}: {{causal_frames: {{}}}}, {b}: {{band: {{width: 3}}}}}}\n"
        f"heads: {{candidates: [{{pattern: {a}}}, {{pattern: {b}}}], assign: [{a}]}}\n" + TILING
    )


@pytest.fixture
def table_files(monkeypatch):
    """Every pattern's runs in a .npy beside the module (as past 4,096 runs)."""
    import dataclasses

    from svgen.codegen import backends

    tpu = dataclasses.replace(backends.TPU, max_inline_runs=0)
    monkeypatch.setitem(backends.BACKENDS, "tpu", tpu)


def test_table_file_names_never_collide_in_one_compile(project, capsys, table_files):
    """Spec `a` with pattern `b_c` and spec `a_b` with pattern `c` both make
    a_b_c_tables.npy: refused, naming both specs, before anything is written."""
    a = _write(project, "a", _two_patterns("b_c", "x"))
    a_b = _write(project, "a_b", _two_patterns("c", "y"))
    argv = ["compile", str(a), str(a_b), "--out", str(project / "out")]
    line = _error_line(_refused(project, capsys, argv, "nothing written"))
    assert line.startswith(f"svgen: error: {a_b}: name: its generated file a_b_c_tables.npy")
    assert f"is also generated from {a}; generated file names must not collide" in line


def test_table_files_of_another_spec_are_never_replaced(project, capsys, table_files):
    a = _write(project, "a", _two_patterns("b_c", "x"))
    a_b = _write(project, "a_b", _two_patterns("c", "y"))
    out = str(project / "out")
    _compiled(["compile", str(a), "--out", out])
    argv = ["compile", str(a_b), "--out", out]
    line = _error_line(_refused(project, capsys, argv, "would replace it"))
    assert f"a_b_c_tables.npy was generated from {a.resolve()}, another spec" in line


def test_a_file_svgen_did_not_write_is_never_replaced(project, capsys):
    spec = _write(project, "mine", _spec())
    (project / "out" / "mine.py").write_text("print('my own module')\n")
    argv = ["compile", str(spec), "--out", str(project / "out")]
    _refused(project, capsys, argv, "is not a file svgen generated; refusing to replace it")


def test_out_naming_a_file(project, capsys):
    spec = _write(project, "fine", _spec())
    (project / "out" / "a_file").write_text("")
    for out in ("a_file", "a_file/below"):
        argv = ["compile", str(spec), "--out", str(project / "out" / out)]
        _refused(project, capsys, argv, "--out: ", "must be a folder, but it is a file")


@pytest.mark.parametrize("option,name", [("--tiles", "t.npy"), ("--png", "t.png")])
def test_inspect_into_a_folder_that_does_not_exist(project, capsys, option, name):
    spec = _write(project, "fine", _spec())
    target = str(project / "out" / "missing" / name)
    argv = ["inspect", str(spec), option, target]
    _refused(project, capsys, argv, f"{option}: cannot write {target}: the folder", "not exist")


@pytest.mark.parametrize("command", ["compile", "inspect", "cost", "tune"])
@pytest.mark.parametrize("budget", ["-1", "0", "lots"])
def test_meaningless_smem_budget(project, capsys, command, budget):
    spec = _write(project, "fine", _spec())
    _refused(project, capsys, [command, str(spec), "--smem-budget", budget], "--smem-budget")


def test_align_over_the_analysis_budget_names_line_and_column(project, capsys, monkeypatch):
    from svgen.analysis import classify

    monkeypatch.setattr(classify, "MAX_UNDECIDED_PAIRS", 0)
    text = SMALL + 'mask: {expr: "abs(i_q - i_k) + abs(h_q - h_k) <= 9"}\n'
    spec = _write(project, "near", text + "tiling: {block_q: 128, block_kv: 128, align: nearest}\n")
    argv = ["compile", str(spec), "--out", str(project / "out")]
    line = _error_line(_refused(project, capsys, argv, "nothing written"))
    assert line.startswith(
        f"svgen: error: {spec}:6:46: tiling.align: align: nearest needs exact"
    ), line


def _refused_in_child(project, args: list[str], *words: str) -> str:
    before = _files(project)
    done = run_svgen(*args, cwd=project)  # `svgen cost` sets libtpu's flags for the process
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert _files(project) == before
    return done.stderr


def test_cost_refusals_name_line_and_column(project):
    """Over the VMEM, over the SMEM budget, and a kernel of one grid step (libtpu compiles
    it without a loop): file:line:col: tiling, before any compile."""
    spec = _write(project, "one", SMALL.replace("frames: 2,", "frames: 1,") + _spec()[len(HEAD) :])
    big = _write(
        project, "big", _spec().replace(TILING, "tiling: {block_q: 4096, block_kv: 4096}\n")
    )
    budget = _write(project, "tight", SMALL + "mask: {band: {width: 1}}\n" + TILING)
    cases = [
        (["cost", "specs/big.yaml"], f"{big.name}:6:9: tiling: the kernel needs"),
        (
            ["cost", "specs/tight.yaml", "--smem-budget", "16"],
            f"{budget.name}:6:9: tiling: pattern 'tight' needs",
        ),
        (["cost", "specs/one.yaml"], f"{spec.name}:6:9: tiling: svgen cost models a kernel's"),
    ]
    for args, words in cases:
        _refused_in_child(project, args, "svgen: error: specs/" + words)


class _FakeTune:
    """`svgen.estimate.tune.tune` without its compiles: the spec's tiling with larger tiles
    first."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, spec, **kwargs):
        from types import SimpleNamespace

        from svgen.estimate.tune import Candidate

        if self.then:
            self.then()
        result = SimpleNamespace(choice=SimpleNamespace(candidate=Candidate(256, 256, 256, 256)))
        result.to_json = lambda: {}
        return result


def test_tune_apply_on_a_read_only_spec(project, capsys, monkeypatch):
    """Refused before tuning, and after it when the file became read-only meanwhile; no
    temporary file left."""
    from svgen.estimate import tune

    spec = _write(project, "fixed", SMALL + "mask: {band: {width: 1}}\n" + TILING)
    monkeypatch.setattr(tune, "tune", _FakeTune())
    spec.chmod(0o444)
    argv = ["tune", str(spec), "--apply", "--json"]
    _refused(project, capsys, argv, f"{spec}: --apply rewrites the spec in place", "read-only")
    spec.chmod(0o644)
    monkeypatch.setattr(tune, "tune", _FakeTune(then=lambda: spec.chmod(0o444)))
    _refused(project, capsys, argv, "read-only")
    spec.chmod(0o644)
    monkeypatch.setattr(tune, "tune", _FakeTune())
    assert main(argv) == 0  # writable: rewritten
    assert "tiling: {block_q: 256, block_kv: 256}" in spec.read_text()
    assert sorted(p.name for p in spec.parent.iterdir()) == ["fixed.yaml"]


@pytest.mark.parametrize(
    "tiling,at",
    [
        ("tiling: &t {block_q: 128, block_kv: 128}\ngpu: *t\n", "6:1"),
        ("gpu: &g {block_q: 128, block_kv: 128}\ntiling: *g\n", "7:1"),
    ],
)
def test_tune_apply_on_a_tiling_written_with_an_anchor(project, capsys, monkeypatch, tiling, at):
    """The rewrite would give the GPU section compute blocks: refused, located, before any
    tuning, saying that anchors in `tiling` are not rewritten."""
    from svgen.estimate import tune

    monkeypatch.setattr(tune, "tune", _FakeTune(then=lambda: pytest.fail("tuned")))
    spec = _write(project, "shared", SMALL + "mask: {band: {width: 1}}\n" + tiling)
    argv = ["tune", str(spec), "--apply"]
    line = _error_line(_refused(project, capsys, argv, "write tiling's keys out in full"))
    assert line.startswith(f"svgen: error: {spec}:{at}: tiling: --apply does not rewrite a ")
    assert "YAML anchor or alias" in line


def test_tune_apply_never_writes_a_rewrite_that_changes_more_than_the_tiling(
    project, capsys, monkeypatch
):
    """The rewritten text must read back as the same spec but for its tiling; if not (a YAML
    construct the round trip mishandles), refused, located, instead of an assertion."""
    from svgen.estimate import tune

    monkeypatch.setattr(tune, "tune", _FakeTune())
    real = tune.rewrite_tiling
    monkeypatch.setattr(
        tune,
        "rewrite_tiling",
        lambda text, c, source, chip=None: (
            real(text, c, source, chip)[0].replace("width: 1}", "width: 2}"),
            ["x"],
        ),
    )
    spec = _write(project, "drift", SMALL + "mask: {band: {width: 1}}\n" + TILING)
    line = _error_line(_refused(project, capsys, ["tune", str(spec), "--apply"], "reads back"))
    assert line.startswith(f"svgen: error: {spec}:6:9: tiling: --apply could not rewrite the")
