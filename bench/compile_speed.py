"""Compile time and peak memory of svgen's analysis + code generation, as a table.

Each case runs in a fresh subprocess so its peak RSS is its own (the baseline of an idle
Python with svgen, jax and sympy imported is printed too). Cases: the shipped specs and
400K-token (111 x 45 x 80) and 1.6M-token (111 x 90 x 160) variants of the Wan
spatial/temporal/band heads.

    python bench/compile_speed.py            # all cases
    python bench/compile_speed.py --quick    # shipped specs only
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent

LONG_VIDEO = {"frames": 111, "height": 45, "width": 80}  # 399,600 tokens
VIDEO_2K = {"frames": 111, "height": 90, "width": 160}  # 1,598,400 tokens
VARIANTS = [  # (label, shipped spec, geometry overrides, tiling overrides)
    ("wan_spatial_400k", "wan21_720p_spatial", LONG_VIDEO, None),
    ("wan_temporal_400k", "wan21_720p_temporal", LONG_VIDEO, None),
    ("wan_band_400k", "wan21_720p_band", LONG_VIDEO, None),
    ("wan_spatial_400k_t128", "wan21_720p_spatial", LONG_VIDEO, {"block_q": 128, "block_kv": 128}),
    ("wan_band_400k_t128", "wan21_720p_band", LONG_VIDEO, {"block_q": 128, "block_kv": 128}),
    ("video2k_spatial_1m6", "wan21_720p_spatial", VIDEO_2K, None),
    ("video2k_temporal_1m6", "wan21_720p_temporal", VIDEO_2K, None),
    ("video2k_band_1m6", "wan21_720p_band", VIDEO_2K, None),
]


def _child(spec_text: str, label: str) -> None:
    """Runs in the subprocess: analyze + render one spec, print one JSON line."""
    from svgen import codegen
    from svgen.analysis import analyze
    from svgen.errors import SpecError
    from svgen.spec import parse_spec

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    spec = parse_spec(spec_text, source=f"{label}.yaml")
    t1 = time.perf_counter()
    try:
        plan = analyze(spec)
    except SpecError as err:  # e.g. tables over the SMEM budget: a result worth a row
        print(json.dumps({"case": label, "error": str(err)}))
        return
    t2 = time.perf_counter()
    files = codegen.render(plan, f"specs/{label}.yaml")
    t3 = time.perf_counter()
    s = plan.summary()
    print(
        json.dumps(
            {
                "case": label,
                "tokens": s["seq_len"],
                "tile": f"{s['block_q']}x{s['block_kv']}",
                # one entry per pattern: (name, layout, tiles, density, visited fraction)
                "patterns": [
                    (p.name, p.layout.order, p.tile_counts(), p.density, p.visited_fraction)
                    for p in plan.patterns
                ],
                "steps": s["grid_steps"],
                "slots": s["slots_per_piece"],
                "table_bytes": s["table_bytes"],
                "parse_s": t1 - t0,
                "analyze_s": t2 - t1,
                "render_s": t3 - t2,
                "out_bytes": sum(len(b) for b in files.values()),
                "baseline_mib": baseline / 1024,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def _override(text: str, geometry: dict | None, tiling: dict | None, label: str) -> str:
    import yaml

    spec = yaml.safe_load(text)
    spec["name"] = label
    if geometry:
        spec["geometry"] = dict(spec["geometry"], **geometry)
    if tiling:
        spec["tiling"] = dict(spec.get("tiling", {}), **tiling)
    return yaml.safe_dump(spec, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("LABEL", "SPEC_TEXT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[1], args.child[0])
        return
    cases = [(p.stem, p.read_text()) for p in sorted((REPO / "specs").glob("*.yaml"))]
    if not args.quick:
        for label, base, geometry, tiling in VARIANTS:
            text = (REPO / "specs" / f"{base}.yaml").read_text()
            cases.append((label, _override(text, geometry, tiling, label)))
    rows = []
    for label, text in cases:
        out = subprocess.run(
            [sys.executable, __file__, "--child", label, text],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  measured {label}", file=sys.stderr)
    header = (
        "| case | tokens | tile | full / boundary / empty | density | visited "
        "| grid steps | piece | SMEM table B | analyze s | render s | peak RSS MiB (idle) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | error: {r['error']} |")
            continue
        for i, (name, order, t, density, visited) in enumerate(r["patterns"]):
            case = r["case"] if len(r["patterns"]) == 1 else f"{r['case']} / {name} ({order})"
            shared = (
                (
                    f"{r['steps']:,} | {r['slots']} | {r['table_bytes']:,} | "
                    f"{r['analyze_s']:.3f} | {r['render_s']:.3f} | "
                    f"{r['peak_mib']:.0f} ({r['baseline_mib']:.0f})"
                )
                if i == 0
                else "〃 | 〃 | 〃 | 〃 | 〃 | 〃"
            )
            print(
                f"| {case} | {r['tokens']:,} | {r['tile']} | {t['full']:,} / "
                f"{t['boundary']:,} / {t['empty']:,} | {density:.4f} | {visited:.4f} | "
                f"{shared} |"
            )


if __name__ == "__main__":
    main()
