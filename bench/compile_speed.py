"""Compile time and peak memory of svgen's analysis + code generation, as a table.

Each case runs in a fresh subprocess so its peak RSS is its own (the baseline of an idle
Python with svgen, jax and sympy imported is printed too). Two tables:

* compile: the shipped specs and 400K-token (111 x 45 x 80) and 1.6M-token (111 x 90 x 160)
  variants of the Wan spatial/temporal/band heads, analysis + code generation;
* bounded analysis at 1.74M tokens (121 x 90 x 160): every built-in primitive alone and with
  a first-frame anchor, in both layouts, block-causal and windows written as `expr`, and
  specs that must end in an error (time until the error). Wall time of
  `svgen.analysis.analyze(spec)` and the process's peak RSS (interpreter included).

    python bench/compile_speed.py                  # both tables
    python bench/compile_speed.py --quick          # shipped specs only
    python bench/compile_speed.py --bounded        # the 1.74M-token table only
    python bench/compile_speed.py --bounded -k 3d  # ... only cases whose label contains 3d
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
    from svgen.spec.errors import SpecError
    from svgen.spec import parse_spec

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        spec = parse_spec(spec_text, source=f"{label}.yaml")
        t1 = time.perf_counter()
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
    if tiling:  # a tiling replaces the spec's (its compute blocks may not divide it)
        spec["tiling"] = dict(tiling)
    return yaml.safe_dump(spec, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="shipped specs only")
    parser.add_argument("--bounded", action="store_true", help="the 1.74M-token table only")
    parser.add_argument("-k", default="", help="only cases whose label contains this")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per bounded case")
    parser.add_argument("--child", nargs=2, metavar=("LABEL", "SPEC_TEXT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--bounded-child", nargs=2, metavar=("LABEL", "SPEC_TEXT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        _child(args.child[1], args.child[0])
        return
    if args.bounded_child:
        _bounded_child(args.bounded_child[1], args.bounded_child[0])
        return
    if not args.bounded:
        _compile_table(args)
    if not args.quick:
        cases = [(label, text) for label, text in bounded_cases() if args.k in label]
        rows = [_run_child("--bounded-child", label, text, args.timeout) for label, text in cases]
        _bounded_table(rows)
        print(f"\nIdle interpreter (svgen.analysis imported): {_idle_baseline():.0f} MiB peak RSS.")


def _compile_table(args) -> None:
    cases = [(p.stem, p.read_text()) for p in sorted((REPO / "specs").glob("*.yaml"))]
    if not args.quick:
        for label, base, geometry, tiling in VARIANTS:
            text = (REPO / "specs" / f"{base}.yaml").read_text()
            cases.append((label, _override(text, geometry, tiling, label)))
    rows = [_run_child("--child", label, text) for label, text in cases if args.k in label]
    header = (
        "| case | tokens | tile | full / boundary / empty | density | visited "
        "| grid steps | piece | SMEM table B | analyze s | render s | peak RSS MiB (idle) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        if "error" in r or "failed" in r:
            print(f"| {r['case']} | {r.get('failed') or 'error: ' + r['error']} |")
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


# -- bounded analysis at 1.74M tokens -------------------------------------------------------

VIDEO_174 = {"frames": 121, "height": 90, "width": 160}  # 1,742,400 tokens
BIG_TILES = {"block_q": 2048, "block_kv": 2048, "compute_q": 1024, "compute_kv": 512}
SMALL_TILES = {"block_q": 512, "block_kv": 512}
ANCHOR = {"first_frame": {"frames": 1}}
PRIMITIVES = [  # (label, mask term, text tokens)
    ("first_frame", ANCHOR, 0),
    ("window_frames", {"spatial_window": {"frames": 1}}, 0),
    ("window_3d", {"spatial_window": {"frames": 3, "rows": 12, "cols": 20}}, 0),
    ("temporal", {"temporal_stride": {"rows": 0, "cols": 0}}, 0),
    ("temporal_strided", {"temporal_stride": {"rows": 1, "cols": 1, "stride": 2, "frames": 8}}, 0),
    ("band", {"band": {"density": 0.1}}, 0),
    ("prefix", {"prefix": {"tokens": 14400}}, 0),
    ("text", {"text": {}}, 512),
    ("causal_frames", {"causal_frames": {}}, 0),
    ("block_causal", {"block_causal": {"frames": 3}}, 0),
]
EXPRS = [  # (label, mask term, text tokens): user predicates
    ("expr_block_causal", {"expr": "f_k // 3 <= f_q // 3"}, 0),
    (
        "expr_block_causal_text",
        {"expr": "f_k // 3 <= f_q // 3 or is_text_q or is_text_k"},
        512,
    ),
    (
        "expr_window_3d",
        {"expr": "abs(f_q - f_k) <= 3 and abs(h_q - h_k) <= 12 and abs(w_q - w_k) <= 20"},
        0,
    ),
    # Sliding Tile Attention: a window of whole (3, 8, 8) coordinate tiles (not a built-in).
    (
        "expr_sta_tiles",
        {
            "expr": "abs(f_q // 3 - f_k // 3) <= 1 and abs(h_q // 8 - h_k // 8) <= 1 and "
            "abs(w_q // 8 - w_k // 8) <= 1"
        },
        0,
    ),
]
STA_WINDOWS = [  # (label, mask term): STA-like 3-D windows as built-ins (Wan/Hunyuan sizes)
    ("sta_window_small", {"spatial_window": {"frames": 1, "rows": 8, "cols": 8}}),
    ("sta_window_large", {"spatial_window": {"frames": 5, "rows": 24, "cols": 40}}),
]


def _bounded_spec(label, mask, order, tiling, text=0, geometry=VIDEO_174, heads=10) -> str:
    import yaml

    spec = {
        "svgen": 1,
        "name": label,
        "geometry": dict(geometry, text_tokens=text, text_position="last"),
        "attention": {"heads": heads, "head_dim": 128, "dtype": "bfloat16"},
        "layout": order,
        "mask": mask,
        "tiling": tiling,
    }
    return yaml.safe_dump(spec, sort_keys=False)


def bounded_cases() -> list[tuple[str, str]]:
    """(label, spec text) of the 1.74M-token table."""
    cases = []
    for order, short in (("frame_major", "fm"), ("temporal_major", "tm")):
        for label, term, text in PRIMITIVES:
            for anchored in (False, True):
                if anchored and label == "first_frame":
                    continue
                mask = {"any_of": [ANCHOR, term]} if anchored else term
                name = f"{label}{'_ff' if anchored else ''}_{short}"
                cases.append((name, _bounded_spec(name, mask, order, BIG_TILES, text)))
    for label, term, text in PRIMITIVES[1:]:  # frame-major, anchored, 512 x 512 tiles
        name = f"{label}_ff_fm_t512"
        mask = {"any_of": [ANCHOR, term]}
        cases.append((name, _bounded_spec(name, mask, "frame_major", SMALL_TILES, text)))
    for label, term in STA_WINDOWS:
        for tiling, suffix in ((BIG_TILES, ""), (SMALL_TILES, "_t512")):
            name = f"{label}_fm{suffix}"
            cases.append((name, _bounded_spec(name, term, "frame_major", tiling)))
    window = {"any_of": [ANCHOR, PRIMITIVES[2][1]]}  # aligned: exact pair counts too
    aligned = dict(BIG_TILES, align="balanced")
    name = "window_3d_ff_fm_balanced"
    cases.append((name, _bounded_spec(name, window, "frame_major", aligned)))
    for label, term, text in EXPRS:
        name = f"{label}_fm"
        cases.append((name, _bounded_spec(name, term, "frame_major", BIG_TILES, text)))
    temporal = {"any_of": [ANCHOR, {"temporal_stride": {"rows": 0, "cols": 0}}]}
    errors = [  # specs that must end in an error: (label, mask, order, tiling, geometry)
        ("error_smem_temporal_fm_t512", temporal, "frame_major", SMALL_TILES, VIDEO_174),
        (
            "error_tile_pairs_temporal_t128",
            temporal,
            "frame_major",
            {"block_q": 128, "block_kv": 128},
            VIDEO_174,
        ),
        (
            "error_vmem_4096",
            temporal,
            "frame_major",
            {"block_q": 4096, "block_kv": 4096},
            VIDEO_174,
        ),
        (
            "error_smem_temporal_400k_t128",
            temporal,
            "frame_major",
            {"block_q": 128, "block_kv": 128},
            LONG_VIDEO,
        ),
    ]
    for name, mask, order, tiling, geometry in errors:
        cases.append((name, _bounded_spec(name, mask, order, tiling, geometry=geometry)))
    return cases


def _bounded_child(spec_text: str, label: str) -> None:
    """Runs in the subprocess: analyze one spec (no code generation), print one JSON line."""
    import svgen.analysis  # noqa: F401  (imports before the baseline: jax, sympy, ...)
    from svgen.analysis import analyze
    from svgen.spec.errors import SpecError
    from svgen.spec import parse_spec

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = {"case": label}
    try:
        plan = analyze(parse_spec(spec_text, source=f"{label}.yaml"))
    except SpecError as err:
        out["error"] = str(err)
    else:
        p = plan.patterns[0]
        c = p.classification
        out.update(
            tokens=p.layout.seq_len,
            tile=f"{p.grid.block_q}x{p.grid.block_kv}/{p.compute_grid.block_q}x"
            f"{p.compute_grid.block_kv}",
            tiles=p.tile_counts(),
            density=p.density,
            density_upper=c.kept_pairs_upper / p.total_pairs,
            exact=c.density_is_exact,
            mask=type(p.mask).__name__,
        )
    out["analyze_s"] = time.perf_counter() - t0
    out["baseline_mib"] = baseline / 1024
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _bounded_table(rows) -> None:
    print()
    print("Bounded analysis, 121 x 90 x 160 = 1,742,400 video tokens (`analyze(spec)`):")
    print()
    header = (
        "| case | tile / compute | full / boundary / empty tiles | density | analyze s "
        "| peak RSS MiB (idle) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        if "failed" in r:
            print(f"| {r['case']} | {r['failed']} after {r['analyze_s']:.0f} s | | | | |")
            continue
        cost = f"{r['analyze_s']:.2f} | {r['peak_mib']:.0f} ({r['baseline_mib']:.0f})"
        if "error" in r:
            words = r["error"].split(": ", 2)[-1]
            words = words if len(words) < 90 else words[:87] + "..."
            print(f"| {r['case']} | error: {words} | | | {cost} |")
            continue
        t = r["tiles"]
        density = (
            f"{r['density']:.6f}"
            if r["exact"]
            else f"{r['density']:.4f} - {r['density_upper']:.4f} (bounds)"
        )
        print(
            f"| {r['case']} | {r['tile']} | {t['full']:,} / {t['boundary']:,} / "
            f"{t['empty']:,} | {density} | {cost} |"
        )


def _run_child(flag: str, label: str, text: str, timeout: float | None = None) -> dict:
    """One case in a fresh interpreter; a case that is killed or runs past `timeout` seconds
    gets a row saying so instead of ending the run."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, __file__, flag, label, text],
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout,
        )
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as err:
        if isinstance(err, subprocess.TimeoutExpired):
            why = "timed out"
        else:  # e.g. -9: killed, out of memory
            why = f"failed (exit status {err.returncode})"
        print(f"  {label}: {why}", file=sys.stderr)
        return {"case": label, "failed": why, "analyze_s": time.perf_counter() - t0}
    print(f"  measured {label}", file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _idle_baseline() -> float:
    """Peak RSS of a fresh interpreter that only imports svgen's analysis, MiB."""
    code = (
        "import resource, svgen.analysis, svgen.spec; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


if __name__ == "__main__":
    main()
