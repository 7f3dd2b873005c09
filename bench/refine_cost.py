"""What building a call's tables on device costs, next to the attention kernel it feeds.

    .venv/bin/python bench/refine_cost.py [--permute module|gather|transpose] [--spec NAME ...]
        [--backward] [--per-video]

For each shipped Wan 2.1 720p spec (``specs/wan21_720p_*.yaml``, 75,600 tokens) this builds
``StaticVisits`` from every pattern's runs in the generated module (``generated/<name>.py``)
and jit-compiles, ahead of time for TPU v6e with libtpu on this host, the whole on-device
path of one call (``svgen.runtime.refine``): per-token segment ids int32 [seq_len] in the
user's order -> each pattern's kernel order -> ``block_segment_ranges`` of the compute block
rows and columns -> ``segment_words`` -> ``refine``, for every pattern of the spec in one
program. ``--permute module`` (the default) runs exactly what a generated module with a
``runtime:`` section runs per call (svgen.runtime.segments: query and key ids, each layout's
order by ``TokenLayout.to_kernel``, the refined pieces of every pattern, the per-row
(batch x heads) first-piece and count tables and the [heads, 1, seq] id rows the kernel
reads), for one batch element and the spec's heads; ``--backward`` adds the dk/dv walk's
transposed tables, which a jax.grad call builds too; ``--per-video`` compiles each spec with
``runtime: {segments: true, per_video_frames: true}`` first and counts that module's path
(segment starts per token, each block's kind at its segment's start from the frame tree;
svgen.runtime.video_frames). The other two time the bare pipeline:
``gather`` indexes the ids with the layout's permutation, any layout; ``transpose`` writes
the temporal-major order as a reshape and a transpose (checked equal to the layout's
permutation, in NumPy; other orders still gather).

Counting, as ``bench/splash_cost.py`` counts the XLA ops of its backward: libtpu writes the
final VLIW bundles of every program of the compile (each fusion, the top-level program
``TLP``); one bundle issues per cycle. A listing's rough cycles are its bundles outside its
longest loop + that loop's trip count x one iteration with every conditional forward branch
falling through (``splash_cost._rough_cycles``). It is rough: loops whose trip count is a
register are counted once (a floor; such ops are marked), DMA waits count one bundle, and
the ops are summed as if run one after another. Some scatter listings branch to a region
whose start libtpu never marks (the exit bundle); that region is marked there before
parsing. Each op is attributed to the function of ``refine.py`` (or of this script) that
emitted it, from the stack frames of the optimized HLO, to say what dominates.

Next to it: the attention kernel's modelled cycles for the same spec
(``svgen.estimate.cost.cost_plan``, cached under ~/.cache/svgen/cost; one kernel compile per spec the first time), for the heads
as ``svgen cost`` assigns them (run-time specs: candidates in turn). The program's memory is
read from the compiled executable (``memory_analysis``: arguments, outputs, temporaries) and
its ``cost_analysis`` bytes accessed (XLA's per-op estimate: its gathers count far more
than their operands hold, 1.4 GB for the 296 KiB of ids, so it is no measure of traffic).
Microseconds use the clock in ``svgen.analysis.targets``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from svgen.estimate import tpu_schedule  # noqa: E402

tpu_schedule.ensure_dump_flags()  # before anything starts libtpu

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from splash_cost import _compile_dumps  # noqa: E402
from svgen.estimate import cost  # noqa: E402
from svgen.analysis import analyze  # noqa: E402
from svgen.runtime.refine import (  # noqa: E402
    StaticVisits,
    block_segment_ranges,
    refine,
    segment_words,
)
from svgen.runtime import segments  # noqa: E402
from svgen.spec import parse_spec  # noqa: E402
from svgen.analysis.targets import TARGETS  # noqa: E402

TARGET = "v6e"
GOAL = 0.02  # issue 20: refinement at most 2% of the kernel's modelled time
SPECS = sorted(p.stem for p in (REPO / "specs").glob("wan21_720p_*.yaml"))
PERMUTE_STAGE = "ids to kernel order"


# ----------------------------------------------------------------------------- the program


def load_module(name: str, per_video: bool = False):
    """The generated module of a shipped spec, imported from its file; per_video: the spec
    compiled with per-video frame numbering of run-time segments, into a temporary directory."""
    path = REPO / "generated" / f"{name}.py"
    if per_video:
        import tempfile

        from svgen import codegen

        text = (REPO / "specs" / f"{name}.yaml").read_text()
        text += "runtime: {segments: true, per_video_frames: true}\n"
        plan = analyze(parse_spec(text, source=f"specs/{name}.yaml"))
        directory = pathlib.Path(tempfile.mkdtemp(prefix="svgen_refine_cost_"))
        for filename, data in codegen.render(plan, f"specs/{name}.yaml").items():
            (directory / filename).write_bytes(data)
        path = directory / codegen.module_filename(plan.spec.name)
    spec = importlib.util.spec_from_file_location(f"_refine_cost_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pattern_visits(module) -> list[StaticVisits]:
    """Each pattern's static visits (with per-video frames, its superset's), at the module's
    compute blocks per tile."""
    shape = module.SHAPE
    return [
        StaticVisits.from_runs(
            p.video_frames.runs if getattr(p, "video_frames", None) else p.runs,
            shape.q_blocks_per_tile,
            shape.kv_blocks_per_tile,
        )
        for p in module._PATTERNS
    ]


def to_kernel_order(ids, layout, how: str):
    """Segment ids in the user's order -> the pattern's kernel order (traced)."""
    if layout.is_identity:
        return ids
    if how == "transpose" and layout.is_temporal_major:
        return _temporal_major(ids, layout)
    return ids[jnp.asarray(layout.original_index(np.arange(layout.seq_len)), jnp.int32)]


def _temporal_major(ids, layout):
    """Text and anchor frames in place, the other frames' places as a [places, frames]
    transpose of the [frames, places] block (works on jnp and NumPy arrays)."""
    xp = jnp if isinstance(ids, jax.Array) else np
    start, size = layout.main_start, layout.main_frames * layout.tokens_per_frame
    main = ids[start : start + size].reshape(layout.main_frames, layout.tokens_per_frame)
    return xp.concatenate([ids[:start], main.T.reshape(-1), ids[start + size :]])


def check_transpose(layout) -> None:
    """The transpose form is the layout's permutation (NumPy, before anything compiles)."""
    if layout.is_temporal_major:
        ids = np.arange(layout.seq_len)
        assert np.array_equal(_temporal_major(ids, layout), layout.original_index(ids))


def module_tables(module, backward: bool = False):
    """ids int32 [seq_len] -> the call's tables and id rows, as the module's attention builds
    them (svgen.runtime.segments), for the spec's heads (each on its default pattern, or on
    the candidates in turn when they are chosen at run time)."""
    layouts = []
    for p in module._PATTERNS:
        if p.layout not in layouts:
            layouts.append(p.layout)
    layout_index = tuple(layouts.index(p.layout) for p in module._PATTERNS)
    runs = [p.runs for p in module._PATTERNS]
    slots = module.SLOTS_PER_PIECE
    runtime = module.attention.runtime
    video = tuple(p.video_frames for p in module._PATTERNS) if runtime.per_video_frames else ()
    pattern_layouts = tuple(p.layout for p in module._PATTERNS)

    def walk(walk_slots: int, transposed: bool):
        return segments.SegmentTables.build(
            runs, layout_index, module.SHAPE, walk_slots, transposed, video, pattern_layouts
        )

    walks = [walk(slots, False)]
    if backward:
        from svgen.runtime.backward import transposed_tables

        walks.append(walk(transposed_tables(runs, module.SHAPE, module.HEADS).slots, True))
    assign = module.HEAD_PATTERN or [h % len(runs) for h in range(module.HEADS)]
    head_pattern = jnp.asarray(assign, jnp.int32)
    head_layout = jnp.asarray(layout_index, jnp.int32)[head_pattern]

    def run(ids):
        if runtime.segments:  # the module's own path (per-video starts included)
            call_ids = segments.call_ids(runtime, ids, None, None, layouts)
        else:  # a static module: the path a `runtime: {segments: true}` one would run
            ids = segments.user_order_ids(ids, None, 1, layouts[0])
            call_ids = segments.CallIds(*(segments.layout_order_ids(x, layouts) for x in ids))
        rows = segments.kernel_id_rows(call_ids, head_layout)
        return [walk.tables(call_ids, head_pattern) for walk in walks], rows

    return run


def call_tables(module, visits: list[StaticVisits], how: str):
    """ids int32 [seq_len] -> every pattern's RefinedPieces: one call's on-device path."""
    shape = module.SHAPE
    kv_blocks = -(-shape.seq_len // shape.block_kv) * shape.kv_blocks_per_tile

    def run(ids):
        pieces = []
        for pattern, v in zip(module._PATTERNS, visits):
            kernel_ids = to_kernel_order(ids, pattern.layout, how)
            q_lo, q_hi = block_segment_ranges(
                kernel_ids, shape.cq, v.num_q_tiles * v.q_blocks_per_tile
            )
            kv_lo, kv_hi = block_segment_ranges(kernel_ids, shape.ckv, kv_blocks)
            words = segment_words(v, q_lo, q_hi, kv_lo, kv_hi)
            pieces.append(refine(v, words, module.SLOTS_PER_PIECE))
        return pieces

    return run


# ------------------------------------------------------------------------------ counting


with_exit_regions = tpu_schedule.with_exit_regions
op_cycles = tpu_schedule.program_cycles


def op_stages(hlo: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (its op name, the stage that emitted it): the innermost
    function of refine.py (``refine / _scatter``...) or of this script, from the optimized
    module's stack-frame tables."""
    tables = {
        name: dict(re.findall(r"^(\d+) (.*)$", body, re.M))
        for name, body in re.findall(r"^(\w+)\n((?:\d+ .*\n)+)", hlo, re.M)
    }
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations, frames = tables.get("FileLocations", {}), tables.get("StackFrames", {})

    def chain(frame: int) -> list[tuple[str, str]]:  # (file, function), innermost first
        out = []
        while str(frame) in frames and len(out) < len(frames):
            location, parent = re.findall(r"=(\d+)", frames[str(frame)])[:2]
            file_id, function_id = re.findall(r"=(\d+)", locations.get(location, ""))[:2]
            out.append((files[file_id].strip('"'), functions[function_id].strip('"')))
            frame = int(parent) - 1  # the listing prints the caller's id + 1 (1: no caller)
        return out

    def stage(frame: int) -> str:
        calls = chain(frame)
        mine = [
            f
            for path, f in calls
            if path.endswith("runtime/refine.py") or path.endswith("runtime/segments.py")
        ]
        if mine:
            inner, outer = mine[0], mine[-1].split(".")[0]
            return outer if inner.split(".")[0] == outer else f"{outer} / {inner.split('.')[0]}"
        if any(f in ("to_kernel_order", "_temporal_major", "to_kernel") for _, f in calls):
            return PERMUTE_STAGE
        return "other"

    out = {}
    for name, meta in re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?metadata=\{([^}]*)\}", hlo, re.M):
        op = re.search(r'op_name="([^"]*)"', meta)
        frame = re.search(r"stack_frame_id=(\d+)", meta)
        out[name] = (op.group(1) if op else "", stage(int(frame.group(1))) if frame else "other")
    return out


def memory(compiled) -> dict:
    """Bytes the executable reports: arguments, outputs, temporaries; XLA's bytes accessed."""
    stats = compiled.memory_analysis()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis or {}
    return {
        "arguments": getattr(stats, "argument_size_in_bytes", None),
        "outputs": getattr(stats, "output_size_in_bytes", None),
        "temporaries": getattr(stats, "temp_size_in_bytes", None),
        "bytes_accessed": analysis.get("bytes accessed"),
    }


# ------------------------------------------------------------------------------ one spec


def kernel_cycles(name: str) -> int:
    """The attention kernel's modelled cycles for one call (``svgen cost``'s model)."""
    path = f"specs/{name}.yaml"
    plan = analyze(parse_spec((REPO / path).read_text(), source=path))
    return cost.cost_plan(plan, path).cycles


def measure(name: str, how: str, backward: bool = False, per_video: bool = False) -> dict:
    """One spec: its patterns, the refinement program's ops and cycles, the kernel's."""
    module = load_module(name, per_video)
    visits = pattern_visits(module)
    for pattern in module._PATTERNS:
        check_transpose(pattern.layout)
    ids = jax.ShapeDtypeStruct(
        (module.SHAPE.seq_len,), jnp.int32, sharding=tpu_schedule.tpu_sharding(TARGET)
    )
    program = (
        module_tables(module, backward) if how == "module" else call_tables(module, visits, how)
    )
    dumps, compiled = _compile_dumps(program, ids, target=TARGET)
    stages = op_stages(compiled.as_text())
    ops = []
    for dump, text in dumps.items():
        cycles, floor = op_cycles(text)
        op_name, stage = stages.get(dump.split("#")[0], ("", "program (TLP, init)"))
        ops.append({"name": dump, "op": op_name, "stage": stage, "cycles": cycles, "floor": floor})
    return {
        "spec": name,
        "patterns": [
            (p.name, p.layout.order, v.num_visits, v.max_pieces)
            for p, v in zip(module._PATTERNS, visits)
        ],
        "ops": ops,
        "cycles": sum(op["cycles"] or 0 for op in ops),
        "kernel_cycles": kernel_cycles(name),
        "memory": memory(compiled),
    }


# ------------------------------------------------------------------------------- report


def by_stage(ops: list[dict]) -> list[tuple[str, int]]:
    totals = collections.Counter()
    for op in ops:
        totals[op["stage"]] += op["cycles"] or 0
    return totals.most_common()


def _kib(n) -> str:
    return "?" if n is None else f"{n / 1024:,.1f}"


def print_summary(rows: list[dict], clock_ghz: float) -> None:
    print(
        "| spec | patterns | static visits | max pieces | refine cycles | refine us "
        f"| of which {PERMUTE_STAGE} | kernel cycles | refine / kernel | HBM KiB in / out / "
        "temp | bytes accessed (XLA est.) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        patterns = ", ".join(
            name if order == "frame_major" else f"{name} ({order})"
            for name, order, _, _ in r["patterns"]
        )
        visits = " + ".join(f"{v:,}" for _, _, v, _ in r["patterns"])
        pieces = " + ".join(f"{p:,}" for _, _, _, p in r["patterns"])
        permute = dict(by_stage(r["ops"])).get(PERMUTE_STAGE, 0)
        m = r["memory"]
        accessed = "?" if m["bytes_accessed"] is None else f"{m['bytes_accessed'] / 2**20:,.1f} MiB"
        share = r["cycles"] / r["kernel_cycles"]
        print(
            f"| {r['spec']} | {patterns} | {visits} | {pieces} | {r['cycles']:,} "
            f"| {r['cycles'] / (clock_ghz * 1e3):,.1f} | {permute:,} | {r['kernel_cycles']:,} "
            f"| {share:.2%}{'' if share <= GOAL else ' **over**'} "
            f"| {_kib(m['arguments'])} / {_kib(m['outputs'])} / {_kib(m['temporaries'])} "
            f"| {accessed} |"
        )


def print_breakdown(row: dict, top: int = 5) -> None:
    ops = row["ops"]
    uncounted = [op["name"] for op in ops if op["cycles"] is None]
    floors = [op for op in ops if op["floor"]]
    print(f"\n{row['spec']}: {len(ops)} XLA programs, {row['cycles']:,} cycles", end="")
    print(f"; {len(floors)} with a run-time trip count (counted once: a floor)", end="")
    print(f"; not parsed: {', '.join(uncounted)}" if uncounted else "")
    stages = ", ".join(f"{s} {c:,} ({c / row['cycles']:.0%})" for s, c in by_stage(ops) if c)
    print(f"  by stage: {stages}")
    heaviest = sorted(ops, key=lambda op: -(op["cycles"] or 0))[:top]
    listed = "; ".join(
        f"{op['name']} [{op['op'].rsplit('/', 1)[-1] or '-'}, {op['stage']}] "
        f"{'>=' if op['floor'] else ''}{op['cycles']:,}"
        for op in heaviest
    )
    print(f"  heaviest: {listed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--permute", choices=("module", "gather", "transpose"), default="module")
    parser.add_argument(
        "--backward", action="store_true", help="module: also the dk/dv walk's tables"
    )
    parser.add_argument("--spec", action="append", choices=SPECS, help="default: all")
    parser.add_argument(
        "--per-video", action="store_true", help="module: with per-video frame numbering"
    )
    args = parser.parse_args()
    if args.per_video and args.permute != "module":
        parser.error("--per-video counts the module's own path: use --permute module")
    clock = TARGETS[TARGET].clock_ghz
    rows = []
    names = args.spec or SPECS
    if args.per_video:  # a select policy takes no run-time segments (yet)
        names = [n for n in names if "select:" not in (REPO / "specs" / f"{n}.yaml").read_text()]
    for name in names:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        rows.append(measure(name, args.permute, args.backward, args.per_video))
    print(
        f"On-device table refinement (segment ids -> block ranges -> words -> pieces, every "
        f"pattern; ids to kernel order by {args.permute}"
        f"{', forward and dk/dv tables' if args.backward else ''}"
        f"{', per-video frames' if args.per_video else ''}), {TARGET} at {clock} GHz: rough XLA "
        f"cycles from libtpu's bundles, against the kernel's modelled cycles (svgen cost); "
        f"goal <= {GOAL:.0%}\n"
    )
    print_summary(rows, clock)
    for row in rows:
        print_breakdown(row)


if __name__ == "__main__":
    main()
