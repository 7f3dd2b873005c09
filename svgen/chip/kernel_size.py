"""The size of a spec's forward kernel program on a TPU: its final bundles, as libtpu
compiles it for the target on this host (AOT, no chip needed).

    python -m svgen.chip.kernel_size SPEC[@BQxBKV[/CQxCKV]]... [--target v5e]
        [--runtime MODULE.NAME=VALUE]... [--json FILE]

--runtime sets a constant of svgen.runtime.MODULE (or svgen.core.MODULE) while each module is
imported and compiled (for example straight.MAX_WORDS=2: at most two straight-line BOUNDARY
bodies a pattern; svgen.chip.kernel_ab's settings).
--json writes the counts with the commit, svgen's source digest and libtpu's version: the
figures `svgen report` reads (bench/results/v5e_program_sizes.json).

What the chip did with programs of each size: docs/measured.md, "The program-size cliff". A
program past the budget (Target.program_bundles) likely no longer fits the core's instruction
memory. Straight-line bodies, residual-mask variants and patterns all add code.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

from svgen.chip import chip_bench, measured_tune
from svgen.chip.kernel_ab import parse_item, parse_runtime_setting, runtime_overrides
from svgen.estimate import measure
from svgen.spec import load_spec


def kernel_bundles(spec, target: str, runtime=()) -> int:
    """The forward kernel's final bundles, compiled for `target` (`runtime`: kernel constants
    in force meanwhile, as kernel_ab takes them)."""
    with tempfile.TemporaryDirectory(prefix="kernel-size-") as folder, runtime_overrides(runtime):
        _, module = chip_bench.compile_module(spec, target, pathlib.Path(folder))
        return len(measure._compile(module, target).bundles)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", type=parse_item, metavar="SPEC[@TILING]")
    parser.add_argument("--target", default="v5e", choices=("v5e", "v6e", "v7x"))
    parser.add_argument("--runtime", type=parse_runtime_setting, action="append", default=[])
    parser.add_argument("--json", type=pathlib.Path, help="also write the counts here")
    args = parser.parse_args(argv)
    rows = []
    print("| spec | tiling | forward kernel bundles |")
    print("|---|---|---:|")
    for path, tiling in args.items:
        spec = load_spec(path, chip=args.target)
        if tiling is not None:
            spec = measured_tune.with_tiling(spec, tiling)
        start = time.monotonic()
        bundles = kernel_bundles(spec, args.target, tuple(args.runtime))
        t = spec.tiling
        name = f"{t.block_q}x{t.block_kv}/{t.cq}x{t.ckv}"
        print(f"| {spec.name} | {name} | {bundles:,} |", flush=True)
        runtime = {f"{module}.{const}": value for module, const, value in args.runtime}
        rows.append(
            {
                "source": str(path),
                "spec": spec.name,
                "tiling": name,
                "runtime": runtime,
                "bundles": bundles,
            }
        )
        print(
            f"kernel_size: {spec.name} compiled in {time.monotonic() - start:.0f} s",
            file=sys.stderr,
        )
    if args.json:
        report = {**chip_bench.script_report(args.target, interpret=True), "counted_on": "cpu"}
        report["libtpu"] = _libtpu_version()
        args.json.write_text(json.dumps({**report, "results": rows}, indent=1) + "\n")
    return 0


def _libtpu_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libtpu")
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
