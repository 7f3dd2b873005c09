"""`svgen inspect`: what the compiler found for a spec, in words or JSON, and optionally
its tile kinds as a .npy array and a picture of its tile map."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

from svgen.analysis import Plan
from svgen.cli.files import check_file_target
from svgen.cli.plan import fit_program, plan_spec
from svgen.report.inspect_text import inspect_lines
from svgen.spec.quoting import safe_text


def inspect_spec(args) -> int:
    # Before the analysis (seconds for a big spec): where the files go must exist.
    if args.tiles:
        check_file_target(pathlib.Path(args.tiles), "--tiles")
    if args.png:
        check_file_target(pathlib.Path(args.png), "--png")
    plan = plan_spec(args.spec, quiet=args.json, smem_budget=args.smem_budget, target=args.target)
    if args.tiles:
        _save_tiles(plan, args.tiles)
    if args.png:
        _write_pngs(plan, pathlib.Path(args.png))
    size = _program_size(plan, args)
    if args.json:
        summary = plan.summary()
        if size is not None:
            summary["program"] = size.to_json()
        print(json.dumps(summary, indent=2, sort_keys=False))
        return 0
    for line in inspect_lines(plan, args.spec):
        print(line)
    if size is not None:
        print(f"Program: {size.words()}")
    return 0


def _program_size(plan: Plan, args):
    """The forward kernel's program against its chip's budget, as `svgen compile` decides
    it (None: not a TPU plan, or --no-size-check); a kernel over budget whatever is left out
    is the compiler's error, raised here as there."""
    if plan.backend != "tpu" or args.no_size_check:
        return None
    from svgen import codegen

    _, _, size = fit_program(plan, lambda p: codegen.render(p, args.spec), args.spec, quiet=True)
    return size


def _save_tiles(plan: Plan, path: str) -> None:
    """The int8 tile kinds: [q blocks, kv blocks], or [patterns, ...] for several."""
    single = len(plan.patterns) == 1
    np.save(
        path,
        plan.kinds.astype(np.int8)
        if single
        else np.stack([p.kinds.astype(np.int8) for p in plan.patterns]),
        allow_pickle=False,
    )


def _write_pngs(plan: Plan, png: pathlib.Path) -> None:
    """A picture of each pattern's tile map: `png` itself for one pattern, else
    FILE_<pattern>.png beside it. Each file written is named on stderr (stdout may be the
    JSON report): with several patterns no file is named `png`, and nothing is written
    unsaid."""
    from svgen.report.pictures import write_tile_map_png

    single = len(plan.patterns) == 1
    for pattern in plan.patterns:
        path = png
        if not single:
            path = path.with_name(f"{path.stem}_{pattern.name}{path.suffix}")
        write_tile_map_png(pattern.kinds, path, title=_png_title(plan, pattern, single))
        which = "the tile map" if single else f"the tile map of pattern {pattern.name!r}"
        print(f"svgen: wrote {safe_text(str(path))} ({which})", file=sys.stderr)


def _png_title(plan: Plan, pattern, single: bool) -> str:
    s = pattern.summary()
    density = (
        f"density {s['density']:.4f}"
        if s["density_is_exact"]
        else f"density bounds {s['density_lower']:.4f} to {s['density_upper']:.4f}"
    )
    return (
        f"{plan.spec.name}{'' if single else ' / ' + pattern.name}: "
        f"{pattern.grid.block_q} x {pattern.grid.block_kv} tiles, "
        f"{pattern.layout.order}, {density}, "
        f"visited fraction {pattern.visited_fraction:.4f}"
    )
