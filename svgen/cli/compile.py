"""`svgen compile`: render every spec's kernel modules, then check them against the output
directory (--check, --diff) or write them there; nothing is written unless every spec
compiled."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import tempfile
import time
from typing import Callable

from svgen import codegen
from svgen.analysis import DEFAULT_SMEM_BUDGET, Plan
from svgen.analysis.targets import DEFAULT_TARGET
from svgen.cli.check import check_generated
from svgen.cli.files import check_folder, header_root, write_all
from svgen.cli.messages import EXIT_BAD_INPUT, located, print_warnings
from svgen.cli.options import OUT_DEFAULT
from svgen.cli.ownership import collisions, orphaned_tables, tables_loaded
from svgen.cli.plan import fit_program, plan_spec
from svgen.chip import gpu_aot
from svgen.report.inspect_text import density_bounds_words
from svgen.spec.errors import SpecError


@dataclasses.dataclass
class _Compiled:
    """What the specs compiled so far came to: the files to write, and what went wrong."""

    rendered: dict[pathlib.Path, bytes] = dataclasses.field(default_factory=dict)
    # The spec file each rendered file comes from, and the one that each spec name does.
    owners: dict[pathlib.Path, str] = dataclasses.field(default_factory=dict)
    names: dict[str, str] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)


def compile_specs(args) -> int:
    out_dir = pathlib.Path(args.out)
    check_folder(out_dir, "--out")
    check = args.check or args.diff  # a diff is always a dry run: --diff implies --check
    compiled = _Compiled()
    for spec_file in args.specs:
        _compile_one(spec_file, args, out_dir, check, compiled)
    if compiled.errors:
        for message in compiled.errors:
            print(f"svgen: error: {message}", file=sys.stderr)
        print("svgen: nothing written", file=sys.stderr)
        return EXIT_BAD_INPUT
    if check:
        return check_generated(compiled.rendered, out_dir, args.diff, args.quiet)
    _write(compiled.rendered, out_dir, args.quiet)
    return 0


def _compile_one(
    spec_file: str, args, out_dir: pathlib.Path, check: bool, compiled: _Compiled
) -> None:
    """Analyze and render one spec into `compiled`, or add why it cannot be to its errors."""
    start = time.perf_counter()
    try:
        plan = plan_spec(spec_file, args.quiet, args.smem_budget, args.target, warn=not args.quiet)
    except SpecError as err:
        compiled.errors.append(str(located(err)))
        return
    if plan.spec.name in compiled.names:
        compiled.errors.append(
            f"{spec_file}: name: {plan.spec.name!r} is also the name of "
            f"{compiled.names[plan.spec.name]}; generated module names must be unique"
        )
        return
    compiled.names[plan.spec.name] = spec_file

    render = _renderer(spec_file, args, out_dir)
    files = render(plan)
    size = None
    if plan.backend == "tpu" and not getattr(args, "no_size_check", False):
        try:
            plan, files, size = fit_program(plan, render, spec_file, args.quiet)
        except SpecError as err:
            compiled.errors.append(str(located(err)))
            return
    clashes = collisions(files, spec_file, out_dir, compiled.owners, check)
    if clashes:
        compiled.errors += clashes
        return
    side = _SIDES[plan.backend]
    launch = None
    if side.compile_check is not None and not check and not args.no_gpu_check:
        try:
            launch = side.compile_check(files, plan, args.target)
        except gpu_aot.GpuCompileError as err:
            compiled.errors.append(str(located(SpecError(str(err), file=spec_file, key="gpu"))))
            return
        if not args.quiet:
            print_warnings(gpu_aot.launch_warnings(launch))
    for filename, data in files.items():
        compiled.rendered[out_dir / filename] = data
        compiled.owners[out_dir / filename] = spec_file
    if not args.quiet and not check:
        _print_summary(spec_file, plan, launch, start)
        if size is not None:
            print(f"  {size.words()}", file=sys.stderr)


def _write(rendered: dict[pathlib.Path, bytes], out_dir: pathlib.Path, quiet: bool) -> None:
    """Write the files, then remove the tables that the modules they replaced loaded and
    nothing loads now (a data mask file that changed: its table has a new name)."""
    loaded_before = set().union(*(tables_loaded(p) for p in rendered if p.suffix == ".py"))
    written = write_all(rendered)
    removed = []
    for path in orphaned_tables(out_dir, set(rendered), loaded_before):
        try:
            path.unlink()
        except OSError as exc:
            print(f"svgen: cannot remove {path}: {exc.strerror or exc}", file=sys.stderr)
            continue
        removed.append(path)
    if not quiet:
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        for path in removed:
            print(f"removed {path} (no module loads it any more)", file=sys.stderr)
        print(
            f"svgen: {len(written)} file(s) written, {len(rendered) - len(written)} unchanged",
            file=sys.stderr,
        )


def as_compiled(spec_file: str, target: str, quiet: bool) -> Plan:
    """The plan that `svgen compile SPEC --target TARGET` writes with its other options at
    their defaults: the spec's tiling for the chip, or the tiling svgen picks where it gives
    none, with any code left out to fit the chip's program budget (rendered as that command
    renders it, so the program counts it caches are shared). What `svgen bench` times unless
    told a tiling or program."""
    args = argparse.Namespace(target=target, smem_budget=DEFAULT_SMEM_BUDGET)
    out_dir = pathlib.Path(OUT_DEFAULT)
    plan = plan_spec(spec_file, quiet, DEFAULT_SMEM_BUDGET, target, warn=False)
    if plan.backend != "tpu":
        return plan
    return fit_program(plan, _renderer(spec_file, args, out_dir), spec_file, quiet)[0]


def _renderer(spec_file: str, args, out_dir: pathlib.Path) -> Callable[[Plan], dict[str, bytes]]:
    """render(plan) -> the module's files as `svgen compile` writes them into out_dir (their
    headers name the spec and the options as the Regenerate line repeats them)."""

    def render(plan: Plan) -> dict[str, bytes]:
        return codegen.render(
            plan, _spec_path_for_header(spec_file, out_dir), _regenerate_options(args, out_dir)
        )

    return render


def _spec_path_for_header(spec_file: str, out_dir: pathlib.Path) -> str:
    """The spec's path relative to the header's root (files.header_root: the repository
    root, where the Regenerate line runs). Not relative to the working directory: the files
    must not depend on where svgen ran."""
    rel = os.path.relpath(pathlib.Path(spec_file).resolve(), header_root(out_dir))
    return pathlib.PurePath(rel).as_posix()


def _regenerate_options(args, out_dir: pathlib.Path) -> list[str]:
    """The options a generated header's Regenerate line repeats: those that change the files
    and differ from their defaults. Like the spec path, `--out` is relative to the header's
    root, where the line's command is meant to run."""
    options = []
    out = pathlib.PurePath(os.path.relpath(out_dir.resolve(), header_root(out_dir))).as_posix()
    if out != OUT_DEFAULT:
        options += ["--out", out]
    if args.target != DEFAULT_TARGET:
        options += ["--target", args.target]
    if args.smem_budget != DEFAULT_SMEM_BUDGET:
        options += ["--smem-budget", str(args.smem_budget)]
    return options


def _gpu_compile(files: dict[str, bytes], plan: Plan, target: str) -> dict:
    """The deviceless compile of a GPU module (svgen.chip.gpu_aot), from a scratch directory:
    nothing reaches the output directory before it passed."""
    with tempfile.TemporaryDirectory(prefix="svgen-gpu-") as tmp:
        for filename, data in files.items():
            (pathlib.Path(tmp) / filename).write_bytes(data)
        module = pathlib.Path(tmp) / codegen.module_filename(plan.spec.name, "gpu")
        return gpu_aot.compile_module(module, target)


def _print_summary(spec_file: str, plan: Plan, launch: dict | None, start: float) -> None:
    """One spec's summary on stderr: its tiles and kernel, then the notes its plan calls for
    (aligned budgets, select, KV-cache chunks)."""
    tiles = "; ".join(
        f"{p.name}: {c['full']} full, {c['boundary']} boundary, {c['empty']} empty"
        f"{_bounded_density_words(p)}"
        for p, c in ((p, p.tile_counts()) for p in plan.patterns)
    )
    kernel = _SIDES[plan.backend].summary(plan, launch)
    print(
        f"{spec_file}: {tiles}; {kernel}; {time.perf_counter() - start:.2f} s",
        file=sys.stderr,
    )
    for p in plan.patterns:
        if p.budget is not None:
            label = "" if len(plan.patterns) == 1 else f"{p.name}: "
            print(f"  {label}aligned {p.budget.words()}", file=sys.stderr)
    if plan.spec.select is not None:
        select = plan.spec.select
        print(
            f"  select {select.rule} over select.candidate: at most "
            f"{plan.select_steps()} grid steps per head (the tables' static maximum)",
            file=sys.stderr,
        )
    for line in _SIDES[plan.backend].notes(plan):
        print(f"  {line}", file=sys.stderr)


def _bounded_density_words(pattern) -> str:
    """What the compile summary adds for a pattern whose density is only bounded: the
    bounds, said to be bounds (an exact density needs no word there)."""
    c = pattern.classification
    if c.density_is_exact:
        return ""
    return ", density " + density_bounds_words(
        pattern.density, c.kept_pairs_upper / pattern.total_pairs
    )


def _tpu_summary(plan: Plan, launch: None) -> str:
    return f"{plan.grid_steps} grid steps per head; {plan.table_bytes} bytes of SMEM tables"


def _tpu_notes(plan: Plan) -> list[str]:
    """A KV cache's grid steps by chunk position (the TPU kernel's chunked calls)."""
    if not plan.chunk_runs:
        return []
    steps = ", ".join(str(n) for n in plan.chunk_steps())
    return [
        f"KV-cache chunks of {plan.spec.runtime.chunk_frames} frame(s) against "
        f"{plan.cache_words()}: grid steps per head by chunk position {steps}"
    ]


def _gpu_summary(plan: Plan, launch: dict | None) -> str:
    return f"{plan.table_bytes} bytes of GPU tables; {_launch_words(launch)}"


@dataclasses.dataclass(frozen=True)
class _CompileSide:
    """What `svgen compile` does per backend beyond rendering (codegen.backends has what the
    module holds): a deviceless compile of the rendered files before anything is written
    (files, plan, target) -> launch facts, or None; the summary's words on the kernel; and
    the notes after it."""

    compile_check: Callable[[dict, Plan, str], dict] | None
    summary: Callable[[Plan, dict | None], str]
    notes: Callable[[Plan], list[str]]


_SIDES = {
    "tpu": _CompileSide(compile_check=None, summary=_tpu_summary, notes=_tpu_notes),
    # A GPU module is compiled for its target without a GPU (svgen.chip.gpu_aot).
    "gpu": _CompileSide(compile_check=_gpu_compile, summary=_gpu_summary, notes=lambda p: []),
}


def _launch_words(launch: dict | None) -> str:
    if launch is None:
        return "not compiled (--no-gpu-check)"
    spills = launch.get("spill_store_bytes", 0) + launch.get("spill_load_bytes", 0)
    registers = (
        f", {launch['registers']} registers, {spills:,} bytes spilled"
        if "registers" in launch
        else ""
    )
    return (
        f"compiled for {launch['target']}: grid {launch['grid']}, {launch['threads']} threads, "
        f"{launch['shared_memory']:,} of {launch['shared_memory_limit']:,} bytes of shared "
        f"memory{registers}, {launch['wgmma']} wgmma"
    )
