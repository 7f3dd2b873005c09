"""Tilings of the shipped specs chosen on the attached TPU: `svgen tune --measure` for every
spec in one process (a chip is opened once), forward only, over a short list of candidates.

    PYTHONPATH=. python bench/tune_shipped.py --json out/tune.json [--budget 45] [SPEC...]

Prints a table per spec (stdout) and writes every trial as JSON after each spec, so an
interrupted run keeps what it timed. Needs a TPU (svgen.chip.chip_bench.attached_chip).
"""

from __future__ import annotations

import argparse
import glob
import json
import pathlib
import sys

from svgen.runtime import libtpu_env

libtpu_env.prepare()

from svgen.chip import chip_bench, measured_tune  # noqa: E402
from svgen.spec import load_spec  # noqa: E402

#: 1024 x 1024 tiles of two compute blocks first (on a v5e 1.10x faster than one block,
#: docs/measured.md), then one-level tiles: tiles of four or more compute blocks ran 1.2-5x
#: slower there.
CANDIDATES = (
    (1024, 1024, 1024, 512),
    (1024, 1024, 512, 1024),
    (1024, 1024, 1024, 1024),
    (512, 1024, 512, 512),
    (512, 512, 512, 512),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*")
    parser.add_argument("--json", required=True)
    parser.add_argument("--budget", type=float, default=45.0, help="seconds per spec")
    args = parser.parse_args()
    chip = chip_bench.attached_chip()
    env = chip_bench.versions()
    report = {"chip": chip, "versions": env, "commit": chip_bench.commit(), "specs": {}}
    for path in args.specs or sorted(glob.glob("specs/*.yaml")):
        spec = load_spec(path, chip=chip)
        trials = measured_tune.tune(
            spec,
            chip,
            backward=False,
            budget_s=args.budget,
            env=env,
            tilings=CANDIDATES,
            own=False,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        print(f"\n{spec.name}")
        print("\n".join(measured_tune.format_table(trials, chip, False)), flush=True)
        report["specs"][spec.name] = [
            {"tiling": list(t.tiling), "ms": t.ms, "error": t.error} for t in trials
        ]
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
