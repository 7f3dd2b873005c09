"""`svgen tune`: rank a spec's tilings (and align modes) with the cost model; `--apply`
rewrites the spec's tiling with the first choice, in place and only the tiling: the tiling
that was tuned, `tiling.<target>` where the spec names the --target chip, else the plain
keys (`apply_chip`)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys

from svgen.cli.files import write_all
from svgen.cli.progress import TuneProgress
from svgen.core.safe_io import read_regular, writable_target
from svgen.spec import load_spec
from svgen.spec.errors import SpecError
from svgen.spec.limits import MAX_SPEC_BYTES


def tune_spec(args) -> int:
    from svgen.estimate import tune

    chip = None
    if args.apply:  # before minutes of tuning: the spec can be rewritten at all
        chip = apply_chip(pathlib.Path(args.spec), args.target)
        _rewritable(pathlib.Path(args.spec), chip)
    progress = TuneProgress(quiet=False)
    try:
        result = tune.tune(
            args.spec,
            target=args.target,
            aligns=args.align,
            smem_budget=args.smem_budget,
            confirm=args.confirm,
            exhaustive=args.exhaustive,
            wide=args.wide,
            progress=progress,
        )
    finally:
        progress.close()
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        for line in tune.summary_lines(result) + [""] + tune.format_table(result):
            print(line)
    if args.apply:
        _apply_tiling(args.spec, result.choice.candidate, quiet=args.json, chip=chip)
    return 0


def apply_chip(path: pathlib.Path, target: str) -> str | None:
    """Where `svgen tune --apply` writes the first choice for `target`: the tiling that was
    tuned, so `target` when the spec names that chip's own tiling (`tiling.<target>`), else
    None (the plain keys, every chip not named)."""
    return load_spec(path, chip=target).tiling_chip


def apply_measured(
    spec_file: str, tiling: tuple[int, int, int, int], align: str, chip: str
) -> None:
    """`svgen tune --measure --apply`: the measured winner (block_q, block_kv, compute_q,
    compute_kv) under `tiling.<chip>`, created where the spec has none; `align` is the
    spec's own (every chip's, left as it is)."""
    from svgen.estimate.tune import Candidate

    _apply_tiling(spec_file, Candidate(*tiling, align), quiet=False, chip=chip)


def _apply_tiling(spec_file: str, candidate, quiet: bool, chip: str | None = None) -> None:
    """Rewrite the spec's tiling in place (atomically, only once the new text reads back as
    the same spec with the chosen tiling), and say what changed. `chip`: write under
    `tiling.<chip>` (None: the plain keys)."""
    path = pathlib.Path(spec_file)
    text, changes = _rewritten(path, candidate, chip)
    where = "tiling" if chip is None else f"tiling.{chip}"
    if not changes:
        print(f"svgen: {spec_file}: {where} unchanged (already the first choice)", file=sys.stderr)
        return
    _rewritable(path, chip)  # still, after the tuning
    write_all({path: _styled(text, _style(_read_bytes(path)))})
    print(f"svgen: {spec_file}: tiling " + "; ".join(changes), file=sys.stderr)


def _rewritable(path: pathlib.Path, chip: str | None = None) -> None:
    """Refuse a spec that `--apply` could not or should not rewrite: one that cannot be
    read, or is read-only (no write permission bit: a read-only file is the user's word,
    which root's access would override), in a folder that takes no new file (the rewrite is
    a temporary file and a rename), or whose `tiling` (`tiling.<chip>` where `chip` is
    given) the rewrite cannot change alone."""
    spec = load_spec(path, chip=chip)
    try:
        real = writable_target(path)  # a symlinked spec: the file it points to
        mode = real.stat().st_mode
    except OSError as exc:
        raise SpecError(f"cannot rewrite the spec file: {exc.strerror}", file=str(path)) from None
    if not mode & 0o222 or not os.access(real, os.W_OK):
        raise SpecError(
            "--apply rewrites the spec in place, but the file is read-only", file=str(path)
        )
    if not os.access(real.parent, os.W_OK | os.X_OK):
        raise SpecError(
            f"--apply rewrites the spec through a temporary file beside it, but its folder "
            f"{real.parent} is read-only",
            file=str(path),
        )
    from svgen.estimate.tune import Candidate

    t = spec.tiling
    _rewritten(path, Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align), chip)


def _rewritten(path: pathlib.Path, candidate, chip: str | None = None) -> tuple[str, list[str]]:
    """The spec's text with `candidate`'s tiling (under `tiling.<chip>` where `chip` is
    given), and the changes in words; a SpecError when the new text would not read back as
    the same spec with that tiling for `chip` (every other chip's unchanged but for align,
    which is every chip's)."""
    from svgen.spec import parse_spec
    from svgen.estimate.tune import rewrite_tiling

    try:
        text = _plain_text(_read_bytes(path))
    except UnicodeError as exc:
        raise SpecError(f"cannot read the spec file: {exc}", file=str(path)) from None
    old = parse_spec(text, source=str(path), chip=chip)
    new_text, changes = rewrite_tiling(text, candidate, source=str(path), chip=chip)
    try:
        new = parse_spec(new_text, source=str(path), chip=chip)
    except SpecError:  # about the rewritten text, not the user's: say what happened instead
        new = None
    t = new.tiling if new is not None else None
    want = (
        candidate.block_q,
        candidate.block_kv,
        candidate.compute_q,
        candidate.compute_kv,
        candidate.align,
    )
    if (
        t is None
        or (t.block_q, t.block_kv, t.cq, t.ckv, t.align) != want
        or (chip is not None and new.tiling_chip != chip)
        or _without_tiling(old, chip) != _without_tiling(new, chip)
    ):
        where = "tiling" if chip is None else f"tiling.{chip}"
        raise SpecError(
            f"--apply could not rewrite the tiling alone (the rewritten spec reads back "
            f"differently); write {where}'s keys out in full, then run again",
            file=str(path),
            key=where,
        )
    return new_text, changes


_BOM = "\ufeff"


def _read_bytes(path: pathlib.Path) -> bytes:
    """The spec file's bytes (a regular file, through a symlink, bounded like load_spec's)."""
    try:
        return read_regular(path, MAX_SPEC_BYTES)
    except OSError as exc:
        raise SpecError(
            f"cannot read the spec file: {exc.strerror or exc}", file=str(path)
        ) from None


@dataclasses.dataclass(frozen=True)
class _Style:
    """How a spec file writes its text, which --apply keeps: a UTF-8 byte order mark, and
    CRLF line endings (those of its first line)."""

    bom: bool
    crlf: bool


def _style(raw: bytes) -> _Style:
    first_break = raw.find(b"\n")
    return _Style(raw.startswith(_BOM.encode()), first_break > 0 and raw[first_break - 1] == 13)


def _plain_text(raw: bytes) -> str:
    """The spec's text as --apply rewrites it: no byte order mark, LF line endings."""
    return raw.decode("utf-8").removeprefix(_BOM).replace("\r\n", "\n")


def _styled(text: str, style: _Style) -> bytes:
    """`text` (_plain_text's form) written in the spec file's own style."""
    if style.crlf:
        text = text.replace("\n", "\r\n")
    return ((_BOM if style.bom else "") + text).encode("utf-8")


def _without_tiling(spec, chip: str | None = None):
    """What a spec says besides the tiling --apply rewrites (the plain keys', or `chip`'s
    own) and align (every chip's), for --apply's check that only that tiling moved."""

    def sizes(t):
        return None if t is None else dataclasses.replace(t, align="exact")

    return dataclasses.replace(
        spec,
        tiling=None,
        digest="",
        tiling_chip=None,
        plain_tiling=None if chip is None else sizes(spec.tiling_for(None)),
        tilings=tuple((name, sizes(t)) for name, t in spec.tilings if name != chip),
    )
