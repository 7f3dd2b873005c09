"""The `svgen` command: compile specs into generated/, check them, inspect them.

`svgen schema` prints the JSON Schema of spec files (svgen.schema.json, for editors).

Exit status: 0 success; 1 `--check` (or `--diff`, which implies it) found stale or
hand-edited files; 2 bad input (a spec error, printed as file:line:column: key: message,
without a traceback; or `cost` without libtpu installed). Warnings about likely mistakes
(svgen.report.lint) go to stderr and change neither the exit status nor the files. Nothing is
written unless every spec compiled, and never with --check or --diff; never over a file that
another existing spec generated (its header names its spec) or that svgen did not write.
"""

from __future__ import annotations

import argparse
import os
import sys

from svgen.chip.measured_tune import parse_tiling
from svgen.cli.bench import bench_specs, parse_program, tune_measured
from svgen.cli.compile import compile_specs
from svgen.cli.cost import NO_LIBTPU, cost_spec
from svgen.cli.cost import libtpu_installed as _libtpu_installed
from svgen.cli.fingerprint import fingerprint_specs
from svgen.cli.inspect import inspect_spec
from svgen.cli.report import report_pages
from svgen.cli.messages import EXIT_BAD_INPUT, located
from svgen.analysis.targets import TARGETS
from svgen.cli.options import OUT_DEFAULT, add_budget, positive_int
from svgen.cli.progress import Progress as _Progress  # noqa: F401 - tests import it from here
from svgen.cli.schema import print_schema
from svgen.cli.tune import tune_spec
from svgen.estimate.tune import DEFAULT_CONFIRM
from svgen.runtime import libtpu_env
from svgen.spec import ALIGN_MODES
from svgen.spec.errors import SpecError


def main(argv: list[str] | None = None) -> int:
    libtpu_env.prepare()  # before anything starts JAX's backends (and with them libtpu)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except SpecError as err:
        print(f"svgen: error: {located(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `svgen inspect ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="svgen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _add_compile(sub)
    _add_inspect(sub)
    _add_cost(sub)
    _add_tune(sub)
    _add_bench(sub)
    _add_report(sub)
    _add_fingerprint(sub)
    _add_schema(sub)
    return parser


def _add_compile(sub) -> None:
    p = sub.add_parser("compile", help="compile specs into generated kernel modules")
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (YAML)")
    p.add_argument("--out", default=OUT_DEFAULT, help=f"output directory (default: {OUT_DEFAULT})")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any generated file is stale or hand-edited",
    )
    p.add_argument(
        "--diff",
        action="store_true",
        help="show what would change; implies --check (writes nothing)",
    )
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="print errors only (no progress, summary or warnings)",
    )
    p.add_argument(
        "--no-gpu-check",
        action="store_true",
        help="with a GPU target: write the modules without their deviceless compile "
        "(nothing then checks that the kernel fits the GPU)",
    )
    p.add_argument(
        "--no-size-check",
        action="store_true",
        help="with a TPU target: write the modules without counting their forward kernel's "
        "program against the chip's budget (libtpu's AOT compile on this host, cached); "
        "nothing then keeps a kernel off the program-size cliff",
    )
    add_budget(p, gpu=True)
    p.set_defaults(run=compile_specs)


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="print what the compiler found for a spec")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument(
        "--no-size-check",
        action="store_true",
        help="leave out the forward kernel's program size against the chip's budget (counted "
        "by libtpu's AOT compile on this host, as `svgen compile` counts it)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument(
        "--tiles",
        metavar="FILE.npy",
        help="save the int8 tile kinds [num_q_blocks, num_kv_blocks] "
        "(EMPTY=0, BOUNDARY=1, FULL=2); [patterns, ...] for several patterns",
    )
    p.add_argument(
        "--png",
        metavar="FILE.png",
        help="write a picture of the tile map, colored by tile kind "
        "(FILE_<pattern>.png per pattern when there are several; each file written is "
        "named on stderr)",
    )
    add_budget(p, gpu=True)
    p.set_defaults(run=inspect_spec)


def _add_cost(sub) -> None:
    p = sub.add_parser(
        "cost",
        help="static model of the kernel's time on a TPU (libtpu's "
        "schedule, compiled on this host)",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compile even when the per-path costs are cached (~/.cache/svgen)",
    )
    p.add_argument(
        "--backward",
        action="store_true",
        help="also model a training step: the forward saving lse, the dq and dk/dv kernels "
        "(one more compile, of jax.grad)",
    )
    add_budget(p)
    p.set_defaults(run=_cost_where_libtpu_is)


def _cost_where_libtpu_is(args) -> int:
    """`svgen cost`, refused (exit 2) on a CPU-only install. The check reads this package's
    `_libtpu_installed` when it runs, so that replacing svgen.cli._libtpu_installed plays
    such an install (tests/test_cli.py)."""
    if not _libtpu_installed():
        print(f"svgen: error: {NO_LIBTPU}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return cost_spec(args)


def _add_tune(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="rank tilings (and align modes) of a spec with the cost "
        "model; --apply writes the best into the spec",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument(
        "--align",
        nargs="+",
        metavar="MODE",
        choices=ALIGN_MODES,
        help=f"align modes to try ({', '.join(ALIGN_MODES)}; default: the spec's)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument(
        "--apply",
        action="store_true",
        help="rewrite the spec's tiling with the first choice (comments and key order kept)",
    )
    p.add_argument(
        "--confirm",
        type=positive_int,
        default=DEFAULT_CONFIRM,
        metavar="K",
        help="compile until the first K rows are exactly costed, not estimated "
        f"(default {DEFAULT_CONFIRM})",
    )
    p.add_argument(
        "--exhaustive",
        action="store_true",
        help="compile every candidate (slow: checks the estimates)",
    )
    p.add_argument(
        "--wide",
        action="store_true",
        help="also try 8192-wide kv tiles (half the grid steps of 4096-wide ones; each such "
        "kernel compiles in minutes)",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="time candidate tilings on the attached TPU instead of ranking them with the "
        "model (a candidate that fails to compile or run is infeasible, retried once by a "
        "later run); measurements are cached per chip, versions, spec, tiling and the "
        "kernels' source; the winner's margin is weighed against the spread of the two "
        "fastest (a tie within noise is said); --apply writes the winner under tiling.<chip>",
    )
    p.add_argument(
        "--backward",
        action="store_true",
        help="with --measure: time forward + backward (jax.grad), for a spec used in training",
    )
    p.add_argument(
        "--budget",
        type=positive_int,
        default=540,
        metavar="SECONDS",
        help="with --measure: start no new candidate after this many seconds (default 540)",
    )
    p.add_argument(
        "--iters",
        type=positive_int,
        default=5,
        metavar="N",
        help="with --measure: timed calls per candidate, after one warm-up (default 5)",
    )
    p.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)
    add_budget(p)
    p.set_defaults(run=_tune)


def _tune(args) -> int:
    if args.measure:
        if args.align or args.exhaustive or args.wide:
            print(
                "svgen: error: --measure times the spec's own align mode only, with no "
                "estimates: --align, --exhaustive and --wide belong to the model's search",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        args.target = args.target if args.target_given else None
        return tune_measured(args)
    return tune_spec(args)


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="time specs' kernels on the attached TPU beside Splash Attention (dense at its "
        "best blocks, and given the same mask), checked against a float32 reference",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (YAML)")
    p.add_argument("--backward", action="store_true", help="also time jax.grad through q, k, v")
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    p.add_argument(
        "--target",
        choices=sorted(TARGETS),
        help="the spec's tiling for this chip (default: the attached chip's; another chip "
        "than the attached one is refused)",
    )
    p.add_argument(
        "--iters",
        type=positive_int,
        default=10,
        metavar="N",
        help="timed calls, the median reported (default 10)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        metavar="N",
        help="calls after the first, untimed (default 2)",
    )
    p.add_argument(
        "--check-rows",
        type=int,
        default=256,
        metavar="N",
        help="query rows per head checked against the float32 reference (default 256; 0: none)",
    )
    p.add_argument(
        "--tiling",
        type=parse_tiling,
        action="append",
        metavar="BQxBKV[/CQxCKV]",
        help="time this tiling instead of the module `svgen compile --target` writes (the "
        "spec's tiling, or the one svgen picks where it gives none, with the code it leaves "
        "out to fit); such as 1024x1024; repeat it to time each spec at several tilings in "
        "one process, Splash once per exact spec",
    )
    p.add_argument(
        "--program",
        type=parse_program,
        action="append",
        metavar="LIMITS",
        help="time the module with this code left out, as `svgen compile` writes it in "
        "the module's program=ProgramLimits(...): pattern_calls, straight_words=N, "
        "whole_masks, joined by '+' (default with --tiling: none; with neither option, what "
        "`svgen compile` leaves out); repeat it to time each in one process",
    )
    p.add_argument("--no-splash", action="store_true", help="time svgen alone")
    p.add_argument(
        "--splash-blocks",
        type=positive_int,
        nargs=3,
        metavar=("Q", "KV", "KV_COMPUTE"),
        help="Splash given the mask at these blocks only (the mask as data, the fused "
        "backward at the same blocks), instead of Splash at its best: the faster mask form "
        "and a small search of forward and backward blocks, remembered per chip and spec",
    )
    p.add_argument(
        "--dense-blocks",
        type=positive_int,
        nargs=3,
        metavar=("Q", "KV", "KV_COMPUTE"),
        help="dense Splash at these blocks only, instead of its best of a small search "
        "(remembered per chip and shape under the cache folder; 2048 1024 1024 was the best "
        "measured on v5e at 75,600 tokens)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(run=bench_specs)


def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write docs/measured.md's tables and the README's headline from bench/results",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a page is not what the results give",
    )
    p.add_argument("--root", default=".", help="the checkout to read and write (default: .)")
    p.set_defaults(run=report_pages)


def _add_fingerprint(sub) -> None:
    p = sub.add_parser(
        "fingerprint",
        help="digest what `svgen bench` times (kernels, tables, the ops around them), no chip",
    )
    p.add_argument(
        "specs", nargs="*", metavar="SPEC", help="spec files (default: the references' specs)"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--write", action="store_true", help="rewrite bench/results/fingerprints.json"
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if they differ from bench/results/fingerprints.json",
    )
    p.add_argument("--root", default=".", help="the checkout (default: .)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(run=fingerprint_specs)


def _add_schema(sub) -> None:
    p = sub.add_parser(
        "schema", help="print the JSON Schema of spec files (draft 2020-12), for editor completion"
    )
    p.set_defaults(run=print_schema)
