"""Mutation checks: does the suite catch a broken kernel? Not a test module (pytest does not
collect it): a script that breaks svgen on purpose, one fault at a time, in a scratch copy of
the repository, runs the tests there, and says which faults they caught (killed) and which
they let pass (survived). docs/testing.md records its last results.

    .venv/bin/python tests/mutants.py                  # every fault, the whole suite each
    .venv/bin/python tests/mutants.py --only residual_masks_off head_offset_dropped
    .venv/bin/python tests/mutants.py --tests OLD/tests tests/test_kernels.py
                                                       # another tests/ tree, some files

Each fault is an exact edit of one line of svgen (MUTANTS: the file, the text replaced, its
replacement); an edit whose text is not found exactly once is said, not run. The tests run
with `-x` (the first failure kills the fault) and the README's `-n 2`, against the copy
(PYTHONPATH), with a cache folder of the copy's own (the program-size counts of a broken
kernel are never anyone else's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # under the repository
    old: str  # replaced exactly once
    new: str
    fault: str  # what it breaks, in words


MUTANTS = (
    Mutant(
        "residual_masks_off",
        "svgen/runtime/variant.py",
        "mask = self.boundary_mask if j == 0 else self.residual_masks[j - 1]",
        "mask = self.boundary_mask if j == 0 else _keep_every_key",
        "a BOUNDARY block of a residual variant keeps every key (its residual mask not run)",
    ),
    Mutant(
        "head_offset_dropped",
        "svgen/runtime/steps.py",
        "return self.first_piece + jnp.minimum(self.step, self.count - 1)",
        "return jnp.minimum(self.step, self.count - 1)",
        "a head walking its pieces per head starts at piece 0, not its pattern's first",
    ),
    Mutant(
        "identity_positions",
        "svgen/runtime/calls.py",
        "    if lay.is_identity:\n        return lambda x: x\n    if lay.moves_by_reshape:",
        "    if True:\n        return lambda x: x\n    if lay.moves_by_reshape:",
        "XLA's move of a head into its kernel order (and back) leaves tokens where they are",
    ),
    Mutant(
        "padding_keys_kept",
        "svgen/runtime/forward.py",
        "return keep & (k_pos < shape.seq_len) if padding else keep",
        "return keep",
        "the forward kernel attends the padding keys past the sequence in its last kv tile",
    ),
    Mutant(
        "online_rescale_dropped",
        "svgen/runtime/softmax.py",
        "acc_next = lanes(alpha, shape.acc_width) * acc_prev + pv",
        "acc_next = acc_prev + pv",
        "the online softmax does not rescale its accumulator when a row's max grows",
    ),
    Mutant(
        "segments_ignored",
        "svgen/runtime/forward.py",
        "keep = keep & same_segment(r.id_refs, block.rows, block.cols)",
        "keep = keep",
        "the forward kernel attends across run-time segments in a block that spans them",
    ),
    Mutant(
        "dq_unscaled",
        "svgen/runtime/backward.py",
        "dq_ref[...] = (acc[...] * sm_scale).astype(dq_ref.dtype)",
        "dq_ref[...] = acc[...].astype(dq_ref.dtype)",
        "the separate dq walk forgets sm_scale",
    ),
    Mutant(
        "fused_dq_unscaled",
        "svgen/runtime/backward.py",
        "        dk, dv, dq = walk_dkv(fused_dq=True)\n"
        "        return (dq[:, :q_len] * sm_scale).astype(qp.dtype), dk[:, cut], dv[:, cut]",
        "        dk, dv, dq = walk_dkv(fused_dq=True)\n"
        "        return (dq[:, :q_len]).astype(qp.dtype), dk[:, cut], dv[:, cut]",
        "jax.grad's dq (the dk/dv walk's fused dq) forgets sm_scale",
    ),
    Mutant(
        "empty_rows_nan",
        "svgen/runtime/forward.py",
        "inv = jnp.where(seen, 1.0 / jnp.where(seen, l, 1.0), 0.0)",
        "inv = 1.0 / l",
        "rows with no allowed key divide by zero instead of being 0",
    ),
    Mutant(
        "padding_block_full",
        "svgen/analysis/tables.py",
        "        last[last == TileKind.FULL] = TileKind.BOUNDARY\n",
        "        pass\n",
        "the analysis leaves FULL the blocks of the last key block that hold padding keys",
    ),
    Mutant(
        "abs_dropped",
        "svgen/analysis/mask_code.py",
        'return f"jnp.abs({strip_group(self.integer(e.args[0]))})"',
        'return f"({strip_group(self.integer(e.args[0]))})"',
        "the mask printer writes abs(x) as x",
    ),
    Mutant(
        "ring_slots_identity",
        "svgen/runtime/chunks.py",
        "    return slot_to_video(k_pos, sink, wrap, before, after, jnp)\n",
        "    return k_pos\n",
        "a rolling cache's masked blocks read each slot as the video token of its own number",
    ),
)


def _copy_repository(repo: pathlib.Path, into: pathlib.Path, tests: pathlib.Path | None) -> None:
    """The files git tracks in `repo` (and untracked ones it does not ignore), then `tests` in
    place of tests/ when given; this checkout's .venv and .gpu-aot linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = repo / name
        if not source.is_file() or (tests is not None and name.startswith("tests/")):
            continue
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, into / name)
    if tests is not None:
        shutil.copytree(tests, into / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for linked in (".venv", ".gpu-aot"):
        if (REPO / linked).exists():
            (into / linked).symlink_to(REPO / linked)
    # svgen finds the repository's top by its .git (the generated files' header paths)
    subprocess.run(["git", "init", "-q"], cwd=into, check=True)


def _mutate(copy: pathlib.Path, mutant: Mutant) -> str | None:
    """Apply the edit in the copy; None, or why it does not apply."""
    path = copy / mutant.path
    text = path.read_text()
    found = text.count(mutant.old)
    if found != 1:
        return f"{mutant.path}: the text to replace is found {found} times, not once"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def run(mutant: Mutant, repo: pathlib.Path, tests: pathlib.Path | None, selection: list[str]):
    """Break svgen in a scratch copy, run the tests there: {name, outcome, seconds, first}."""
    with tempfile.TemporaryDirectory(prefix=f"svgen-mutant-{mutant.name}-") as tmp:
        copy = pathlib.Path(tmp)
        _copy_repository(repo, copy, tests)
        why = _mutate(copy, mutant)
        if why is not None:
            return {"name": mutant.name, "outcome": "not applied", "why": why}
        env = {**os.environ, "PYTHONPATH": str(copy), "SVGEN_CACHE_DIR": str(copy / ".cache")}
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-n", "2", "-p", "no:cacheprovider"]
            + selection,
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - start
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
    outcome = {0: "survived", 1: "killed"}.get(done.returncode, f"error {done.returncode}")
    if outcome.startswith("error"):
        failed = failed or done.stdout.strip().splitlines()[-1:]
    return {"name": mutant.name, "outcome": outcome, "seconds": round(seconds), "first": failed[:1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these faults only")
    parser.add_argument("--repo", type=pathlib.Path, default=REPO, help="the tree to copy")
    parser.add_argument("--tests", type=pathlib.Path, help="this tests/ tree instead of its own")
    parser.add_argument("--list", action="store_true", help="name the faults and stop")
    parser.add_argument("selection", nargs="*", help="test files or node ids (default: all)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name}: {m.fault} ({m.path})")
        return 0 if args.list else 2
    tests = None if args.tests is None else args.tests.resolve()
    for mutant in chosen:
        result = run(mutant, args.repo.resolve(), tests, args.selection)
        where = result.get("why") or " ".join(result.get("first", []))
        seconds = f" in {result['seconds']} s" if "seconds" in result else ""
        print(f"{result['name']}: {result['outcome']}{seconds} {where}".rstrip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
