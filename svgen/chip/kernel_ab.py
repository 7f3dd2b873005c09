"""A kernel change, before and after, on the attached TPU, in one process.

    python -m svgen.chip.kernel_ab SPEC[@BQxBKV[/CQxCKV]]... [--set NAME=VALUE]...
        [--runtime MODULE.NAME=VALUE]... [--variant MODULE.NAME=VALUE[,...]]...
        [--backward] [--iters N] [--no-splash] [--json FILE] [--target CHIP] [--interpret]

"After" is the module `svgen compile` writes today for the chip; "before" is the same module
with the named constants set back (for example `--set MXU_WIDTH=256`: the row sum from
[V | 1], as every chip ran it before v5e learned to take it across lanes), and with the named
svgen.runtime / svgen.core constants set while it is imported and traced (for example
`--runtime straight.MAX_WORDS=2`: two straight-line BOUNDARY bodies a pattern instead of
eight, a smaller kernel program). Each `--variant` is one more "before", its svgen.runtime /
svgen.core constants comma-separated (`--variant straight.MAX_WORDS=0 --variant
straight.MAX_WORDS=2`: two kernels against today's in one process, today's compiled once).
They are timed in turn, each the median of `--iters` calls after two warm-ups (first calls
timed alone), both checked on sampled rows against a float32 reference. Splash given the same
mask and dense Splash at its best blocks are timed beside them by `svgen bench`'s engine
(svgen.chip.chip_bench), unless `--no-splash`. A table goes to stdout; `--json` keeps every
figure, saved after each spec, with the chip, versions and commit.

The constants' parsing and setting (`parse_runtime_setting`, `runtime_overrides`) and the
SPEC@TILING items (`parse_item`) are shared with svgen.chip.kernel_size and
svgen.chip.path_isolation.

Without a TPU it stops with one line (exit 2), unless `--interpret` (Pallas's interpreter
on the CPU: checks the script, times nothing that means anything).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import pathlib
import re
import sys
import tempfile
import time

from svgen.chip import chip_bench, measured_tune
from svgen.chip.measured_tune import parse_tiling
from svgen.chip.splash_mask import head_patterns
from svgen.spec import load_spec


def parse_item(text: str):
    path, _, tiling = text.partition("@")
    return path, (parse_tiling(tiling) if tiling else None)


def parse_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (a module constant), got {text!r}")
    return name, value


def parse_runtime_setting(text: str) -> tuple[str, str, object]:
    """MODULE.NAME=VALUE: a constant of svgen.runtime.MODULE (or svgen.core.MODULE) and a
    Python literal."""
    import ast

    target, sep, value = text.partition("=")
    module, dot, name = target.partition(".")
    if not (
        sep and dot and re.fullmatch(r"[a-z_]+", module) and re.fullmatch(r"[A-Z][A-Z0-9_]*", name)
    ):
        raise argparse.ArgumentTypeError(
            "expected MODULE.NAME=VALUE (a constant of svgen.runtime.MODULE or "
            f"svgen.core.MODULE), got {text!r}"
        )
    try:
        return module, name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"{text!r}: the value must be a Python literal") from None


def parse_variant(text: str) -> tuple:
    """MODULE.NAME=VALUE[,MODULE.NAME=VALUE...]: one more "before" kernel's runtime constants."""
    return tuple(parse_runtime_setting(part.strip()) for part in text.split(","))


def variant_label(runtime) -> str:
    return ",".join(f"{m}.{n}={v!r}" for m, n, v in runtime)


def kernel_module(name: str):
    """svgen.runtime.NAME (the kernels), else svgen.core.NAME (the format they share with the
    compiler: straight.MAX_WORDS lives there); an unknown name is an error."""
    for package in ("svgen.runtime", "svgen.core"):
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
    raise SystemExit(f"neither svgen.runtime nor svgen.core has a module {name!r}")


@contextlib.contextmanager
def runtime_overrides(settings):
    """Kernel constants (kernel_module) set to the given values inside the block, restored
    after (an unknown module or constant is an error: a typo must not time the same kernel
    twice)."""
    saved = []
    try:
        for module_name, name, value in settings:
            module = kernel_module(module_name)
            if not hasattr(module, name):
                raise SystemExit(f"{module.__name__} has no constant {name}")
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def import_as(path: pathlib.Path, name: str):
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    loader_spec.loader.exec_module(module)
    return module


def before_module(spec, target: str, settings, folder: pathlib.Path):
    """The module compiled for `target` with each NAME = VALUE line of `settings` rewritten
    (an unknown name is an error: a typo must not time the same module twice)."""
    from svgen import codegen

    plan, _ = chip_bench.compile_module(spec, target, folder)
    path = folder / codegen.module_filename(spec.name, plan.backend)
    text = path.read_text()
    for name, value in settings:
        text, count = re.subn(rf"^{name} = .*$", f"{name} = {value}", text, flags=re.M)
        if count != 1:
            raise SystemExit(f"kernel_ab: the module has no constant {name}")
    before = folder / f"before_{path.name}"
    before.write_text(text)
    return plan, import_as(before, f"_kernel_ab_before_{spec.name}_{abs(hash(str(folder)))}")


def time_before(spec, target, settings, options, progress, runtime=()) -> dict:
    """The "before" module timed: its constants `settings`, and the kernel constants
    `runtime` in force while it is imported and traced (its kernels are traced in the first
    calls, under the overrides too)."""
    with tempfile.TemporaryDirectory(prefix="kernel-ab-") as folder, runtime_overrides(runtime):
        plan, module = before_module(spec, target, settings, pathlib.Path(folder))
        assignment = head_patterns(module)
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        rows = chip_bench.sampled_rows(int(module.SEQ_LEN), options.check_rows, options.seed)
        reference = chip_bench.reference_rows(plan, assignment, q, k, v, rows)
        forward = chip_bench.svgen_forward(module, assignment, options.interpret)
        result = {}
        for direction in ["forward"] + (["backward"] if options.backward else []):
            fn = forward if direction == "forward" else chip_bench.gradient_of(forward)
            progress(f"{spec.name}: before {direction}")
            timing, out = chip_bench.time_calls(
                fn, (q, k, v), warmup=options.warmup, iters=options.iters, clock=time.perf_counter
            )
            entry = timing.to_json()
            if direction == "forward" and spec.select is None:  # select: not the mask alone
                entry["max_error"] = chip_bench.max_error(out, reference, rows)
            result[direction] = entry
        return result


def ms(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def rows(result: dict, direction: str) -> list[str]:
    """One table row a "before" kernel: its time, today's, and Splash given the mask."""
    after = result.get(f"svgen_{direction}", {}).get("median_ms")
    masked = result.get(f"splash_mask_{direction}", {}).get("median_ms")
    lines = []
    for label, before_result in result["variants"].items():
        entry = before_result.get(direction, {})
        before = entry.get("median_ms")
        if before is None:
            before = entry.get("error", "-")
        gain = f"{before / after:.3f}x" if after and isinstance(before, float) else "-"
        lines.append(
            f"| {result['spec']} | {direction} | {label} | {ms(before)} | {ms(after)} | {gain} "
            f"| {ms(masked)} |"
        )
    return lines


def time_variant(spec, chip, settings, options, progress, runtime) -> dict:
    """time_before, a failure (a compile refused, VMEM exceeded) recorded, not raised: the
    other kernels of the process are still timed."""
    try:
        return time_before(spec, chip, settings, options, progress, runtime)
    except Exception as exc:  # noqa: BLE001 - any failure of one kernel is that kernel's result
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        progress(f"{spec.name}: failed: {message[:200]}")
        return {"forward": {"error": message[:500]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", type=parse_item, metavar="SPEC[@TILING]")
    parser.add_argument("--set", dest="settings", type=parse_setting, action="append", default=[])
    parser.add_argument(
        "--runtime", dest="runtime", type=parse_runtime_setting, action="append", default=[]
    )
    parser.add_argument(
        "--variant",
        dest="variants",
        type=parse_variant,
        action="append",
        default=[],
        help="one more 'before' kernel: MODULE.NAME=VALUE[,MODULE.NAME=VALUE...]",
    )
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-splash", action="store_true", help="time svgen's kernels alone")
    parser.add_argument(
        "--dense-blocks",
        type=int,
        nargs=3,
        metavar=("Q", "KV", "KV_COMPUTE"),
        help="dense Splash at these blocks only (as svgen bench --dense-blocks)",
    )
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--target", default=None, help="the chip to compile for (--interpret only)")
    parser.add_argument("--interpret", action="store_true")
    args = parser.parse_args(argv)
    if not args.settings and not args.runtime and not args.variants:
        parser.error(
            "nothing to compare: give --set NAME=VALUE, --runtime MODULE.NAME=VALUE or --variant "
            "(this script compares kernels; tilings are compared on the chip by "
            "`svgen tune SPEC --measure`, or one at a time by `svgen bench SPEC --tiling T`)"
        )
    chip = chip_bench.script_chip("kernel_ab", args.interpret, args.target)
    if chip is None:
        return 2
    options = chip_bench.Options(
        iters=args.iters,
        backward=args.backward,
        interpret=args.interpret,
        splash=not args.no_splash,
        **({"dense_blocks": (tuple(args.dense_blocks),)} if args.dense_blocks else {}),
    )
    progress = chip_bench.script_progress("kernel_ab")
    # (label, module constants, runtime constants) of each "before" kernel
    befores = []
    if args.settings or args.runtime:
        befores.append(("before", args.settings, tuple(args.runtime)))
    befores += [(variant_label(runtime), [], runtime) for runtime in args.variants]
    report = {
        "chip": chip,
        "settings_before": dict(args.settings),
        "runtime_before": {f"{m}.{n}": v for m, n, v in args.runtime},
        "variants": [label for label, _, _ in befores],
        "specs": [],
    }
    report.update(chip_bench.versions() if not args.interpret else {})
    report["commit"] = chip_bench.commit()
    report["source_digest"] = chip_bench.source_digest()
    dense = chip_bench.SplashDense(chip_bench.cache_dir() if not args.interpret else None)

    def keep(result: dict) -> None:
        """The spec being timed, its figures so far, saved: a run stopped part way (a time
        limit on the chip) keeps what it measured."""
        report["specs"][-1] = result
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")

    for path, tiling in args.items:
        spec = load_spec(path, chip=chip)
        if tiling is not None:
            spec = measured_tune.with_tiling(spec, tiling)
        report["specs"].append({"spec": spec.name})
        result = chip_bench.bench_spec(
            spec, chip, options, progress=progress, dense=dense, on_entry=keep
        )
        result["variants"] = {}
        for label, settings, runtime in befores:
            progress(f"{spec.name}: {label}")
            result["variants"][label] = time_variant(
                spec, chip, settings, options, progress, runtime
            )
            result["before"] = next(iter(result["variants"].values()))
            keep(result)
    print(
        "| spec | direction | before | before ms | today ms | before / today "
        "| Splash given the mask ms |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for result in report["specs"]:
        for direction in ["forward"] + (["backward"] if args.backward else []):
            print("\n".join(rows(result, direction)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
