"""`svgen tune`: rank a spec's tilings (and align modes) with the cost model; `--apply`
rewrites the spec's tiling with the first choice, in place and only the tiling."""

from __future__ import annotations

import json
import os
import pathlib
import sys

from svgen.cli.files import write_all
from svgen.cli.progress import TuneProgress
from svgen.spec import load_spec
from svgen.spec.errors import SpecError


def tune_spec(args) -> int:
    from svgen.perf import tune

    if args.apply:  # before minutes of tuning: the spec can be rewritten at all
        _rewritable(pathlib.Path(args.spec))
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
        _apply_tiling(args.spec, result.choice.candidate, quiet=args.json)
    return 0


def _apply_tiling(spec_file: str, candidate, quiet: bool) -> None:
    """Rewrite the spec's tiling in place (atomically, only once the new text reads back as
    the same spec with the chosen tiling), and say what changed."""
    path = pathlib.Path(spec_file)
    text, changes = _rewritten(path, candidate)
    if not changes:
        print(f"svgen: {spec_file}: tiling unchanged (already the first choice)", file=sys.stderr)
        return
    _rewritable(path)  # still, after the tuning
    write_all({path: text.encode("utf-8")})
    print(f"svgen: {spec_file}: tiling " + "; ".join(changes), file=sys.stderr)


def _rewritable(path: pathlib.Path) -> None:
    """Refuse a spec that `--apply` could not or should not rewrite: one that cannot be
    read, or is read-only (no write permission bit: a read-only file is the user's word,
    which root's access would override), in a folder that takes no new file (the rewrite is
    a temporary file and a rename), or whose `tiling` the rewrite cannot change alone."""
    spec = load_spec(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SpecError(f"cannot read the spec file: {exc.strerror}", file=str(path)) from None
    if not mode & 0o222 or not os.access(path, os.W_OK):
        raise SpecError(
            "--apply rewrites the spec in place, but the file is read-only", file=str(path)
        )
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise SpecError(
            f"--apply rewrites the spec through a temporary file beside it, but its folder "
            f"{path.parent} is read-only",
            file=str(path),
        )
    from svgen.perf.tune import Candidate

    t = spec.tiling
    _rewritten(path, Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align))


def _rewritten(path: pathlib.Path, candidate) -> tuple[str, list[str]]:
    """The spec's text with `candidate`'s tiling, and the changes in words; a SpecError when
    the new text would not read back as the same spec with that tiling."""
    from svgen.spec import parse_spec
    from svgen.perf.tune import rewrite_tiling

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise SpecError(f"cannot read the spec file: {exc}", file=str(path)) from None
    old = parse_spec(text, source=str(path))
    new_text, changes = rewrite_tiling(text, candidate, source=str(path))
    try:
        new = parse_spec(new_text, source=str(path))
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
        or _without_tiling(old) != _without_tiling(new)
    ):
        raise SpecError(
            "--apply could not rewrite the tiling alone (the rewritten spec reads back "
            "differently); write tiling's keys out in full, then run again",
            file=str(path),
            key="tiling",
        )
    return new_text, changes


def _without_tiling(spec):
    """What a spec says besides its tiling (for --apply's check that only the tiling moved)."""
    import dataclasses

    return dataclasses.replace(spec, tiling=None, digest="")
