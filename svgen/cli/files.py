"""Where the command's outputs go: folders and files checked before the work that fills
them, and files written whole (svgen.core.safe_io: a temporary file and an atomic rename)
or not at all."""

from __future__ import annotations

import pathlib

from svgen.core.safe_io import read_regular, write_atomically
from svgen.spec.errors import SpecError

#: What svgen reads back of a file in an output folder at most (a module's header, a module
#: or table --check compares): far past any file it generates.
MAX_OUTPUT_BYTES = 1 << 28


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
    """Write changed files only, each whole or not at all (svgen.core.safe_io: a temporary
    file that follows no link, fsync'd, then renamed; a symlinked file is written through to
    its target, and a file keeps its permission bits); a file that cannot be written (a
    folder or FIFO in the way, no permission) is a SpecError naming it."""
    written = []
    for path, data in rendered.items():
        if holds(path, data):
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, data)
        except OSError as exc:
            done = f" ({len(written)} other file(s) written before)" if written else ""
            raise SpecError(f"cannot write it: {exc.strerror or exc}{done}", file=str(path))
        written.append(path)
    return written


def holds(path: pathlib.Path, data: bytes) -> bool:
    """Whether the regular file at `path` holds exactly `data` (read no further than that:
    a FIFO or device there is never read, and is not `data`)."""
    try:
        return read_regular(path, len(data)) == data
    except OSError:
        return False


def read_output(path: pathlib.Path, max_bytes: int = MAX_OUTPUT_BYTES) -> bytes | None:
    """The bytes of a file in the output folder, None where it is not a regular file svgen
    could have written (a folder, FIFO or device: never waited on) or is larger than
    `max_bytes`."""
    try:
        return read_regular(path, max_bytes)
    except OSError:
        return None
