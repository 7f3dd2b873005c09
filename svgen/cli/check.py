"""`svgen compile --check` (and `--diff`): compare what the specs render with the files in
the output directory, writing nothing."""

from __future__ import annotations

import difflib
import pathlib
import sys

from svgen import codegen
from svgen.cli.files import read_output
from svgen.cli.messages import EXIT_STALE
from svgen.cli.ownership import orphaned_tables, orphans


def check_generated(
    rendered: dict[pathlib.Path, bytes], out_dir: pathlib.Path, show_diff: bool, quiet: bool
) -> int:
    problems = []
    for path, data in rendered.items():
        problem = _problem(path, data, show_diff)
        if problem is not None:
            problems.append(problem)
    problems += orphans(out_dir, set(rendered))
    problems += [
        f"{path}: stale (no module loads it any more; run svgen compile to remove it)"
        for path in orphaned_tables(out_dir, set(rendered))
    ]
    for p in problems:
        print(f"svgen: {p}", file=sys.stderr)
    if problems:
        return EXIT_STALE
    if not quiet:
        print(f"svgen: {len(rendered)} generated file(s) up to date", file=sys.stderr)
    return 0


def _problem(path: pathlib.Path, data: bytes, show_diff: bool) -> str | None:
    """What is wrong with the file at `path`, which should hold `data` (None: nothing); a
    module's differences go to stdout as a unified diff when `show_diff`."""
    if not path.exists() and not path.is_symlink():
        return f"{path}: missing (run svgen compile)"
    current = read_output(path)
    if current is None:
        return f"{path}: not a file svgen wrote (a folder, FIFO or device in its place)"
    if current == data:
        return None
    if path.suffix != ".py":
        return f"{path}: stale or edited (binary table differs)"
    text = current.decode(errors="replace")
    header = codegen.parse_header(text)
    if header is None or header.body_sha256 != codegen.body_checksum(codegen.body_of(text)):
        problem = f"{path}: edited by hand (its checksum does not match its body)"
    else:
        problem = f"{path}: stale (the spec or svgen changed; run svgen compile)"
    if show_diff:
        sys.stdout.writelines(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                data.decode().splitlines(keepends=True),
                fromfile=str(path),
                tofile=f"{path} (regenerated)",
            )
        )
    return problem
