"""A spec is data, and so are the names around it: a data mask's file, an .npz member, the
spec's own path and the output folder all reach the generated module (its docstring, its
header comments), and none of them may become code there. Each is tried with triple
quotes, line breaks, backslashes and quotes: the module must compile, and importing it must
run nothing of the name (the payload would set builtins.PWNED); or svgen refuses the name
with a clear error."""

from __future__ import annotations

import ast
import json
import pathlib

import numpy as np
import pytest

from svgen import codegen
from svgen.cli import main
from svgen.spec.quoting import is_plain, safe_text, unquoted

from helpers import run_python

_CODE = "import builtins; builtins.PWNED = 1"
# Names that would run _CODE if pasted into a docstring or a comment as they are; none holds
# a "/" (each must be a file name too).
HOSTILE = {
    "triple_double": f'x"""; {_CODE}; """y',
    "triple_single": f"x'''; {_CODE}; '''y\"\"\"; {_CODE}; \"\"\"",
    "backslashes": f'x\\"""; {_CODE}; \\"""\\',
    "quote_last": 'x"',
}
# Names with a line break: refused where a spec gives them, escaped where they are paths.
BREAKING = {
    "newline": f'x\n{_CODE}\n"""\n{_CODE}\n"""',
    "carriage_return": f"x\r{_CODE}\r#",
}

SPEC = """\
svgen: 1
name: {name}
geometry: {{frames: 4, height: 8, width: 16}}
attention: {{heads: 1, head_dim: 128, dtype: float32}}
layout: frame_major
mask:
  any_of:
    - blocks: {blocks}
    - first_frame: {{frames: 1}}
tiling: {{block_q: 128, block_kv: 128}}
"""
_N = 512 // 64  # blocks per side


def _spec(folder: pathlib.Path, name: str, blocks: dict, spec_file: str | None = None):
    """A spec named `name` whose mask reads `blocks`, written into `folder` (its file
    `name`.yaml unless `spec_file` is given); the path."""
    path = folder / (spec_file or f"{name}.yaml")
    path.write_text(SPEC.format(name=name, blocks=json.dumps(blocks)))
    return path


def _bits() -> np.ndarray:
    return np.eye(_N, dtype=np.uint8)


def _compile(cwd: pathlib.Path, monkeypatch, *args: str) -> int:
    monkeypatch.chdir(cwd)
    return main(["compile", "--quiet", *args])


def _import_all(modules: list[pathlib.Path]) -> list[dict]:
    """Import each module in a fresh interpreter: whether any import ran a payload, and each
    module's docstring."""
    script = (
        "import builtins, importlib.util, json, sys\n"
        "out = []\n"
        "for i, path in enumerate(sys.argv[1:]):\n"
        "    spec = importlib.util.spec_from_file_location(f'm{i}', path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    out.append({'pwned': hasattr(builtins, 'PWNED'), 'doc': module.__doc__})\n"
        "print(json.dumps(out))\n"
    )
    environment = {"JAX_PLATFORMS": "cpu", "PATH": ""}
    result = run_python("-c", script, *map(str, modules), env=environment, cwd=None)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def _parses_without_payload(module: pathlib.Path) -> None:
    """The module parses, and no statement of it touches builtins."""
    tree = ast.parse(module.read_text())
    assert "builtins" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}, (
        f"{module.name}: a payload became code"
    )


def test_safe_text_keeps_plain_names_and_escapes_the_rest():
    for plain in ("specs/wan21_720p_mixed.yaml", "masks/paro heads.npz", "it's", "é/ü.npy"):
        assert safe_text(plain) == plain
    strange = [*HOSTILE.values(), *BREAKING.values(), "\x00", "a\\", "\udcff", "\u2028", "\t"]
    for value in strange:
        shown = safe_text(value)
        assert not is_plain(value)
        assert shown.isascii() and shown.isprintable() and shown.startswith('"')
        assert unquoted(shown) == value
        # In a docstring, it is part of the one string; in a comment, it ends nothing.
        doc = ast.parse(f'"""Data: {shown}: sha256"""\n')
        assert len(doc.body) == 1 and doc.body[0].value.value == f'Data: "{value}": sha256'
        assert ast.parse(f"# from {shown}. DO NOT EDIT.\n").body == []


def test_hostile_data_mask_file_and_array_names_stay_text(tmp_path, monkeypatch):
    modules = []
    for label, name in HOSTILE.items():
        folder = tmp_path / label
        folder.mkdir()
        np.save(folder / f"{name}.npy", _bits())
        np.savez(folder / "heads.npz", **{name: _bits()})
        _spec(folder, "by_file", {"file": f"{name}.npy", "block": 64})
        _spec(folder, "by_array", {"file": "heads.npz", "block": 64, "array": name})
        assert _compile(folder, monkeypatch, "by_file.yaml", "by_array.yaml", "--out", "gen") == 0
        modules += [folder / "gen" / "by_file.py", folder / "gen" / "by_array.py"]
    for module in modules:
        _parses_without_payload(module)
    imported = _import_all(modules)
    assert not any(m["pwned"] for m in imported)
    for (label, name), by_file, by_array in zip(HOSTILE.items(), imported[::2], imported[1::2]):
        assert f'Data: "{name}.npy": sha256' in by_file["doc"], label
        assert f'(array "{name}")' in by_array["doc"], label


@pytest.mark.parametrize("label", sorted(BREAKING))
def test_names_with_a_line_break_are_refused_in_the_spec(tmp_path, monkeypatch, capsys, label):
    name = BREAKING[label]
    np.savez(tmp_path / "heads.npz", **{name: _bits()})
    _spec(tmp_path, "by_file", {"file": f"{name}.npy", "block": 64})
    _spec(tmp_path, "by_array", {"file": "heads.npz", "block": 64, "array": name})
    for spec in ("by_file.yaml", "by_array.yaml"):
        assert _compile(tmp_path, monkeypatch, spec) == 2
        error = capsys.readouterr().err
        assert f"{spec}:" in error and "must hold no control character" in error
        assert not (tmp_path / "generated").exists()


def test_hostile_spec_paths_and_output_folders_stay_text(tmp_path, monkeypatch):
    np.save(tmp_path / "bits.npy", _bits())
    names = {**HOSTILE, **BREAKING}
    modules = []
    for i, (label, name) in enumerate(names.items()):
        spec = _spec(tmp_path, f"spec_{i}", {"file": "bits.npy", "block": 64}, f"{name}.yaml")
        out = tmp_path / name  # the Regenerate line's --out
        assert _compile(tmp_path, monkeypatch, spec.name, "--out", name) == 0, label
        module = out / f"spec_{i}.py"
        header = codegen.parse_header(module.read_text())
        assert header is not None and header.spec_path == spec.name, label
        # Its own header names its spec: compiling again replaces it, and --check passes.
        assert _compile(tmp_path, monkeypatch, spec.name, "--out", name) == 0, label
        assert _compile(tmp_path, monkeypatch, "--check", spec.name, "--out", name) == 0, label
        modules.append(module)
    for module in modules:
        _parses_without_payload(module)
    imported = _import_all(modules)
    assert not any(m["pwned"] for m in imported)
    for (label, name), m in zip(names.items(), imported):
        # The docstring names the spec as a string literal would: in quotes, escapes undone.
        assert f'generated by svgen from "{name}.yaml".' in m["doc"], label
