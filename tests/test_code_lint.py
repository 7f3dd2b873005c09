"""Lint and format: ruff's pyflakes and syntax rules, and `ruff format --check` (line length
100), over the code, the tests, the benches, the examples and the generated modules
(configured in pyproject.toml; ruff comes with the dev install)."""

import numpy as np

from helpers import REPO, mask_spec_text, random_layout, random_mask, run_python

CHECKED = ["svgen", "tests", "bench", "examples", "generated"]


def _ruff(*args, cwd=REPO):
    return run_python("-m", "ruff", *args, cwd=cwd)


def test_ruff_finds_nothing():
    result = _ruff("check", *CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_and_generated_modules_are_formatted():
    result = _ruff("format", "--check", *CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_modules_of_random_masks_are_formatted(tmp_path, monkeypatch):
    """Codegen lays statements out as the formatter does (svgen.codegen.pyformat): the
    modules of random masks and layouts (30, or more until both a long mask chain split
    into `& ...` / `| ...` lines and a fused call split an argument a line have appeared;
    the fused calls took most conjunctions that once made chains), pass the check.
    User predicates come from the fixed list: pyformat splits only the shapes built-ins
    produce, and a long comparison or sum of a random `expr` is left as one line, which
    ruff would split (docs/limits.md); so are `neighborhood` and `radial`, printed as the
    predicates they lower to."""
    import helpers
    from svgen import codegen
    from svgen.analysis import analyze
    from svgen.spec import parse_spec

    monkeypatch.setitem(
        helpers.PRIMITIVE_GENERATORS, "expr", lambda rng, lay: str(rng.choice(helpers.PREDICATES))
    )
    for printed_as_a_predicate in ("neighborhood", "radial"):  # as `expr`: one long line
        monkeypatch.delitem(helpers.PRIMITIVE_GENERATORS, printed_as_a_predicate)

    split_chains = split_calls = 0
    for seed in range(120):
        if seed >= 30 and split_chains and split_calls:
            break
        rng = np.random.default_rng(11_000 + seed)
        lay = random_layout(rng)
        text = mask_spec_text(random_mask(rng, lay), lay, name=f"formatted_{seed}")
        for name, data in codegen.render(analyze(parse_spec(text)), "specs/x.yaml").items():
            (tmp_path / name).write_bytes(data)
            lines = data.decode().splitlines()
            split_chains += sum(line.lstrip().startswith(("& ", "| ")) for line in lines)
            split_calls += sum(line.endswith("coords.fields(") for line in lines)
    result = _ruff("format", "--check", "--config", str(REPO / "pyproject.toml"), str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert split_chains > 0, "no random mask produced a split chain: the test checks too little"
    assert split_calls > 0, "no random mask produced a split call: the test checks too little"
