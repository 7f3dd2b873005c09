"""`svgen bench`: time specs' kernels on the attached TPU beside Splash Attention (dense at its
best blocks, and given the same mask), in one process; and `svgen tune --measure`, which
picks a tiling by timing candidates there (svgen.chip.chip_bench, svgen.chip.measured_tune).

Both need a TPU: without one they say so in one line and exit 2. Progress goes to stderr, a
line per item; the table to stdout; `--json FILE` writes every figure with the chip, the
versions, the commit and each spec's digest.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time

from svgen.cli.files import write_all
from svgen.cli.messages import EXIT_BAD_INPUT

NO_CHIP = "svgen {command} times kernels on an attached TPU, and there is none: {why}"


def _chip(command: str, args) -> str | None:
    """The chip to time on (None after printing why there is none)."""
    from svgen.chip import chip_bench

    try:
        chip = chip_bench.attached_chip() if not args.interpret else "cpu-interpret"
    except chip_bench.NoChip as exc:
        print("svgen: error: " + NO_CHIP.format(command=command, why=exc), file=sys.stderr)
        return None
    if args.target is not None and args.target != chip and not args.interpret:
        print(
            f"svgen: error: --target {args.target} asks for another chip than the attached "
            f"one ({chip}): a measurement is only of the chip it ran on",
            file=sys.stderr,
        )
        return None
    return chip


def _progress(quiet: bool):
    start = time.monotonic()

    def line(text: str) -> None:
        if not quiet:
            print(
                f"svgen bench [{time.monotonic() - start:6.1f} s] {text}",
                file=sys.stderr,
                flush=True,
            )

    return line


def parse_program(text: str):
    """What a timed module leaves out of its kernels (svgen.core.program.ProgramLimits), as
    `svgen compile` says it in the module: `none`, or `+`-joined `pattern_calls`,
    `straight_words=N`, `whole_masks` (an argparse type)."""
    import argparse

    from svgen.core.program import ProgramLimits

    fields: dict = {}
    for part in text.split("+"):
        name, _, value = part.strip().partition("=")
        if name == "none" and text.strip() == "none":
            continue
        if name == "pattern_calls" and not value:
            fields["pattern_calls"] = True
        elif name == "whole_masks" and not value:
            fields["residual_masks"] = False
        elif name == "straight_words" and value.isdigit():
            fields["straight_words"] = int(value)
        else:
            raise argparse.ArgumentTypeError(
                "expected none, or pattern_calls, straight_words=N and whole_masks joined by "
                f"'+' (such as pattern_calls+straight_words=0), got {text!r}"
            )
    return ProgramLimits(**fields)


def _load(path: str, target: str, tiling):
    """The spec read for `target`, with `tiling` in place of its own where given (checked as
    the spec reader checks a tiling, by reading the spec again with it)."""
    from svgen.chip import measured_tune
    from svgen.spec import load_spec

    spec = load_spec(path, chip=target)
    return spec if tiling is None else measured_tune.with_tiling(spec, tiling)


def _as_compiled(path: str, target: str, quiet: bool):
    """(spec, ProgramLimits) of the module `svgen compile --target` writes for `path`."""
    from svgen.cli.compile import as_compiled

    plan = as_compiled(path, target, quiet)
    if not quiet:
        t = plan.spec.tiling
        left_out = plan.program.words() or "nothing left out"
        print(
            f"svgen bench: {path}: timing the module svgen compile writes: "
            f"{t.block_q}x{t.block_kv}/{t.cq}x{t.ckv}, {left_out}",
            file=sys.stderr,
            flush=True,
        )
    return plan.spec, plan.program


def bench_specs(args) -> int:
    from svgen.chip import bench_table, chip_bench

    chip = _chip("bench", args)
    if chip is None:
        return EXIT_BAD_INPUT
    target = args.target or (chip if chip != "cpu-interpret" else "v5e")
    # Every spec read first: at each tiling asked for, each with every program asked for;
    # with neither asked for, the module `svgen compile --target` writes (its tiling or the
    # one svgen picks, with the code it leaves out to fit the program budget).
    if args.tiling is None and args.program is None:
        specs = [_as_compiled(path, target, args.quiet) for path in args.specs]
    else:
        specs = [
            (_load(path, target, t), program)
            for path in args.specs
            for t in args.tiling or [None]
            for program in args.program or [parse_program("none")]
        ]
    options = chip_bench.Options(
        warmup=args.warmup,
        iters=args.iters,
        backward=args.backward,
        check_rows=args.check_rows,
        splash=not args.no_splash,
        splash_blocks=tuple(args.splash_blocks) if args.splash_blocks else None,
        interpret=args.interpret,
        **({"dense_blocks": (tuple(args.dense_blocks),)} if args.dense_blocks else {}),
    )
    env = chip_bench.versions()
    dense = chip_bench.SplashDense(None if args.interpret else chip_bench.cache_dir())
    progress = _progress(args.quiet)
    results = []

    def save(complete: bool) -> None:
        # Rewritten after every figure (atomically): a run stopped part way, by a time limit
        # or a chip that fails, keeps what it measured; "complete" says whether it finished.
        report = {
            "chip": chip,
            "versions": env,
            "commit": chip_bench.commit(),
            "source_digest": chip_bench.source_digest(),
            "complete": complete,
            "options": {
                "warmup": options.warmup,
                "iters": options.iters,
                "check_rows": options.check_rows,
                "splash_blocks": list(options.splash_blocks) if options.splash_blocks else "search",
                "dense_blocks": [list(b) for b in options.dense_blocks],
            },
            "results": results,
        }
        write_all({pathlib.Path(args.json): (json.dumps(report, indent=1) + "\n").encode()})

    def keep(result: dict) -> None:  # the spec being timed: its figures so far
        results[-1] = result
        if args.json:
            save(complete=False)

    peers: dict = {}  # per spec: the result whose Splash figures its other tilings share
    for spec, program in specs:
        results.append({"spec": spec.name})
        # Splash gets the same mask at every tiling (and program) of an exact spec: timed once
        # per spec (an aligned spec's rounded mask changes with the tiling).
        peer = peers.get(spec.source) if spec.tiling.align == "exact" else None
        spec_options = dataclasses.replace(options, program=program)
        result = chip_bench.bench_spec(
            spec,
            target,
            spec_options if peer is None else dataclasses.replace(spec_options, splash=False),
            progress=progress,
            dense=dense,
            env=env,
            on_entry=keep,
        )
        if peer is not None:
            result = chip_bench.with_peer_figures(result, peer)
        elif options.splash:
            peers.setdefault(spec.source, result)
        keep(result)
    for line in bench_table.format_table(results, chip):
        print(line)
    if args.json:
        save(complete=True)
    failed = [
        r["spec"]
        for r in results
        for key in ("svgen_forward", "splash_mask_forward")
        if r.get(key, {}).get("ok") is False
    ]
    if failed:
        print(
            f"svgen: error: outputs off the float32 reference: {', '.join(failed)}", file=sys.stderr
        )
        return 1
    return 0


def tune_measured(args) -> int:
    """`svgen tune --measure`."""
    from svgen.chip import chip_bench, measured_tune

    chip = _chip("tune --measure", args)
    if chip is None:
        return EXIT_BAD_INPUT
    target = args.target or (chip if chip != "cpu-interpret" else "v5e")
    spec = _load(args.spec, target, None)
    # No fingerprint per candidate: tune keeps no results file to tie it to.
    options = chip_bench.Options(
        warmup=1, iters=args.iters, check_rows=64, interpret=args.interpret, fingerprint=False
    )
    trials = measured_tune.tune(
        spec,
        target,
        backward=args.backward,
        budget_s=args.budget,
        options=options,
        progress=_progress(False),
        use_cache=not args.interpret,
    )
    verdict = measured_tune.verdict(trials)
    if args.json:
        print(
            json.dumps(
                {"trials": [_trial_json(t) for t in trials], "verdict": verdict.to_json()},
                indent=1,
            )
        )
    else:
        for line in measured_tune.format_table(trials, chip, args.backward):
            print(line)
    if verdict.winner is None:
        print("svgen: error: no candidate tiling compiled and ran", file=sys.stderr)
        return 1
    if args.apply:
        from svgen.cli.tune import apply_measured

        if verdict.tie:
            # The fastest is as good a pick as any within noise; the user should know that
            # another run could have ranked the two the other way.
            print(f"svgen: applying the fastest, though {verdict.sentence()}", file=sys.stderr)
        apply_measured(args.spec, verdict.winner.tiling, spec.tiling.align, target)
    return 0


def _trial_json(t) -> dict:
    """One candidate for `svgen tune --measure --json`: its median, fastest run and spread
    (a fraction), or why it is infeasible, with every failed attempt's reason."""
    return {
        "tiling": dict(zip(("block_q", "block_kv", "compute_q", "compute_kv"), t.tiling)),
        "ms": t.ms,
        "min_ms": t.min_ms,
        "spread": t.spread,
        "runs": t.runs,
        "per_direction_ms": t.per_direction,
        "error": t.error,
        "attempts": len(t.failures) + (t.ms is not None),
        "failures": list(t.failures),
        "cached": t.cached,
    }
