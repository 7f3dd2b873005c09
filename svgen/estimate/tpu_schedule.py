"""Static per-grid-step cost of a Pallas TPU kernel, read from libtpu's final VLIW schedule.

libtpu (the real TPU compiler) AOT-compiles for a TPU topology on a CPU-only host, and with
``--xla_jf_dump_to=DIR --xla_jf_dump_llo_pass_label_regex=final_bundles`` it writes each
Mosaic kernel's final bundle listing, ``DIR/<id>-<kernel>.1-NN-final_bundles.txt``. The
TensorCore is in-order VLIW and issues one bundle per cycle, so the bundles executed along
a control-flow path are the cycles that path takes, minus stalls the schedule does not show
(DMA waits count one bundle each).

What a Pallas kernel looks like in the listing (jax 0.10.2, libtpu 0.0.42.1):

* the whole grid is ONE loop, opened by the ``LB:`` marker and closed by a backward
  ``sbr.rel (!%p) target = $regionN``; its ``/* loop exit test */`` compare immediate is
  grid steps + 2 (a pipeline prologue and epilogue step that only issue or await DMAs);
* each ``pl.when`` is a forward ``sbr.rel (%p) target = $regionN`` that skips its body; the
  target bundle (marker ``PF:``) starts region N;
* every ``sbr.rel`` is followed by ``DELAY_SLOTS`` bundles that always execute, so a taken
  forward branch at address b skips ``[b + 1 + DELAY_SLOTS, start of region N)``;
* Pallas wraps the kernel body of each step in an outer "pipeline stage" branch (skipped on
  the prologue/epilogue steps), so the kernel's own ``pl.when`` bodies show up at depth 1;
* ``lax.fori_loop(..., unroll=False)`` is an inner loop with its own exit test.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping

import jax

from svgen.runtime import libtpu_env

DELAY_SLOTS = 4
"""Bundles after every ``sbr.rel`` that execute whether or not the branch is taken."""

TOPOLOGIES = {"v5e": "v5e:2x2", "v6e": "v6e:2x2", "v7x": "tpu7x:2x2x1"}
"""AOT topology per target (single-chip names such as ``v6e:1x1`` are rejected by libtpu)."""

_BUNDLE_START = re.compile(r"^\s*(0x[0-9a-fA-F]+|\d+)\s+([A-Z, ]*):\s*>*\s*\{")
_TOKEN = re.compile(r"/\*|\*/|;;|\{|\}")
_OPCODE = re.compile(r"\s*(?:%[\w]+\s*=\s*)?([A-Za-z_][\w.]*)")
_DEST = re.compile(r"\s*(%[\w]+)\s*=")
_REGION_START = re.compile(r"Start(?:/End empty)? region (\d+)")
_BRANCH = re.compile(r"sbr\.rel\s*(?:\((!?%\w+)\))?\s*target\s*=\s*\$region(\d+)")
_BRANCH_TARGET = re.compile(r"sbr\.rel\b[^}]*?target\s*=\s*\$region(\d+)")
_EXIT_TEST = re.compile(r"scmp\.ge\.s32\.totalorder\s+%\w+,\s*(\d+)\s*/\*\s*loop exit test")
_Jump = tuple[int, int, str | None]  # an sbr.rel: address, target address, predicate

_FAMILIES = (
    (re.compile(r"vpop\..*\bmrf\b"), "vpop.mrf"),  # MXU result pops
    (re.compile(r"vpop\.eup\b"), "vpop.eup"),  # EUP (exp, reciprocal) result pops
    (re.compile(r"vpop\.xlane\b"), "vpop.xlane"),  # cross-lane (XLU) reduction pops
    (re.compile(r"vmatpush\d*\b"), "vmatpush"),  # MXU weight pushes (vmatpush3.bf16...)
    (re.compile(r"dma\.done\.wait\b"), "dma.wait"),
)


@dataclasses.dataclass(frozen=True)
class Bundle:
    """One VLIW bundle: its address, listing markers (``LB``, ``PF``...) and op texts."""

    address: int
    markers: tuple[str, ...]
    ops: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Loop:
    """Bundles ``[start, end]`` run ``trip_count`` times (None: no exit-test immediate)."""

    start: int
    end: int
    trip_count: int | None

    @property
    def bundles(self) -> int:
        return self.end - self.start + 1

    def contains(self, address: int) -> bool:
        return self.start <= address <= self.end


@dataclasses.dataclass(frozen=True)
class Branch:
    """A forward ``sbr.rel``: when taken, the bundles of ``skipped`` do not execute.

    ``predicate`` is the predicate register (``!`` = negated), None for an unconditional
    branch (always taken). ``depth`` counts the forward branches of the same scope (grid
    loop, or code outside it) whose skipped range holds this branch. ``mix`` counts the
    ops of the skipped range by family (``op_family``), nested bodies included.
    """

    address: int
    target: int
    predicate: str | None
    depth: int
    mix: Mapping[str, int]

    @property
    def skipped(self) -> range:
        return range(self.address + 1 + DELAY_SLOTS, self.target)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A parsed final-bundles listing: bundles, loops, forward branches."""

    bundles: tuple[Bundle, ...]
    loops: tuple[Loop, ...]
    branches: tuple[Branch, ...]

    @property
    def grid_loop(self) -> Loop:
        """The outermost (longest) loop: the Pallas grid."""
        return max(self.loops, key=lambda loop: loop.bundles)

    @property
    def outside_loop_bundles(self) -> int:
        """Straight-line bundles before and after the grid loop, run once per kernel call."""
        return len(self.bundles) - self.grid_loop.bundles

    def branches_in_loop(self) -> list[Branch]:
        """The forward branches inside the grid loop, in address order."""
        return [b for b in self.branches if self.grid_loop.contains(b.address)]

    def path_cost(self, skipped: Iterable[int] = ()) -> int:
        """Bundles executed by one grid-loop iteration when the forward branches at the
        addresses in ``skipped`` are taken and all other conditional ones fall through.

        Inner loops count their trip count times (once when it is only known at run time).
        Unconditional forward branches are always
        taken. A branch inside a skipped body may be listed or not: it does not matter.
        """
        skipped = set(skipped)
        loop_branches = {b.address: b for b in self.branches_in_loop()}
        unknown = skipped - loop_branches.keys()
        if unknown:
            raise ValueError(f"no forward branch in the grid loop at {sorted(unknown)}")
        taken = [b for b in loop_branches.values() if b.address in skipped or b.predicate is None]
        dead = set().union(*(b.skipped for b in taken))
        return self._range_cost(self.grid_loop.start, self.grid_loop.end + 1, dead)

    def _range_cost(self, lo: int, hi: int, dead: set[int]) -> int:
        """Live bundles of [lo, hi), each loop strictly inside it times its trip count."""
        cost, cursor = 0, lo
        for loop in self._child_loops(lo, hi):
            cost += _live(cursor, loop.start, dead)
            per_iteration = self._range_cost(loop.start, loop.end + 1, dead)
            # A loop whose exit test compares with a register has a run-time trip count
            # (Mosaic's copy of a partial edge block, for one): counted once, a floor.
            cost += per_iteration * (1 if loop.trip_count is None else loop.trip_count)
            cursor = loop.end + 1
        return cost + _live(cursor, hi, dead)

    def _child_loops(self, lo: int, hi: int) -> list[Loop]:
        """The outermost loops strictly inside [lo, hi), by address."""
        inside = [
            loop
            for loop in self.loops
            if lo <= loop.start and loop.end < hi and (loop.start, loop.end + 1) != (lo, hi)
        ]
        return [
            loop
            for loop in inside
            if not any(
                o is not loop and o.start <= loop.start and loop.end <= o.end for o in inside
            )
        ]


def _live(lo: int, hi: int, dead: set[int]) -> int:
    return sum(1 for address in range(lo, hi) if address not in dead)


def op_family(op: str) -> str:
    """The mix key of an op: a few merged families (``_FAMILIES``), else the opcode's
    first dotted part (``vmatmul``, ``vpow2``, ``vsel``, ``vcmp``, ``vld``, ``vst``...)."""
    match = _OPCODE.match(op)
    opcode = match.group(1) if match else op.strip()
    for pattern, family in _FAMILIES:
        if pattern.match(opcode):
            return family
    return opcode.split(".")[0]


# ---------------------------------------------------------------------------- parsing


class NoGridLoop(ValueError):
    """A listing without a loop: libtpu compiles a kernel of a single grid step straight
    through, and the per-step paths cannot be told from the code around them."""


def parse_bundles(text: str) -> Schedule:
    """Parse a ``*-final_bundles.txt`` listing (see the module docstring for its shape)."""
    bundles, region_start = [], {}
    exit_bundle = None
    for chunk in _bundle_chunks(text):
        bundle, trailing = _parse_bundle(chunk)
        for region in _REGION_START.findall(trailing):
            region_start.setdefault(int(region), bundle.address)
        if "exit bundle" in trailing:
            exit_bundle = bundle.address
        bundles.append(bundle)
    if exit_bundle is not None:
        # A branch past the whole program (a grid whose traced size is 0 skips its loop)
        # targets a region libtpu never starts: it starts at the exit bundle.
        for region in _BRANCH_TARGET.findall(text):
            region_start.setdefault(int(region), exit_bundle)
    if [b.address for b in bundles] != list(range(len(bundles))):
        raise ValueError("bundle addresses are not 0, 1, 2, ... in order")
    jumps = list(_branches(bundles, region_start))
    loops = tuple(
        sorted(
            (
                _loop(bundles, address, target, predicate)
                for address, target, predicate in jumps
                if target <= address
            ),
            key=lambda loop: (loop.start, -loop.end),
        )
    )
    if not loops:
        raise NoGridLoop("no loop in the listing: not a Pallas grid kernel")
    forward = [jump for jump in jumps if jump[1] > jump[0]]
    grid = max(loops, key=lambda loop: loop.bundles)
    return Schedule(tuple(bundles), loops, tuple(_forward_branches(bundles, forward, grid)))


def _bundle_chunks(text: str) -> Iterable[str]:
    """The text of each bundle: its first line plus continuation lines (multi-line comments)."""
    chunk: list[str] = []
    for line in text.splitlines():
        if _BUNDLE_START.match(line):
            if chunk:
                yield "\n".join(chunk)
            chunk = [line]
        elif chunk:
            chunk.append(line)
    if chunk:
        yield "\n".join(chunk)


def _parse_bundle(chunk: str) -> tuple[Bundle, str]:
    """The bundle and the text after its closing brace (region annotations live there).

    Comments nest (an op's comment may quote another op with its own ``/*...*/``) and may
    contain braces and ``;;``, so only brace and ``;;`` tokens outside comments count.
    """
    head = _BUNDLE_START.match(chunk)
    comment = brace = 0
    ops, op_start = [], head.end()
    for token in _TOKEN.finditer(chunk, head.end() - 1):
        kind = token.group()
        if kind in ("/*", "*/"):
            comment = comment + 1 if kind == "/*" else max(comment - 1, 0)
        elif comment:
            continue
        elif kind == "{":
            brace += 1
        elif kind == ";;" and brace == 1:
            ops.append(chunk[op_start : token.start()])
            op_start = token.end()
        elif kind == "}":
            brace -= 1
            if brace == 0:
                ops.append(chunk[op_start : token.start()])
                markers = tuple(re.findall(r"[A-Z]{2}", head.group(2)))
                ops = tuple(op.strip() for op in ops if op.strip())
                return Bundle(int(head.group(1), 0), markers, ops), chunk[token.end() :]
    raise ValueError(f"unterminated bundle: {chunk[:80]!r}")


def _branches(bundles: list[Bundle], region_start: dict[int, int]) -> Iterable[_Jump]:
    """(address, target address, predicate) of every ``sbr.rel``."""
    for bundle in bundles:
        for op in bundle.ops:
            match = _BRANCH.search(op)
            if match and int(match.group(2)) not in region_start:
                raise ValueError(f"branch at {bundle.address:#x} to a region that never starts")
            if match:
                yield bundle.address, region_start[int(match.group(2))], match.group(1)


def _loop(bundles: list[Bundle], address: int, target: int, predicate: str | None) -> Loop:
    """The loop closed by the backward branch at ``address``.

    Its trip count is the immediate of the ``/* loop exit test */`` compare that defines the
    branch predicate: the loop counts an index up from 0 and exits once index + 1 >= it.
    """
    end = address + DELAY_SLOTS
    register = (predicate or "").lstrip("!")
    for bundle in bundles[target : end + 1]:
        for op in bundle.ops:
            dest, test = _DEST.match(op), _EXIT_TEST.search(op)
            if register and test and dest and dest.group(1) == register:
                return Loop(target, end, int(test.group(1)))
    return Loop(target, end, None)


def _forward_branches(bundles: list[Bundle], forward: list[_Jump], grid: Loop) -> Iterable[Branch]:
    """Branch records with depth (within the same scope: grid loop or outside) and mix."""
    for address, target, predicate in forward:
        scope = grid.contains(address)
        depth = sum(
            1
            for other, other_target, _ in forward
            if grid.contains(other) == scope and other + 1 + DELAY_SLOTS <= address < other_target
        )
        body = bundles[address + 1 + DELAY_SLOTS : target]
        mix = collections.Counter(op_family(op) for bundle in body for op in bundle.ops)
        yield Branch(address, target, predicate, depth, dict(mix))


# ---------------------------------------------------------------------------- compiling

_dump_dir: str | None = None


def ensure_dump_flags() -> str:
    """Ask libtpu for final-bundle dumps into a process-wide temporary directory; return it.

    libtpu reads ``LIBTPU_INIT_ARGS`` once, when it loads: on the first topology lookup or
    even the first ``jax.devices()`` (JAX probes the TPU plugin). So this must run before
    either; afterwards the flags cannot take effect and this raises RuntimeError. Existing
    flags are kept (ours are appended, so a ``--xla_jf_dump_to`` inherited from a parent
    process is overridden). The directory is removed at exit.
    """
    global _dump_dir
    if _dump_dir is not None:
        return _dump_dir
    if libtpu_env.libtpu_loaded():
        raise RuntimeError(
            "libtpu already started without bundle-dump flags: run the TPU cost "
            "model in a fresh process that calls ensure_dump_flags() before JAX "
            "touches any device"
        )
    dump_dir = tempfile.mkdtemp(prefix="svgen_bundles_")
    atexit.register(shutil.rmtree, dump_dir, ignore_errors=True)
    flags = os.environ.get("LIBTPU_INIT_ARGS", "")
    os.environ["LIBTPU_INIT_ARGS"] = (
        f"{flags} --xla_jf_dump_to={dump_dir} --xla_jf_dump_llo_pass_label_regex=final_bundles"
    ).strip()
    libtpu_env.prepare()  # share libtpu with other processes; no warnings without a chip
    _dump_dir = dump_dir
    return dump_dir


@functools.cache
def _topology_device(target: str) -> jax.Device:
    """The first device of the target's AOT topology (starts libtpu, hence the flags first)."""
    from jax.experimental import topologies

    if target not in TOPOLOGIES:
        raise ValueError(f"unknown TPU target {target!r}; known: {sorted(TOPOLOGIES)}")
    ensure_dump_flags()
    return topologies.get_topology_desc(platform="tpu", topology_name=TOPOLOGIES[target]).devices[0]


def tpu_sharding(target: str = "v6e") -> jax.sharding.SingleDeviceSharding:
    """A sharding that places an argument on the AOT target, for ``jax.ShapeDtypeStruct``."""
    return jax.sharding.SingleDeviceSharding(_topology_device(target))


def compile_and_dump(fn: Callable, *args, kernel_name: str, target: str = "v6e") -> Schedule:
    """AOT-compile ``jax.jit(fn)(*args)`` for ``target`` and parse the final bundles of the
    Mosaic kernel named ``kernel_name`` (see ``compile_and_dump_kernels``)."""
    return compile_and_dump_kernels(fn, *args, kernel_names=[kernel_name], target=target)[
        kernel_name
    ]


def compile_and_dump_kernels(
    fn: Callable, *args, kernel_names: list[str], target: str = "v6e"
) -> dict[str, Schedule]:
    """AOT-compile ``jax.jit(fn)(*args)`` for ``target`` once and parse the final bundles of
    each Mosaic kernel in ``kernel_names`` (a forward and its backward kernels come from one
    compile of ``jax.grad``).

    A name matches the dump of the kernel called exactly that once JAX's transformation
    prefixes and suffixes are removed (``transpose_jvp_svgen_attention_dq__.1`` is
    ``svgen_attention_dq``), else the one dump whose name contains it.
    ``args`` are usually ``jax.ShapeDtypeStruct`` with ``sharding=tpu_sharding(target)``.
    Lowering runs under ``jax.default_device(<target device>)``: some Pallas TPU lowering
    rules (``jnp.sign``, used by integer ``//`` and ``%``) ask the default device for its
    chip, which is the CPU here. The dump files of this compile are deleted afterwards.
    Every call compiles (and dumps) anew, even for a function compiled before.
    """
    dump_dir = ensure_dump_flags()
    device = _topology_device(target)

    def fresh(*fn_args):  # a new function each call: JAX's caches would skip the compile
        return fn(*fn_args)

    before = set(os.listdir(dump_dir))
    with jax.default_device(device):
        jax.jit(fresh).lower(*args).compile()
    new = sorted(set(os.listdir(dump_dir)) - before)
    try:
        return {name: parse_bundles(_kernel_dump(dump_dir, new, name)) for name in kernel_names}
    finally:
        for name in new:
            os.remove(os.path.join(dump_dir, name))


_DUMP_NAME = re.compile(r"\d+-(.+)-\d+-final_bundles\.txt")


def compile_programs(fn: Callable, *args, target: str = "v6e") -> tuple[dict[str, str], object]:
    """AOT-compile ``jax.jit(fn)(*args)`` for ``target``; return the final-bundles listing of
    every program of that compile by dump name (``convert_reduce_fusion``, ``TLP``, a
    Pallas kernel's name...; a second program of one name gets ``#2``) and the compiled
    object. As ``compile_and_dump_kernels`` (lowering under the target device, a fresh
    function so that JAX's caches never skip the compile); the dump files are deleted
    afterwards, also after a failed compile."""
    dump_dir = ensure_dump_flags()
    device = _topology_device(target)

    def fresh(*fn_args):
        return fn(*fn_args)

    before = set(os.listdir(dump_dir))
    dumps: dict[str, str] = {}
    try:
        with jax.default_device(device):
            compiled = jax.jit(fresh).lower(*args).compile()
        for file in sorted(set(os.listdir(dump_dir)) - before):
            match = _DUMP_NAME.fullmatch(file)
            if not match:
                continue
            name, n = match.group(1), 1
            while name in dumps:  # two programs of one name: keep both
                n += 1
                name = f"{match.group(1)}#{n}"
            with open(os.path.join(dump_dir, file)) as dump:
                dumps[name] = dump.read()
    finally:
        for file in set(os.listdir(dump_dir)) - before:
            os.remove(os.path.join(dump_dir, file))
    if not dumps:
        raise RuntimeError(
            "libtpu wrote no bundle dump: it was started without the dump flags "
            "(run in a fresh process that calls ensure_dump_flags() first)"
        )
    return dumps, compiled


def rough_cycles(text: str) -> int | None:
    """Rough cycles of a non-Pallas program (an XLA op): bundles outside its longest loop +
    trip count x one iteration with every conditional forward branch falling through; a
    listing without loops counts its bundles. None where an inner loop has no trip count."""
    try:
        schedule = parse_bundles(text)
    except ValueError as error:
        if "no loop" not in str(error):
            raise
        return sum(1 for line in text.splitlines() if _BUNDLE_START.match(line))
    loop = schedule.grid_loop
    try:
        return schedule.outside_loop_bundles + (loop.trip_count or 1) * schedule.path_cost()
    except ValueError:
        return None


_STARTED = re.compile(r"Start(?:/End empty)? region (\d+)")
_TARGET = re.compile(r"target\s*=\s*\$region(\d+)")


def with_exit_regions(text: str) -> str:
    """Mark the regions that branches target but the listing never starts at its exit
    bundle (what libtpu's scatter loops jump to), so that `parse_bundles` can parse it."""
    missing = sorted(set(map(int, _TARGET.findall(text))) - set(map(int, _STARTED.findall(text))))
    if not missing:
        return text
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if _BUNDLE_START.match(line))
    if "exit bundle" not in lines[last]:
        return text  # not the known shape: left to fail (reported as uncounted)
    lines[last] += " /* " + " :: ".join(f"Start region {n}" for n in missing) + " */"
    return "\n".join(lines)


def program_cycles(text: str) -> tuple[int | None, bool]:
    """(rough cycles of one XLA program's listing, whether some loop's trip count is a
    run-time value: then the count is a floor); None cycles when it cannot be counted."""
    text = with_exit_regions(text)
    try:
        cycles = rough_cycles(text)
        floor = any(loop.trip_count is None for loop in parse_bundles(text).loops)
    except NoGridLoop:
        floor = False
    except ValueError:
        return None, False
    return cycles, floor


def emitting_functions(hlo: str, source_suffix: str | tuple[str, ...]) -> dict[str, str]:
    """HLO instruction name -> the innermost function of a source file ending in
    `source_suffix` (or one of them) on its stack ("other" when none is), from the optimized module's
    stack-frame tables (``compiled.as_text()``): which stage of a program emitted each op."""
    tables = {
        name: dict(re.findall(r"^(\d+) (.*)$", body, re.M))
        for name, body in re.findall(r"^(\w+)\n((?:\d+ .*\n)+)", hlo, re.M)
    }
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations, frames = tables.get("FileLocations", {}), tables.get("StackFrames", {})

    def stage(frame: int) -> str:
        seen = 0
        while str(frame) in frames and seen < len(frames):
            location, parent = re.findall(r"=(\d+)", frames[str(frame)])[:2]
            file_id, function_id = re.findall(r"=(\d+)", locations.get(location, ""))[:2]
            if files[file_id].strip('"').endswith(source_suffix):
                return functions[function_id].strip('"').split(".")[-1]
            frame, seen = int(parent) - 1, seen + 1  # the listing prints the caller's id + 1
        return "other"

    out = {}
    for name, meta in re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?metadata=\{([^}]*)\}", hlo, re.M):
        frame = re.search(r"stack_frame_id=(\d+)", meta)
        out[name] = stage(int(frame.group(1))) if frame else "other"
    return out


def _base_name(dump: str) -> str:
    """The kernel's own name in a dump file name: ``<id>-<name>-<nn>-final_bundles.txt``,
    without JAX's transformation prefixes (``jvp_``, ``transpose_``) and suffixes (``_``,
    ``.1``)."""
    return base_kernel_name(dump.split("-", 1)[1].rsplit("-", 2)[0])


def base_kernel_name(name: str) -> str:
    """A program's name in a dump (compile_programs' keys) without JAX's transformation
    prefixes and suffixes and compile_programs' `#n`: ``transpose_jvp_svgen_attention_dkv__.1``
    is ``svgen_attention_dkv``."""
    name = re.sub(r"^(?:(?:jvp|transpose|vmap|remat|checkpoint)_)+", "", name.split("#")[0])
    return re.sub(r"_*(?:\.\d+)?$", "", name)


def _kernel_dump(dump_dir: str, names: list[str], kernel_name: str) -> str:
    """The text of the one new final-bundles file of ``kernel_name``."""
    dumps = [n for n in names if re.fullmatch(r"\d+-.+-\d+-final_bundles\.txt", n)]
    if not dumps:
        raise RuntimeError(
            "libtpu wrote no bundle dump: it was started without the dump flags "
            "(run in a fresh process that calls ensure_dump_flags() first), or "
            "the compile came from a cache"
        )
    hits = [n for n in dumps if _base_name(n) == kernel_name]
    if not hits:
        hits = [n for n in dumps if kernel_name in n.split("-", 1)[1].rsplit("-", 2)[0]]
    if len(hits) != 1:
        raise RuntimeError(
            f"expected one final_bundles dump for {kernel_name!r}, got {hits} among {dumps}"
        )
    with open(os.path.join(dump_dir, hits[0])) as dump:
        return dump.read()
