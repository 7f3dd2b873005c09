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
import difflib
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np
import yaml

from svgen import codegen
from svgen.perf import gpu_aot
from svgen.report import lint
from svgen.runtime import libtpu_env
from svgen.analysis import DEFAULT_SMEM_BUDGET, Plan, analyze
from svgen.spec.errors import SpecError
from svgen.report.inspect_text import density_bounds_words, inspect_lines
from svgen.spec import ALIGN_MODES, load_spec
from svgen.perf.tune import DEFAULT_CONFIRM
from svgen.analysis.targets import DEFAULT_TARGET, GPU_TARGETS, TARGETS

OUT_DEFAULT = "generated"
EXIT_STALE = 1
EXIT_BAD_INPUT = 2
# Report progress for analyses that take longer than this (seconds).
PROGRESS_AFTER = 1.0
REFRESH_EVERY = 0.1  # seconds between updates of the progress line on a terminal
LOG_EVERY = 10.0  # seconds between progress lines when stderr is a file or a pipe


def main(argv: list[str] | None = None) -> int:
    libtpu_env.prepare()  # before anything starts JAX's backends (and with them libtpu)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except SpecError as err:
        print(f"svgen: error: {_located(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `svgen inspect ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="svgen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

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
    _add_budget(p, gpu=True)
    p.set_defaults(run=_compile)

    p = sub.add_parser("inspect", help="print what the compiler found for a spec")
    p.add_argument("spec", metavar="SPEC")
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
        "(FILE_<pattern>.png per pattern when there are several)",
    )
    _add_budget(p, gpu=True)
    p.set_defaults(run=_inspect)

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
    _add_budget(p)
    p.set_defaults(run=_cost)

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
        type=_positive_int,
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
    _add_budget(p)
    p.set_defaults(run=_tune)

    p = sub.add_parser(
        "schema", help="print the JSON Schema of spec files (draft 2020-12), for editor completion"
    )
    p.set_defaults(run=_schema)
    return parser


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a budget of 0 or less means nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_budget(p: argparse.ArgumentParser, gpu: bool = False) -> None:
    p.add_argument(
        "--smem-budget",
        type=_positive_int,
        default=DEFAULT_SMEM_BUDGET,
        metavar="BYTES",
        help="fail when a kernel's scalar-prefetch tables exceed this many bytes "
        f"(default {DEFAULT_SMEM_BUDGET}: one TPU core's SMEM)",
    )
    if gpu:
        p.add_argument(
            "--target",
            choices=sorted(TARGETS) + sorted(GPU_TARGETS),
            default=DEFAULT_TARGET,
            help=f"the chip the kernel is for (default {DEFAULT_TARGET}): a TPU (its VMEM "
            f"decides which tilings fit), or a GPU ({', '.join(sorted(GPU_TARGETS))}: a Pallas "
            f"Triton kernel, <name>_gpu.py, tiled by the spec's `gpu` section)",
        )
        return
    p.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default=DEFAULT_TARGET,
        help=f"the TPU the kernel is for: its VMEM decides which tilings fit "
        f"(default {DEFAULT_TARGET})",
    )


class _StatusLine:
    """One status line on stderr. On a terminal it is rewritten in place (carriage return);
    in a log a carriage return erases nothing and the updates would pile up into one huge
    line, so there: plain lines, at most one every LOG_EVERY seconds unless forced."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_terminal(self.stream)
        self.last_shown: float | None = None
        self.line_open = False  # a live line without its newline yet

    def due(self, force: bool = False) -> bool:
        """Whether an update now would not flood the stream (and if so, count it shown)."""
        now = time.perf_counter()
        interval = REFRESH_EVERY if self.live else LOG_EVERY
        if not force and self.last_shown is not None and now - self.last_shown < interval:
            return False
        self.last_shown = now
        return True

    def show(self, text: str, final: bool = False) -> None:
        if self.live:
            print(f"\r\x1b[2K{text}", end="\n" if final else "", file=self.stream, flush=True)
            self.line_open = not final
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End a live line cut short (an error), so the next message starts on its own line."""
        if self.line_open:
            print(file=self.stream, flush=True)
            self.line_open = False


class _Progress(_StatusLine):
    """Analysis progress, once an analysis has run for `after` seconds."""

    def __init__(self, label: str, quiet: bool, stream=None, after: float = PROGRESS_AFTER):
        super().__init__(stream)
        self.label, self.quiet, self.after = label, quiet, after
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.quiet or time.perf_counter() - self.start < self.after:
            return
        final = done == total
        if self.due(force=final):
            self.show(f"  {self.label}: classified {done}/{total} q tiles", final)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _plan(spec_file: str, quiet: bool, smem_budget: int, target: str, warn: bool = True) -> Plan:
    """The spec's analysis; likely mistakes (svgen.report.lint) are printed as warnings on stderr
    unless `warn` is False, and change nothing else."""
    spec = load_spec(spec_file)
    if warn:
        _print_warnings(lint.spec_warnings(spec))
    progress = _Progress(spec_file, quiet)
    try:
        plan = analyze(spec, progress=progress, smem_budget=smem_budget, target_name=target)
    finally:
        progress.close()
    if warn:
        _print_warnings(lint.plan_warnings(plan))
    return plan


def _print_warnings(warnings) -> None:
    for warning in warnings:
        print(f"svgen: warning: {warning}", file=sys.stderr)


def _spec_path_for_header(spec_file: str, out_dir: pathlib.Path) -> str:
    """The spec's path relative to the output directory's parent (the repository root).

    Not relative to the working directory: the files must not depend on where svgen ran."""
    rel = os.path.relpath(pathlib.Path(spec_file).resolve(), out_dir.resolve().parent)
    return pathlib.PurePath(rel).as_posix()


def _regenerate_options(args, out_dir: pathlib.Path) -> list[str]:
    """The options a generated header's Regenerate line repeats: those that change the files
    and differ from their defaults. Like the spec path, `--out` is relative to the output
    directory's parent, where the line's command is meant to run."""
    options = []
    if out_dir.resolve().name != OUT_DEFAULT:
        options += ["--out", out_dir.resolve().name]
    if args.target != DEFAULT_TARGET:
        options += ["--target", args.target]
    if args.smem_budget != DEFAULT_SMEM_BUDGET:
        options += ["--smem-budget", str(args.smem_budget)]
    return options


def _compile(args) -> int:
    out_dir = pathlib.Path(args.out)
    _check_folder(out_dir, "--out")
    check = args.check or args.diff  # a diff is always a dry run: --diff implies --check
    rendered: dict[pathlib.Path, bytes] = {}
    owners: dict[pathlib.Path, str] = {}  # the spec file each rendered file comes from
    errors: list[str] = []
    names: dict[str, str] = {}
    for spec_file in args.specs:
        start = time.perf_counter()
        try:
            plan = _plan(spec_file, args.quiet, args.smem_budget, args.target, warn=not args.quiet)
        except SpecError as err:
            errors.append(str(_located(err)))
            continue
        if plan.spec.name in names:
            errors.append(
                f"{spec_file}: name: {plan.spec.name!r} is also the name of "
                f"{names[plan.spec.name]}; generated module names must be unique"
            )
            continue
        names[plan.spec.name] = spec_file
        files = codegen.render(
            plan, _spec_path_for_header(spec_file, out_dir), _regenerate_options(args, out_dir)
        )
        clashes = _collisions(files, spec_file, out_dir, owners, check)
        if clashes:
            errors += clashes
            continue
        launch = None
        if plan.gpu is not None and not check and not args.no_gpu_check:
            try:
                launch = _gpu_compile(files, plan, args.target)
            except gpu_aot.GpuCompileError as err:
                errors.append(str(_located(SpecError(str(err), file=spec_file, key="gpu"))))
                continue
            if not args.quiet:
                _print_warnings(gpu_aot.launch_warnings(launch))
        for filename, data in files.items():
            rendered[out_dir / filename] = data
            owners[out_dir / filename] = spec_file
        if not args.quiet and not check:
            tiles = "; ".join(
                f"{p.name}: {c['full']} full, {c['boundary']} boundary, {c['empty']} empty"
                f"{_bounded_density_words(p)}"
                for p, c in ((p, p.tile_counts()) for p in plan.patterns)
            )
            kernel = (
                f"{plan.grid_steps} grid steps per head; {plan.table_bytes} bytes of SMEM tables"
                if plan.gpu is None
                else f"{plan.table_bytes} bytes of GPU tables; {_launch_words(launch)}"
            )
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
            if plan.chunk_runs and plan.gpu is None:
                steps = ", ".join(str(n) for n in plan.chunk_steps())
                print(
                    f"  KV-cache chunks of {plan.spec.runtime.chunk_frames} frame(s) against "
                    f"{plan.cache_words()}: grid steps per head by chunk position {steps}",
                    file=sys.stderr,
                )
    if errors:
        for message in errors:
            print(f"svgen: error: {message}", file=sys.stderr)
        print("svgen: nothing written", file=sys.stderr)
        return EXIT_BAD_INPUT
    if check:
        return _check(rendered, out_dir, args.diff, args.quiet)
    written = _write_all(rendered)
    if not args.quiet:
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        print(
            f"svgen: {len(written)} file(s) written, {len(rendered) - len(written)} unchanged",
            file=sys.stderr,
        )
    return 0


def _bounded_density_words(pattern) -> str:
    """What the compile summary adds for a pattern whose density is only bounded: the
    bounds, said to be bounds (an exact density needs no word there)."""
    c = pattern.classification
    if c.density_is_exact:
        return ""
    return ", density " + density_bounds_words(
        pattern.density, c.kept_pairs_upper / pattern.total_pairs
    )


def _collisions(
    files: dict[str, bytes],
    spec_file: str,
    out_dir: pathlib.Path,
    owners: dict[pathlib.Path, str],
    check: bool,
) -> list[str]:
    """Why the files of `spec_file` must not be written: a name that another spec of this
    compile also renders (a spec `b48` for a GPU and one named `b48_gpu` both make
    `b48_gpu.py`; names and pattern names can combine to the same `_tables.npy`), or a file
    already in `out_dir` that another existing spec's compile wrote (`_owners`). Both spec
    files are named; nothing is written."""
    problems = []
    for filename in files:
        path = out_dir / filename
        if path in owners:
            problems.append(
                f"{spec_file}: name: its generated file {filename} is also generated from "
                f"{owners[path]}; generated file names must not collide: rename one of the specs"
            )
            continue
        if check or not path.exists():
            continue
        if path.is_dir():
            problems.append(
                f"{spec_file}: name: {path} is a folder, in the way of a generated file"
            )
            continue
        owners_on_disk = _owners(path, out_dir)
        if owners_on_disk is None:
            problems.append(
                f"{spec_file}: name: {path} exists and is not a file svgen generated; "
                f"refusing to replace it"
            )
            continue
        for owner in owners_on_disk:
            if not _same_file(owner, spec_file) and owner.exists():
                problems.append(
                    f"{spec_file}: name: {path} was generated from {owner}, another spec; "
                    f"compiling {spec_file} would replace it: generated file names must not "
                    f"collide: rename one of the specs"
                )
                break
    return problems


def _owners(path: pathlib.Path, out_dir: pathlib.Path) -> list[pathlib.Path] | None:
    """The spec files that the generated file `path` came from: a module's header names its
    spec; a table file belongs to each module in `out_dir` that loads it (none: left over).
    None for a module without svgen's header (not a generated file)."""
    if path.suffix == ".py":
        header = codegen.parse_header(path.read_text(errors="replace"))
        return None if header is None else [out_dir.resolve().parent / header.spec_path]
    quoted, found = f'"{path.name}"', []
    for module in sorted(out_dir.glob("*.py")):
        text = module.read_text(errors="replace")
        header = codegen.parse_header(text)
        if header is not None and quoted in text:
            found.append(out_dir.resolve().parent / header.spec_path)
    return found


def _same_file(a: pathlib.Path, b: str) -> bool:
    return a.resolve() == pathlib.Path(b).resolve()


def _check_folder(path: pathlib.Path, option: str) -> None:
    """`path` is, or can be made, a folder: its nearest existing ancestor is a folder."""
    for existing in (path, *path.parents):
        if existing.exists():
            break
    if not existing.is_dir():
        what = "" if existing == path else f" (its parent {existing} is)"
        raise SpecError(f"{option}: {path} must be a folder, but it is a file{what}")


def _check_file_target(path: pathlib.Path, option: str) -> None:
    """An output file `path` can be written: its folder exists, and it is not a folder."""
    parent = path.parent
    if not parent.is_dir():
        why = "does not exist" if not parent.exists() else "is a file"
        raise SpecError(f"{option}: cannot write {path}: the folder {parent} {why}")
    if path.is_dir():
        raise SpecError(f"{option}: cannot write {path}: it is a folder")


def _located(err: SpecError) -> SpecError:
    """`err` with the line and column of its key in its spec file, when it names a key but
    not where it is written (the analysis knows the key path, not the YAML node): the key's
    value, else its nearest written parent (`tiling` when the tiling is the default: the
    file's first line), so that every message about a spec reads file:line:col: key."""
    if err.line is not None or err.file is None or not err.key:
        return err
    try:
        text = pathlib.Path(err.file).read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (OSError, UnicodeError, yaml.YAMLError):
        return err
    if node is None:
        return err
    for part in err.key.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        found = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
        if not found:
            break
        node = found[0]
    mark = node.start_mark
    return SpecError(
        err.message, file=err.file, line=mark.line + 1, column=mark.column + 1, key=err.key
    )


def _gpu_compile(files: dict[str, bytes], plan: Plan, target: str) -> dict:
    """The deviceless compile of a GPU module (svgen.perf.gpu_aot), from a scratch directory:
    nothing reaches the output directory before it passed."""
    with tempfile.TemporaryDirectory(prefix="svgen-gpu-") as tmp:
        for filename, data in files.items():
            (pathlib.Path(tmp) / filename).write_bytes(data)
        module = pathlib.Path(tmp) / codegen.module_filename(plan.spec.name, "gpu")
        return gpu_aot.compile_module(module, target)


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


def _write_all(rendered: dict[pathlib.Path, bytes]) -> list[pathlib.Path]:
    """Write changed files only, each through a temporary file and an atomic rename; a file
    that cannot be written is a SpecError naming it (its temporary file removed)."""
    written = []
    for path, data in rendered.items():
        if path.exists() and path.read_bytes() == data:
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            done = f" ({len(written)} other file(s) written before)" if written else ""
            raise SpecError(f"cannot write it: {exc.strerror or exc}{done}", file=str(path))
        written.append(path)
    return written


def _check(
    rendered: dict[pathlib.Path, bytes], out_dir: pathlib.Path, show_diff: bool, quiet: bool
) -> int:
    problems = []
    for path, data in rendered.items():
        if not path.exists():
            problems.append(f"{path}: missing (run svgen compile)")
            continue
        current = path.read_bytes()
        if current == data:
            continue
        if path.suffix == ".py":
            text = current.decode(errors="replace")
            header = codegen.parse_header(text)
            if header is None or header.body_sha256 != codegen.body_checksum(codegen.body_of(text)):
                problems.append(f"{path}: edited by hand (its checksum does not match its body)")
            else:
                problems.append(f"{path}: stale (the spec or svgen changed; run svgen compile)")
            if show_diff:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        text.splitlines(keepends=True),
                        data.decode().splitlines(keepends=True),
                        fromfile=str(path),
                        tofile=f"{path} (regenerated)",
                    )
                )
        else:
            problems.append(f"{path}: stale or edited (binary table differs)")
    problems += _orphans(out_dir, set(rendered))
    for p in problems:
        print(f"svgen: {p}", file=sys.stderr)
    if problems:
        return EXIT_STALE
    if not quiet:
        print(f"svgen: {len(rendered)} generated file(s) up to date", file=sys.stderr)
    return 0


def _orphans(out_dir: pathlib.Path, expected: set[pathlib.Path]) -> list[str]:
    """Generated modules whose spec no longer exists."""
    found = []
    for path in sorted(out_dir.glob("*.py")):
        if path in expected:
            continue
        header = codegen.parse_header(path.read_text(errors="replace"))
        if header and not (out_dir.resolve().parent / header.spec_path).exists():
            found.append(f"{path}: stale (its spec {header.spec_path} no longer exists)")
    return found


def _inspect(args) -> int:
    # Before the analysis (seconds for a big spec): where the files go must exist.
    if args.tiles:
        _check_file_target(pathlib.Path(args.tiles), "--tiles")
    if args.png:
        _check_file_target(pathlib.Path(args.png), "--png")
    plan = _plan(args.spec, quiet=args.json, smem_budget=args.smem_budget, target=args.target)
    single = len(plan.patterns) == 1
    if args.tiles:
        np.save(
            args.tiles,
            plan.kinds.astype(np.int8)
            if single
            else np.stack([p.kinds.astype(np.int8) for p in plan.patterns]),
            allow_pickle=False,
        )
    if args.png:
        from svgen.report.pictures import write_tile_map_png

        for pattern in plan.patterns:
            path = pathlib.Path(args.png)
            if not single:
                path = path.with_name(f"{path.stem}_{pattern.name}{path.suffix}")
            s = pattern.summary()
            density = (
                f"density {s['density']:.4f}"
                if s["density_is_exact"]
                else f"density bounds {s['density_lower']:.4f} to {s['density_upper']:.4f}"
            )
            title = (
                f"{plan.spec.name}{'' if single else ' / ' + pattern.name}: "
                f"{pattern.grid.block_q} x {pattern.grid.block_kv} tiles, "
                f"{pattern.layout.order}, {density}, "
                f"visited fraction {pattern.visited_fraction:.4f}"
            )
            write_tile_map_png(pattern.kinds, path, title=title)
    if args.json:
        print(json.dumps(plan.summary(), indent=2, sort_keys=False))
        return 0
    for line in inspect_lines(plan, args.spec):
        print(line)
    return 0


#: What `svgen cost` says where libtpu is missing (a CPU-only install: `pip install svgen`).
NO_LIBTPU = (
    "svgen cost compiles the kernel with libtpu, the TPU compiler, which is not "
    "installed here; install it with: pip install 'svgen[tpu]'"
)


def _libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def _cost(args) -> int:
    if not _libtpu_installed():
        print(f"svgen: error: {NO_LIBTPU}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from svgen.perf import cost, cost_text

    # libtpu must learn where to dump its schedules before anything starts it.
    from svgen.perf.tpu_schedule import NoGridLoop, ensure_dump_flags

    ensure_dump_flags()
    plan = _plan(args.spec, quiet=args.json, smem_budget=args.smem_budget, target=args.target)
    progress = None if args.json else (lambda message: print(f"  {message}", file=sys.stderr))
    try:
        report = cost.cost_plan(
            plan, args.spec, use_cache=not args.no_cache, progress=progress, training=args.backward
        )
    except NoGridLoop as err:  # a kernel check_costable let through: still no traceback
        raise SpecError(
            f"svgen cost cannot read this kernel's schedule: {err}", file=args.spec, key="tiling"
        ) from None
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for line in cost_text.format_report(report, plan):
            print(line)
    return 0


def _tune(args) -> int:
    from svgen.perf import tune

    if args.apply:  # before minutes of tuning: the spec can be rewritten at all
        _rewritable(pathlib.Path(args.spec))
    progress = _TuneProgress(quiet=False)
    try:
        result = tune.tune(
            args.spec,
            target=args.target,
            aligns=args.align,
            smem_budget=args.smem_budget,
            confirm=args.confirm,
            exhaustive=args.exhaustive,
            progress=progress,
        )
    finally:
        progress.close()
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        for line in tune.summary_lines(result) + [""] + tune.format_table(result):
            print(line)
    if args.apply:
        _apply_tiling(args.spec, result.choice.candidate, quiet=args.json)
    return 0


def _apply_tiling(spec_file: str, candidate, quiet: bool) -> None:
    """Rewrite the spec's tiling in place (atomically, only once the new text reads back as
    the same spec with the chosen tiling), and say what changed."""
    path = pathlib.Path(spec_file)
    text, changes = _rewritten(path, candidate)
    if not changes:
        print(f"svgen: {spec_file}: tiling unchanged (already the first choice)", file=sys.stderr)
        return
    _rewritable(path)  # still, after the tuning
    _write_all({path: text.encode("utf-8")})
    print(f"svgen: {spec_file}: tiling " + "; ".join(changes), file=sys.stderr)


def _rewritable(path: pathlib.Path) -> None:
    """Refuse a spec that `--apply` could not or should not rewrite: one that cannot be
    read, or is read-only (no write permission bit: a read-only file is the user's word,
    which root's access would override), in a folder that takes no new file (the rewrite is
    a temporary file and a rename), or whose `tiling` the rewrite cannot change alone."""
    spec = load_spec(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SpecError(f"cannot read the spec file: {exc.strerror}", file=str(path)) from None
    if not mode & 0o222 or not os.access(path, os.W_OK):
        raise SpecError(
            "--apply rewrites the spec in place, but the file is read-only", file=str(path)
        )
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise SpecError(
            f"--apply rewrites the spec through a temporary file beside it, but its folder "
            f"{path.parent} is read-only",
            file=str(path),
        )
    from svgen.perf.tune import Candidate

    t = spec.tiling
    _rewritten(path, Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align))


def _rewritten(path: pathlib.Path, candidate) -> tuple[str, list[str]]:
    """The spec's text with `candidate`'s tiling, and the changes in words; a SpecError when
    the new text would not read back as the same spec with that tiling."""
    from svgen.spec import parse_spec
    from svgen.perf.tune import rewrite_tiling

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise SpecError(f"cannot read the spec file: {exc}", file=str(path)) from None
    old = parse_spec(text, source=str(path))
    new_text, changes = rewrite_tiling(text, candidate, source=str(path))
    try:
        new = parse_spec(new_text, source=str(path))
    except SpecError:  # about the rewritten text, not the user's: say what happened instead
        new = None
    t = new.tiling if new is not None else None
    want = (
        candidate.block_q,
        candidate.block_kv,
        candidate.compute_q,
        candidate.compute_kv,
        candidate.align,
    )
    if (
        t is None
        or (t.block_q, t.block_kv, t.cq, t.ckv, t.align) != want
        or _without_tiling(old) != _without_tiling(new)
    ):
        raise SpecError(
            "--apply could not rewrite the tiling alone (the rewritten spec reads back "
            "differently); write tiling's keys out in full, then run again",
            file=str(path),
            key="tiling",
        )
    return new_text, changes


def _without_tiling(spec):
    """What a spec says besides its tiling (for --apply's check that only the tiling moved)."""
    import dataclasses

    return dataclasses.replace(spec, tiling=None, digest="")


class _TuneProgress(_StatusLine):
    """Tune progress: every compile (tens of seconds apart) and the analyses between them."""

    def __init__(self, quiet: bool, stream=None):
        super().__init__(stream)
        self.quiet = quiet

    def __call__(self, what: str, done: int, total: int) -> None:
        compile_step = total == 0
        if self.quiet or not self.due(force=compile_step or done == total):
            return
        text = f"  tune: {what}" + (f" [{done}/{total}]" if total else f" [compile {done}]")
        self.show(f"{text} {_bar(done, total)}" if self.live and total else text)


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _schema(args) -> int:
    from svgen.spec.schema import schema_text

    sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
