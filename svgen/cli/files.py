"""Where the command's outputs go: folders and files checked before the work that fills
them, and files written whole (a temporary file and an atomic rename) or not at all."""

from __future__ import annotations

import os
import pathlib

from svgen.spec.errors import SpecError


def check_folder(path: pathlib.Path, option: str) -> None:
    """`path` is, or can be made, a folder: its nearest existing ancestor is a folder."""
    for existing in (path, *path.parents):
        if existing.exists():
            break
    if not existing.is_dir():
        what = "" if existing == path else f" (its parent {existing} is)"
        raise SpecError(f"{option}: {path} must be a folder, but it is a file{what}")


def header_root(out_dir: pathlib.Path) -> pathlib.Path:
    """The folder a generated header's paths are relative to, where its Regenerate line
    runs: the repository root (the nearest folder at or above the output directory holding
    `.git`), else the output directory's parent. A function of the output directory only,
    never of where svgen runs, so the files are the same from any working folder; for
    `generated/` at a repository's top (the shipped modules) both rules give that top."""
    out = out_dir.resolve()
    for folder in (out, *out.parents):
        if (folder / ".git").exists():  # a folder, or a file in a worktree or submodule
            return folder
    return out.parent


def check_file_target(path: pathlib.Path, option: str) -> None:
    """An output file `path` can be written: its folder exists, and it is not a folder."""
    parent = path.parent
    if not parent.is_dir():
        why = "does not exist" if not parent.exists() else "is a file"
        raise SpecError(f"{option}: cannot write {path}: the folder {parent} {why}")
    if path.is_dir():
        raise SpecError(f"{option}: cannot write {path}: it is a folder")


def write_all(rendered: dict[pathlib.Path, bytes]) -> list[pathlib.Path]:
    """Write changed files only, each through a temporary file and an atomic rename; a file
    that cannot be written is a SpecError naming it (its temporary file removed)."""
    written = []
    for path, data in rendered.items():
        if path.exists() and path.read_bytes() == data:
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            done = f" ({len(written)} other file(s) written before)" if written else ""
            raise SpecError(f"cannot write it: {exc.strerror or exc}{done}", file=str(path))
        written.append(path)
    return written
