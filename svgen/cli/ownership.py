"""Which spec each generated file belongs to, read from the modules' headers: so that a
compile replaces only files its own specs generated, and a check finds modules whose spec
is gone and tables that no module loads any more."""

from __future__ import annotations

import pathlib
import re

from svgen import codegen
from svgen.cli.files import header_root, read_output


def collisions(
    files: dict[str, bytes],
    spec_file: str,
    out_dir: pathlib.Path,
    owners: dict[pathlib.Path, str],
    check: bool,
) -> list[str]:
    """Why the files of `spec_file` must not be written: a name that another spec of this
    compile also renders (a spec `b48` for a GPU and one named `b48_gpu` both make
    `b48_gpu.py`; names and pattern names can combine to the same `_tables.npy`), or a file
    already in `out_dir` that another existing spec's compile wrote (`_owners`). Both spec
    files are named; nothing is written."""
    problems = []
    for filename in files:
        path = out_dir / filename
        if path in owners:
            problems.append(
                f"{spec_file}: name: its generated file {filename} is also generated from "
                f"{owners[path]}; generated file names must not collide: rename one of the specs"
            )
            continue
        if check or not path.exists():
            continue
        problem = _on_disk_collision(path, spec_file, out_dir)
        if problem is not None:
            problems.append(problem)
    return problems


def _on_disk_collision(path: pathlib.Path, spec_file: str, out_dir: pathlib.Path) -> str | None:
    """Why the existing `path` must not be replaced by `spec_file`'s compile, if it must not:
    a folder, a file svgen did not write, or one that another existing spec generated."""
    if path.is_dir():
        return f"{spec_file}: name: {path} is a folder, in the way of a generated file"
    owners_on_disk = _owners(path, out_dir)
    if owners_on_disk is None:
        return (
            f"{spec_file}: name: {path} exists and is not a file svgen generated; "
            f"refusing to replace it"
        )
    for owner in owners_on_disk:
        if not _same_file(owner, spec_file) and owner.exists():
            return (
                f"{spec_file}: name: {path} was generated from {owner}, another spec; "
                f"compiling {spec_file} would replace it: generated file names must not "
                f"collide: rename one of the specs"
            )
    return None


def _owners(path: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path] | None:
    """The spec files that the generated file `path` came from: a module's header names its
    spec; a table file belongs to each module in `out_dir` that loads it (none: left over).
    None for a module without svgen's header (not a generated file)."""
    if path.suffix == ".py":
        header = codegen.parse_header(_text(path))
        return None if header is None else [header_root(out_dir) / header.spec_path]
    quoted, found, root = f'"{path.name}"', [], header_root(out_dir)
    for module in sorted(out_dir.glob("*.py")):
        text = _text(module)
        header = codegen.parse_header(text)
        if header is not None and quoted in text:
            found.append(root / header.spec_path)
    return found


def _same_file(a: pathlib.Path, b: str) -> bool:
    return a.resolve() == pathlib.Path(b).resolve()


def orphans(out_dir: pathlib.Path, expected: set[pathlib.Path]) -> list[str]:
    """Generated modules whose spec no longer exists."""
    found, root = [], header_root(out_dir)
    for path in sorted(out_dir.glob("*.py")):
        if path in expected:
            continue
        header = codegen.parse_header(_text(path))
        if header and not (root / header.spec_path).exists():
            found.append(f"{path}: stale (its spec {header.spec_path} no longer exists)")
    return found


def _text(path: pathlib.Path) -> str:
    """A file of the output folder as text ("" where it is not a regular file: a FIFO there
    is never waited on)."""
    data = read_output(path)
    return "" if data is None else data.decode(errors="replace")


# How a generated module names a table file beside it (templates/common/module.py.j2).
_LOADS_RE = re.compile(r'pathlib\.Path\(__file__\)\.with_name\("([^"/\\]+\.npy)"\)')


def tables_loaded(module: pathlib.Path) -> set[str]:
    """The names of the table files the module at `module` loads (none: no such module)."""
    return set(_LOADS_RE.findall(_text(module)))


def orphaned_tables(
    out_dir: pathlib.Path, rendered: set[pathlib.Path], loaded_before: set[str] = frozenset()
) -> list[pathlib.Path]:
    """Table files in `out_dir` that no module there loads any more, of this compile's
    modules: those `loaded_before` (what the modules it replaced loaded) and a data mask's
    tables of one of them. A data mask's table is named by its file's digest
    (codegen.block_tables_filename), so a changed mask file leaves the old one behind."""
    stems = [re.escape(p.stem) for p in rendered if p.suffix == ".py"]
    if not stems:
        return []
    data_table = re.compile(
        rf"(?:{'|'.join(stems)})_blocks_[0-9a-f]{{12}}_[0-9]+(?:_h[0-9]+)?(?:_a[0-9a-f]{{6}})?\.npy"
    )
    candidates = {out_dir / name for name in loaded_before}
    candidates |= {p for p in out_dir.glob("*.npy") if data_table.fullmatch(p.name)}
    still_loaded = set().union(*(tables_loaded(m) for m in out_dir.glob("*.py")))
    return sorted(
        p
        for p in candidates
        if p not in rendered and p.name not in still_loaded and p.is_file() and not p.is_symlink()
    )
