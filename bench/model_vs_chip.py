"""The static model (`svgen cost`) held against the chip: for every (spec, tiling) that a
chip run timed, the model's forward time at that tiling, their ratio, and how well the model
ranks the pairs (Spearman's rho) and predicts them (share within +-25 %).

    PYTHONPATH=. python bench/model_vs_chip.py bench/results/v5e_tune_shipped.json \
        [--json out/model_vs_chip.json] [--target v5e]

The chip file is what bench/tune_shipped.py writes ({"chip", "commit", "specs": {name:
[{"tiling", "ms", "error"}]}}). Runs on a CPU host: the model compiles each kernel with
libtpu ahead of time and reads its schedule; its per-path costs are cached (~/.cache/svgen),
so a rerun takes seconds. Prints a markdown table (stdout), progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from svgen.runtime import libtpu_env

libtpu_env.prepare()

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from svgen.analysis import analyze  # noqa: E402
from svgen.estimate import cost  # noqa: E402
from svgen.chip import measured_tune  # noqa: E402
from svgen.estimate.tpu_schedule import ensure_dump_flags  # noqa: E402
from svgen.spec import load_spec  # noqa: E402

#: A prediction "holds" when the chip's time is within this fraction of the model's.
WITHIN = 0.25


def chip_pairs(chip_file: pathlib.Path) -> list[tuple[str, tuple[int, ...], float]]:
    """(spec name, tiling, chip ms) for every trial the chip timed (errors left out)."""
    data = json.loads(chip_file.read_text())
    return [
        (name, tuple(trial["tiling"]), trial["ms"])
        for name, trials in data["specs"].items()
        for trial in trials
        if trial["ms"] is not None
    ]


def model_ms(spec_path: str, tiling: tuple[int, ...], target: str) -> float:
    """The model's forward time of the spec at `tiling` on `target` (its `svgen cost` figure)."""
    spec = measured_tune.with_tiling(load_spec(spec_path, chip=target), tiling)
    plan = analyze(spec, target_name=target)
    return cost.cost_plan(plan, spec_path, chunks=False).ms


def summary(rows: list[dict]) -> dict:
    chip = np.array([r["chip_ms"] for r in rows])
    model = np.array([r["model_ms"] for r in rows])
    ratio = chip / model
    return {
        "pairs": len(rows),
        "spearman_rho": float(spearmanr(chip, model).statistic),
        "within_25pct": int(np.sum(np.abs(ratio - 1.0) <= WITHIN)),
        "chip_over_model": {
            "min": float(ratio.min()),
            "median": float(np.median(ratio)),
            "max": float(ratio.max()),
        },
    }


def _tiling_label(t: tuple[int, ...]) -> str:
    one_level = (t[0], t[1]) == (t[2], t[3])
    return f"{t[0]}x{t[1]}" + ("" if one_level else f" / {t[2]}x{t[3]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chip_files", nargs="+", type=pathlib.Path)
    parser.add_argument("--target", default="v5e")
    parser.add_argument("--json")
    args = parser.parse_args()
    ensure_dump_flags()
    rows, commits = [], set()
    for chip_file in args.chip_files:
        commits.add(json.loads(chip_file.read_text()).get("commit"))
        for name, tiling, chip in chip_pairs(chip_file):
            print(f"  model: {name} {_tiling_label(tiling)}", file=sys.stderr, flush=True)
            model = model_ms(f"specs/{name}.yaml", tiling, args.target)
            rows.append({"spec": name, "tiling": list(tiling), "chip_ms": chip, "model_ms": model})
    result = {"target": args.target, "chip_commits": sorted(map(str, commits)), "rows": rows}
    result["summary"] = summary(rows)
    print(f"| spec | tiling | chip ms ({args.target}) | model ms | chip / model |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['spec']} | {_tiling_label(tuple(r['tiling']))} | {r['chip_ms']:.2f} "
            f"| {r['model_ms']:.2f} | {r['chip_ms'] / r['model_ms']:.2f} |"
        )
    s = result["summary"]
    print(
        f"\n{s['pairs']} pairs: Spearman rho {s['spearman_rho']:.2f}; "
        f"{s['within_25pct']} of {s['pairs']} within +-{WITHIN:.0%}; chip / model "
        f"{s['chip_over_model']['min']:.2f} to {s['chip_over_model']['max']:.2f} "
        f"(median {s['chip_over_model']['median']:.2f})"
    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
