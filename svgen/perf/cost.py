"""`svgen cost`: a static model of a generated kernel's time on a TPU, from libtpu's schedule.

libtpu compiles the kernel for the target on this host (`svgen.perf.measure`) and the bundles
of each control-flow path of one grid step are read from its schedule (`svgen.perf.paths`,
whose docstring maps the kernel's phases onto paths). This module is the model over those
costs and the report of a spec: `cost_plan`, `model_cycles` and the report dataclasses; the
report's text is `svgen.perf.cost_text`.

The modelled time is the sum over the tables of every head of the cost of each step (read
from the same tables the kernel walks) plus the pipeline's two extra iterations. It is a
*static* model: no DMA stalls (a FULL step's K/V fetch hides under its compute), no clock
measured (the target's assumed clock converts cycles to ms). Ratios between kernels compiled
by the same toolchain are the reliable output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import re

import numpy as np

from svgen.spec.errors import SpecError
from svgen.core.kinds import TileKind
from svgen.perf.measure import (
    PolicyCost,
    TrainingPaths,
    dkv_tables,
    measure_chunk_paths,
    measure_paths,
    measure_select_policy,
    measure_training_paths,
)

# PathCosts and SEGMENT_BOUNDARY live in svgen.perf.paths (tests import them from here too).
from svgen.perf.paths import SEGMENT_BOUNDARY, PathCosts


def _v5e():
    """What the chip showed (svgen.analysis.targets.V5E_MEASURED): the figures quoted here."""
    from svgen.analysis.targets import V5E_MEASURED

    return V5E_MEASURED


def _model_caveat() -> str:
    m = _v5e()
    least, most, typical = m.model_typical
    return (
        "an estimate from libtpu's static schedule, not a measurement: on a TPU v5e the chip "
        f"took {least:.2f}-{most:.2f}x its figures in {typical} of {m.model_pairs} one-level "
        f"tilings of the shipped specs, but up to {m.model_worst:.1f}x where the kernel's "
        "program was large (docs/measured.md); time a spec on a chip with `svgen bench`"
    )


#: What every figure of `svgen cost` and `svgen tune` is, said beside them: the static model
#: is not calibrated to a chip, and this is its error measured on one.
MODEL_CAVEAT = _model_caveat()


def program_caveat(
    bundles: int, residual_masks: bool = False, straight_words: bool = False
) -> str | None:
    """What the chip showed for a program this large, or None (not read, or small enough);
    residual_masks / straight_words: the kernel has them, the code the static model chose
    that makes programs large (docs/measured.md, "The program-size cliff"). The model does
    not see a program's size."""
    m = _v5e()
    fine, slow = m.program_fast_bundles, m.program_slow_bundles
    if bundles <= fine:
        return None
    lo, hi = m.program_slowdown
    slower = f"{lo:.1f}-{hi:.1f}x slower than a smaller program of the same spec"
    seen = (
        f"programs of {slow:,} bundles or more ran {slower}"
        if bundles >= slow
        else f"programs of {fine:,} to {slow:,} bundles were not measured, larger ones ran "
        + slower
    )
    without = [
        setting
        for setting, present in (
            ("kernel.RESIDUAL_MASKS=False", residual_masks),
            ("straight.MAX_WORDS=0", straight_words),
        )
        if present
    ]
    smaller = (
        f"; `bench/kernel_ab.py --runtime {' / '.join(without)}` times it without the code "
        "that makes it large"
        if without
        else ""
    )
    return (
        f"the kernel's program is {bundles:,} bundles: on a TPU v5e {seen} (docs/measured.md, "
        f"the program-size cliff); time it with `svgen bench`, or take a smaller tiling{smaller}"
    )


@dataclasses.dataclass(frozen=True)
class CostReport:
    target: str
    clock_ghz: float
    paths: PathCosts
    steps: dict  # per kind over all heads: {"full": n, "mixed": n, "empty": n, "skipped": n}
    cycles: int
    cycles_by_path: dict
    dense_cycles: int | None
    vmem_bytes: int
    smem_bytes: int
    heads: int
    training: "TrainingReport | None" = None
    chunks: "ChunkReport | None" = None  # runtime.kv_cache: the chunked calls
    # select: the call's bounds, {"none": (cycles, steps), "all": (cycles, steps)}: nothing
    # selected (the mask alone) and every selectable block selected (the tables' maximum)
    select: dict | None = None
    utilisation: "Utilisation | None" = None  # None: a select spec (its work depends on a call)
    # attention.softmax: bounded: (cycles, dense cycles) if every q tile fell back to the
    # online softmax (the paths' `fallback`); `cycles` is every q tile within the bound.
    fallback: tuple[int, int] | None = None
    # select: the per-call selection program's counts and the cycles reading q and k once
    # at HBM bandwidth (measure_select_policy, pooling_floor)
    policy: tuple[PolicyCost, int] | None = None
    # attention.softmax: bounded: the XLA pass over k before the kernel (each row's largest
    # key norm, svgen.runtime.softmax.key_bound), in cycles at HBM bandwidth; not in `cycles`
    key_pass: int | None = None
    # The dense kernel (every pair kept) at the fastest of the spec's own tiling and
    # DENSE_TILINGS, by the model: (tiling (bq, bkv, cq, ckv), cycles, tilings modelled);
    # None: not searched
    dense_best: tuple[tuple[int, int, int, int], int, int] | None = None

    @property
    def call_cycles(self) -> int:
        """The call: the kernel and, for a bounded softmax, its pass over k."""
        return self.cycles + (self.key_pass or 0)

    @property
    def ms(self) -> float:
        return self.cycles / (self.clock_ghz * 1e6)

    @property
    def policy_cycles(self) -> int | None:
        """The selection program's cycles, pooling at least at HBM speed (None: no select)."""
        return None if self.policy is None else self.policy[0].cycles(self.policy[1])

    def to_json(self) -> dict:
        return {
            "estimate": MODEL_CAVEAT,
            "target": self.target,
            "clock_ghz": self.clock_ghz,
            "cycles": self.cycles,
            "ms": self.ms,
            "paths": self.paths.to_json(),
            "steps": self.steps,
            "cycles_by_path": self.cycles_by_path,
            "dense_cycles": self.dense_cycles,
            "dense_ms": None
            if self.dense_cycles is None
            else self.dense_cycles / (self.clock_ghz * 1e6),
            "vmem_bytes": self.vmem_bytes,
            "smem_bytes": self.smem_bytes,
            "heads": self.heads,
            "model": "static: libtpu's bundle schedule, no DMA stalls, clock assumed",
            **(
                {} if self.training is None else {"training": self.training.to_json(self.clock_ghz)}
            ),
            **({} if self.chunks is None else {"chunks": self.chunks.to_json(self.clock_ghz)}),
            **(
                {}
                if self.fallback is None
                else {
                    "fallback": {
                        "cycles": self.fallback[0],
                        "ms": self.fallback[0] / (self.clock_ghz * 1e6),
                        "dense_cycles": self.fallback[1],
                    }
                }
            ),
            **({} if self.utilisation is None else {"utilisation": self.utilisation.to_json(self)}),
            **({} if self.key_pass is None else {"key_pass_cycles": self.key_pass}),
            **(
                {}
                if self.dense_best is None
                else {
                    "dense_best": {
                        "tiling": list(self.dense_best[0]),
                        "cycles": self.dense_best[1],
                        "ms": self.dense_best[1] / (self.clock_ghz * 1e6),
                        "tilings_modelled": self.dense_best[2],
                    }
                }
            ),
            **(
                {}
                if self.select is None
                else {
                    "select": {
                        **{
                            bound: {"cycles": c, "ms": c / (self.clock_ghz * 1e6), "steps": st}
                            for bound, (c, st) in self.select.items()
                        },
                        **(
                            {}
                            if self.policy is None
                            else {
                                "policy": {
                                    "cycles": self.policy_cycles,
                                    "ms": self.policy_cycles / (self.clock_ghz * 1e6),
                                    "pooling_floor": self.policy[1],
                                    **self.policy[0].to_json(),
                                }
                            }
                        ),
                    }
                }
            ),
        }


@dataclasses.dataclass(frozen=True)
class Utilisation:
    """Useful work of one call over all heads against the chip's bf16 peak: 4 x head_dim
    FLOPs per pair the kernel's mask keeps (QK^T and PV, 2 x head_dim each; padding, masked
    entries of visited blocks and the softmax are not useful work), at the modelled time.

    The peak is the published one. On v6e the MXU issue rate in libtpu's schedule is 512
    bundles per 512 x 512 block at head_dim 128 (262,144 FLOP per bundle), which at the
    assumed 1.75 GHz is 458.8 TFLOP/s, half the published 918: a modelled kernel cannot show
    more than 50% there, and the clock the model assumes is likely low by up to 2x (cycle
    ratios, which every speedup is, do not depend on it)."""

    flops: int  # of the mask's kept pairs (a lower bound when `exact` is False)
    exact: bool  # every head's pattern has an exact pair count
    dense_flops: int  # every pair of every head: the work of the dense kernel
    peak_flops_per_s: float  # Target.bf16_flops_per_core_s

    def to_json(self, report: "CostReport") -> dict:
        rate = _flops_per_s(self.flops, report.cycles, report.clock_ghz)
        out = {
            "useful_flops": self.flops,
            "useful_flops_exact": self.exact,
            "useful_flops_per_s": rate,
            "peak_flops_per_s": self.peak_flops_per_s,
            "of_peak": rate / self.peak_flops_per_s,
        }
        if report.dense_cycles:
            dense = _flops_per_s(self.dense_flops, report.dense_cycles, report.clock_ghz)
            out["dense_of_peak"] = dense / self.peak_flops_per_s
        return out


def _flops_per_s(flops: int, cycles: int, clock_ghz: float) -> float:
    return flops * clock_ghz * 1e9 / cycles


def utilisation(plan) -> Utilisation | None:
    """Useful FLOPs of a call under the plan's head assignment (`model_head_pattern`)."""
    if plan.spec.select is not None:
        return None
    heads = model_head_pattern(plan)
    counts = [plan.patterns[p].classification for p in heads]
    per_pair = 4 * plan.spec.attention.head_dim
    return Utilisation(
        flops=per_pair * sum(c.kept_pairs for c in counts),
        exact=all(c.density_is_exact for c in counts),
        dense_flops=per_pair * len(heads) * plan.patterns[0].total_pairs,
        peak_flops_per_s=plan.target.bf16_flops_per_core_s,
    )


@dataclasses.dataclass(frozen=True)
class ChunkReport:
    """The chunked calls of a `runtime.kv_cache` module (svgen.runtime.chunks): the chunk
    kernel's paths (it reads per-row tables and the chunk's first token), and per chunk
    position one call's steps and cycles over all heads."""

    chunk_frames: int
    paths: PathCosts
    steps: tuple[dict, ...]
    cycles: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.cycles)

    def to_json(self, clock_ghz: float) -> dict:
        return {
            "chunk_frames": self.chunk_frames,
            "paths": self.paths.to_json(),
            "positions": [
                {
                    "first_frame": i * self.chunk_frames,
                    "steps": steps,
                    "cycles": cycles,
                    "ms": cycles / (clock_ghz * 1e6),
                }
                for i, (steps, cycles) in enumerate(zip(self.steps, self.cycles))
            ],
            "total_cycles": self.total,
            "total_ms": self.total / (clock_ghz * 1e6),
        }


@dataclasses.dataclass(frozen=True)
class TrainingReport:
    """One forward + backward call (what a training step runs), from `svgen cost --backward`:
    cycles per kernel over all heads, the same kernels on a dense mask, their paths."""

    paths: TrainingPaths
    cycles: dict  # forward (with lse), dq, dkv
    steps: dict  # per kernel: steps per kind
    dense_cycles: dict

    @property
    def backward(self) -> int:
        return sum(v for k, v in self.cycles.items() if k != "forward")

    @property
    def total(self) -> int:
        return self.cycles["forward"] + self.backward

    def to_json(self, clock_ghz: float) -> dict:
        dense_total = sum(self.dense_cycles.values())
        return {
            "cycles": self.cycles,
            "backward_cycles": self.backward,
            "total_cycles": self.total,
            "total_ms": self.total / (clock_ghz * 1e6),
            "backward_over_forward": self.backward / self.cycles["forward"],
            "steps": self.steps,
            "dense_cycles": self.dense_cycles,
            "dense_total_cycles": dense_total,
            "paths": self.paths.to_json(),
        }


def model_cycles(
    paths: PathCosts,
    tables,
    head_pattern,
    padding_tile: int | None = None,
    grid_pieces: int | None = None,
) -> tuple[int, dict, dict]:
    """Cycles of one call over all heads, walking each head's tables as the kernel does;
    `padding_tile`: the kv tile holding padding keys (KernelShape.padding_kv_tile);
    `grid_pieces`: the per-head walk's grid length when it is not the tables' longest
    pattern (a chunked call's: its heads' longest)."""
    from svgen.core.tables import KIND_MASK, KV_BLOCK_MASK, KV_BLOCK_SHIFT, Q_BLOCK_SHIFT

    steps = {"full": 0, "mixed": 0, "empty": 0, "skipped": 0}
    by_path = {
        "bookkeeping": 0,
        "full": 0,
        "mixed": 0,
        "empty": 0,
        "skipped": 0,
        "init_finalize": 0,
        "pipeline": 2 * paths.pipeline,
    }
    for pattern in np.asarray(head_pattern).tolist():
        first, count = int(tables.first_piece[pattern]), int(tables.num_pieces[pattern])
        entries = tables.entries[first : first + count].astype(np.int64) & 0xFFFFFFFF
        lengths = (
            np.ones(count, np.int64)
            if tables.lengths is None
            else tables.lengths[first : first + count].astype(np.int64)
        )
        words = _unsigned_words(tables.blocks, first, count)
        variants = _unsigned_words(getattr(tables, "variants", None), first, count)
        kinds = entries & KIND_MASK
        q_tiles = len(np.unique(entries >> Q_BLOCK_SHIFT))
        # The one step of a piece that visits the kv tile holding padding keys.
        kv_start = (entries >> KV_BLOCK_SHIFT) & KV_BLOCK_MASK
        padding = (
            np.zeros(count, np.int64)
            if padding_tile is None
            else ((kv_start <= padding_tile) & (padding_tile < kv_start + lengths)).astype(np.int64)
        )
        for kind, word, variant, length, on_padding in _grouped(
            kinds, words, variants, lengths, padding
        ):
            # SEGMENT_BOUNDARY (run-time tables of one compute block per tile) is mixed too.
            name = {int(TileKind.FULL): "full", int(TileKind.EMPTY): "empty"}.get(
                int(kind), "mixed"
            )
            steps[name] += length
            by_path[name] += (length - on_padding) * paths.tile_cost(
                pattern, kind, word, False, variant
            ) + on_padding * paths.tile_cost(pattern, kind, word, True, variant)
        work = int(lengths.sum())
        # The flat walk gives a head its own pattern's pieces; the per-head one the longest's.
        longest = tables.max_pieces if grid_pieces is None else grid_pieces
        skipped = (count if tables.flat else longest) * tables.slots - work
        steps["skipped"] += skipped
        by_path["skipped"] += skipped * paths.bookkeeping
        by_path["init_finalize"] += q_tiles * (paths.init[pattern] + paths.finalize)
    total = sum(by_path.values())
    return total, steps, by_path


def _unsigned_words(table, first: int, count: int) -> np.ndarray:
    """Pieces first..first + count of a packed word table (blocks, variants) as unsigned
    int64, its sign extension masked off; zeros for a table the kernel does not have."""
    if table is None:
        return np.zeros(count, np.int64)
    return table[first : first + count].astype(np.int64) & ((1 << (8 * table.itemsize)) - 1)


def _grouped(kinds, words, variants, lengths, padding):
    """(kind, word, variants word, total length, steps on the padding tile) per distinct
    (kind, word, variants word)."""
    keys = np.stack([kinds, words, variants], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    totals = np.bincount(inverse, weights=lengths).astype(np.int64)
    on_padding = np.bincount(inverse, weights=padding).astype(np.int64)
    for (kind, word, variant), total, pad in zip(
        uniq.tolist(), totals.tolist(), on_padding.tolist()
    ):
        yield kind, word, variant, total, pad


def key_bytes(plan) -> int:
    """The bytes of k over all heads, one batch element (what a pass over k reads)."""
    a = plan.spec.attention
    return a.heads * plan.grid.seq_len * a.head_dim * (2 if a.dtype == "bfloat16" else 4)


def key_pass_cycles(plan) -> int:
    """A bounded softmax's XLA pass over k (svgen.runtime.softmax.key_bound): it reads k
    once, in cycles at the target's HBM bandwidth (its output, 512 B a head, is noise)."""
    return _hbm_cycles(plan, key_bytes(plan))


def _hbm_cycles(plan, nbytes: int) -> int:
    """Cycles to move `nbytes` at the target's HBM bandwidth (whole cycles, rounded down)."""
    return int(nbytes / plan.target.hbm_bytes_per_s * plan.target.clock_ghz * 1e9)


def pooling_floor(plan) -> int:
    """Cycles to read q and k once at the target's HBM bandwidth (what pooling must)."""
    a = plan.spec.attention
    size = 2 if a.dtype == "bfloat16" else 4
    qk_bytes = 2 * a.heads * plan.layout.seq_len * a.head_dim * size
    return _hbm_cycles(plan, qk_bytes)


def model_chunks(paths: PathCosts, plan, head_pattern) -> "ChunkReport":
    """Per chunk position, one chunked call over all heads: the position's tables (every
    pattern's), walked as model_cycles walks the full call's. The grid is as long as the
    longest head's pieces at that position, as the kernel's is."""
    from svgen.analysis.chunks import runs_of_position
    from svgen.core.tables import PieceTables

    runtime = plan.spec.runtime
    cf = runtime.chunk_frames
    cache_keys = runtime.cache_frames(plan.layout.frames) * plan.layout.tokens_per_frame
    steps, cycles = [], []
    for position in range(plan.layout.frames // cf):
        runs = [runs_of_position(r, position) for r in plan.chunk_runs]
        tables = PieceTables.from_runs(runs, plan.tables.slots, plan.spec.tiling.compute_blocks)
        longest = max(int(tables.num_pieces[p]) for p in head_pattern)
        total, position_steps, _ = model_cycles(
            paths, tables, head_pattern, padding_tile(plan, cache_keys), grid_pieces=longest
        )
        steps.append(position_steps)
        cycles.append(total)
    return ChunkReport(cf, paths, tuple(steps), tuple(cycles))


# ----------------------------------------------------------------------------- a spec
def model_head_pattern(plan) -> list[int]:
    """The static assignment; for run-time specs, candidates in turn (an assumption: the
    report says so)."""
    if plan.assign is not None:
        return list(plan.assign)
    return [h % len(plan.patterns) for h in range(plan.spec.attention.heads)]


def dense_cycles(paths: PathCosts, plan) -> int:
    """The same kernel's paths on a mask that keeps every pair (pattern 0's BOUNDARY costs
    for the compute blocks that hold padding keys)."""
    from svgen.core.tables import PieceTables

    tables = PieceTables.from_runs([_dense_runs(plan)], 1, plan.spec.tiling.compute_blocks)
    heads = plan.spec.attention.heads
    total, _, _ = model_cycles(paths, tables, [0] * heads, padding_tile(plan))
    return total


def _dense_runs(plan):
    """The runs of a mask that keeps every pair, at the plan's tiles and compute blocks."""
    from svgen.analysis.tables import build_runs, kernel_tiles

    compute = plan.patterns[0].compute_grid
    full = np.full((compute.num_q_blocks, compute.num_kv_blocks), TileKind.FULL, np.int8)
    return build_runs(*kernel_tiles(full, plan.grid, compute), plan.grid)


def padding_tile(plan, keys: int | None = None) -> int | None:
    """The kv tile holding padding keys, as the kernel computes it (KernelShape); keys: the
    kv side's length when it is not the sequence's (a rolling cache's)."""
    seq_len, t = keys or plan.grid.seq_len, plan.spec.tiling
    return None if seq_len % t.ckv == 0 else (seq_len - 1) // t.block_kv


def check_costable(plan) -> None:
    """Refuse, before compiling, a kernel of one grid step per head: libtpu compiles a
    single step without the grid loop (or, over several heads, without the per-step branch
    the paths are read from), so the model has no step to read; it is a few thousand cycles
    in any case. And a selection over heads of several patterns, or with run-time ids: the
    model of a selection walks one pattern's tables without ids."""
    if plan.spec.select is not None and len(plan.patterns) > 1:
        raise SpecError(
            "svgen cost models a selection of one pattern; this one chooses among the blocks "
            f"of {len(plan.patterns)} patterns (heads:), which the model does not walk: time "
            "it on a chip (svgen bench, bench/runtime_on_chip.py --select)",
            file=plan.spec.source,
            key="select",
        )
    if plan.spec.select is not None and plan.spec.runtime.any:
        raise SpecError(
            "svgen cost models a selection over a call without run-time ids; this one also "
            "takes segments or text lengths (runtime:), whose chosen blocks across segments "
            "the model does not read: time it on a chip (svgen bench)",
            file=plan.spec.source,
            key="select",
        )
    if plan.grid_steps == 1:
        t = plan.spec.tiling
        raise SpecError(
            f"svgen cost models a kernel's grid steps, but this one has a single grid step "
            f"per head (on a {plan.grid.num_q_blocks} x {plan.grid.num_kv_blocks} grid of "
            f"{t.block_q} x {t.block_kv} tiles), which libtpu compiles without the grid loop "
            f"the model reads: nothing to model (cost a longer sequence or smaller tiles)",
            file=plan.spec.source,
            key=plan.spec.tiling_source(plan.spec.tiling_chip),
        )


class KernelOutOfVmem(SpecError):
    """libtpu refused to compile the kernel: its scoped VMEM (buffers and the compiler's
    stack) is over the limit it was compiled with (for the forward kernel, the generated
    module's: svgen.core.vmem undercounted this tiling). `svgen cost` reports it in one
    line; `svgen tune` skips the candidate."""


# libtpu's error for it, and the sizes it reports ("... with size 16.33M and limit 15.00M").
_VMEM_OOM = "CompileTimeScopedVmemOom"
_VMEM_SIZES = re.compile(r"Scoped allocation with size ([\d.]+)([KMG]) and limit ([\d.]+)([KMG])")


@contextlib.contextmanager
def _vmem_refusal(plan):
    """Turn libtpu's CompileTimeScopedVmemOom, raised from inside jax's compile with the whole
    HLO instruction in it, into a KernelOutOfVmem naming the tiling and the VMEM needed."""
    try:
        yield
    except Exception as err:  # jax's XlaRuntimeError (its class moves between versions)
        if _VMEM_OOM not in str(err):
            raise
        raise KernelOutOfVmem(
            _vmem_message(plan, str(err)),
            file=plan.spec.source,
            key=plan.spec.tiling_source(plan.spec.tiling_chip),
        ) from None


def _vmem_message(plan, error: str) -> str:
    t, a = plan.spec.tiling, plan.spec.attention
    sizes = _VMEM_SIZES.search(error)
    need = (
        f"{sizes.group(1)} {sizes.group(2)}iB of VMEM, over the scoped limit of "
        f"{sizes.group(3)} {sizes.group(4)}iB it was compiled with"
        if sizes
        else "more VMEM than the scoped limit it was compiled with"
    )
    return (
        f"libtpu cannot compile the kernel for {plan.target.name} at {t.block_q} x {t.block_kv} "
        f"tiles with {t.cq} x {t.ckv} compute blocks (head_dim {a.head_dim}, {a.dtype}): it "
        f"needs {need} ({_VMEM_OOM}); use smaller tiles or compute blocks"
    )


def cost_plan(
    plan,
    spec_path: str,
    *,
    use_cache: bool = True,
    progress=None,
    training: bool = False,
    chunks: bool = True,
    dense_search: bool = False,
) -> CostReport:
    """Render the plan's module, compile its kernel for the plan's target, model one call;
    `training`: also the forward + backward kernels of a jax.grad call (one more compile);
    `chunks`: also a runtime.kv_cache module's chunked call (one more compile);
    `dense_search`: also the dense kernel at DENSE_TILINGS (a compile each, `dense_best`)."""
    import importlib.util
    import sys
    import tempfile

    from svgen import codegen

    check_costable(plan)
    with tempfile.TemporaryDirectory(prefix="svgen_cost_") as tmp:
        for filename, data in codegen.render(plan, spec_path).items():
            (pathlib.Path(tmp) / filename).write_bytes(data)
        name = f"_svgen_cost_{plan.spec.name}"
        module_spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(tmp) / codegen.module_filename(plan.spec.name)
        )
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
            with _vmem_refusal(plan):
                paths = measure_paths(
                    module, plan.target.name, use_cache=use_cache, progress=progress
                )
            trained = None
            if training:
                with _vmem_refusal(plan):
                    training_paths = measure_training_paths(
                        module, plan.target.name, use_cache=use_cache, progress=progress
                    )
                trained = _model_training(training_paths, plan, module)
            policy = None
            chooser = getattr(module.attention, "select", None)
            if plan.spec.select is not None:
                policy = measure_select_policy(
                    module, plan.target.name, use_cache=use_cache, progress=progress
                )
            chunk_paths = None
            if plan.chunk_runs and chunks:
                with _vmem_refusal(plan):
                    chunk_paths = measure_chunk_paths(
                        module, plan.target.name, use_cache=use_cache, progress=progress
                    )
        finally:
            sys.modules.pop(name, None)
    head_pattern = model_head_pattern(plan)
    cycles, steps, by_path = model_cycles(paths, plan.tables, head_pattern, padding_tile(plan))
    dense = dense_cycles(paths, plan)
    best = None
    if dense_search:
        best = dense_best(plan, spec_path, dense, use_cache=use_cache, progress=progress)
    return CostReport(
        plan.target.name,
        plan.target.clock_ghz,
        paths,
        steps,
        cycles,
        by_path,
        dense,
        plan.kernel.vmem.total,
        plan.table_bytes,
        len(head_pattern),
        trained,
        None if chunk_paths is None else model_chunks(chunk_paths, plan, head_pattern),
        None if plan.spec.select is None else model_select(paths, plan, chooser),
        utilisation(plan),
        _fallback_cycles(paths, plan, head_pattern),
        None if policy is None else (policy, pooling_floor(plan)),
        None if paths.fallback is None else key_pass_cycles(plan),
        best,
    )


#: Tilings `svgen cost` models the dense kernel at besides the spec's own, so that a spec is
#: compared with dense at its best for the geometry, not at the spec's tiles (small tiles
#: slow a dense kernel more than a sparse one). The larger ones are what `svgen tune` picks
#: for dense-like masks on v6e; each is a compile the first time (cached after).
DENSE_TILINGS = (
    (1024, 1024, 1024, 1024),
    (2048, 2048, 1024, 1024),
    (2048, 4096, 1024, 1024),
)


def dense_best(plan, spec_path: str, own_cycles: int, *, use_cache=True, progress=None):
    """(tiling, cycles, tilings modelled): the dense kernel (a mask keeping every pair, the
    plan's geometry, heads, head_dim, dtype and target) at the fastest of the spec's own
    tiling (`own_cycles`) and those of DENSE_TILINGS that fit the sequence and the chip."""
    t = plan.spec.tiling
    own = (t.block_q, t.block_kv, t.cq, t.ckv)
    best, modelled = (own, own_cycles), 1
    seq = plan.spec.geometry.seq_len
    for tiling in DENSE_TILINGS:
        if tiling == own or max(tiling[:2]) > seq:
            continue
        try:
            dense_plan = _dense_plan(plan, tiling)
        except SpecError:  # over the chip's VMEM or SMEM at this tiling: not a candidate
            continue
        if progress:
            progress(f"the dense kernel at {tiling[0]} x {tiling[1]} / {tiling[2]} x {tiling[3]}")
        report = cost_plan(dense_plan, spec_path, use_cache=use_cache, chunks=False)
        modelled += 1
        if report.cycles < best[1]:
            best = (tiling, report.cycles)
    return best + (modelled,)


def _dense_plan(plan, tiling):
    """The plan of a spec keeping every pair, at the plan's geometry and attention."""
    from svgen.analysis import analyze
    from svgen.spec import parse_spec

    g, a = plan.spec.geometry, plan.spec.attention
    text = (
        "svgen: 1\n"
        f"name: {plan.spec.name}_dense\n"
        f"geometry: {{frames: {g.frames}, height: {g.height}, width: {g.width}, "
        f"text_tokens: {g.text_tokens}, text_position: {g.text_position}}}\n"
        f"attention: {{heads: {a.heads}, head_dim: {a.head_dim}, dtype: {a.dtype}}}\n"
        f"mask: {{prefix: {{tokens: {g.seq_len}}}}}\n"
        f"tiling: {{block_q: {tiling[0]}, block_kv: {tiling[1]}, "
        f"compute_q: {tiling[2]}, compute_kv: {tiling[3]}}}\n"
    )
    spec = parse_spec(text, source=f"<the dense kernel of {plan.spec.name}>")
    return analyze(spec, target_name=plan.target.name)


def _fallback_cycles(paths: PathCosts, plan, head_pattern) -> tuple[int, int] | None:
    """A bounded kernel's call and dense call if every q tile ran its online twin."""
    if paths.fallback is None:
        return None
    cycles = model_cycles(paths.fallback, plan.tables, head_pattern, padding_tile(plan))[0]
    return cycles, dense_cycles(paths.fallback, plan)


def model_select(paths: PathCosts, plan, chooser=None) -> dict:
    """A select spec's call at its two bounds: nothing selected (the mask's blocks, walked
    per head as a selection's tables are) and every selectable block selected (a FULL
    block, PADDED where it holds the end of the keys): {bound: (cycles, steps)}. What a
    call costs in between depends on its activations (bench/select_cost.py); with the
    module's `chooser` (attention.select), also "sampled": the call at the spec's own amount
    on the blocks it selects from normal random q and k (`sampled_selection`)."""
    from svgen.core.tables import PieceTables, runs_of_blocks, tile_grid
    from svgen.analysis.plan import pattern_shape

    shape = pattern_shape(plan.spec, plan.only)
    grid = tile_grid(shape)
    always, selectable = plan.select_blocks()
    chosen = np.full(always.shape, int(TileKind.FULL), np.int8)
    if shape.seq_len % shape.ckv:
        chosen[:, shape.seq_len // shape.ckv] = SEGMENT_BOUNDARY  # PADDED
    heads = plan.spec.attention.heads

    def walk(blocks, heads_walking: int):
        runs = runs_of_blocks(blocks.astype(np.int8), *grid)
        tables = PieceTables.from_runs([runs], plan.tables.slots, shape.compute_blocks, False)
        cycles, steps, _ = model_cycles(paths, tables, [0] * heads_walking, padding_tile(plan))
        return cycles, steps

    out = {
        "none": walk(always, heads),
        "all": walk(np.where(selectable, chosen, always), heads),
    }
    if chooser is not None:
        per_head = [
            walk(np.where(picked, chosen, always), 1) for picked in sampled_selection(plan, chooser)
        ]
        steps = {kind: sum(st[kind] for _, st in per_head) for kind in per_head[0][1]}
        out["sampled"] = (sum(c for c, _ in per_head), steps)
    return out


def sampled_selection(plan, chooser, seed: int = 0) -> np.ndarray:
    """bool [heads, row blocks, col blocks]: what a call at the spec's own amount selects
    from q and k of independent standard normal tokens. Their compute-block means are normal
    with variance 1 / block, so they are drawn directly (no sequence-long inputs); rows of
    random activations score alike, so a top_p call selects more than real activations do."""
    from svgen.runtime.select import reference_selection

    rng = np.random.default_rng(seed)
    rows, cols = chooser.selectable.shape
    heads, d = plan.spec.attention.heads, plan.spec.attention.head_dim
    cq, ckv = plan.spec.tiling.cq, plan.spec.tiling.ckv
    q = rng.standard_normal((heads, rows, d)) / np.sqrt(cq)
    k = rng.standard_normal((heads, cols, d)) / np.sqrt(ckv)
    scores = np.einsum("hrd,hcd->hrc", q, k) / np.sqrt(d)
    policy = chooser.policy
    return reference_selection(
        scores.astype(np.float32), chooser.selectable, policy, policy.default
    )


def _model_training(paths: TrainingPaths, plan, module) -> TrainingReport:
    """Cycles of the forward (with lse), dq and dk/dv kernels over all heads, each walking
    its own tables as the kernels do, and the same on a dense mask.

    With dq fused into the dk/dv walk, its HBM traffic is charged as well, since the static
    schedule does not show it: each step with work writes its query tile's dq back (f32) and
    waits (the read overlaps the step's matmuls), and the wrapper zeroes dq before and
    scales it after (two f32 passes and one in q's dtype)."""
    from svgen.core.tables import PieceTables, transposed_tables

    head_pattern = model_head_pattern(plan)
    transposed = dkv_tables(module)
    runs = _dense_runs(plan)
    dense = PieceTables.from_runs([runs], 1, plan.spec.tiling.compute_blocks)
    dense_t = transposed_tables([runs], module.SHAPE, module.HEADS)
    kernels = [
        ("forward", paths.forward, plan.tables, dense, padding_tile(plan)),
        ("dkv", paths.dkv, transposed, dense_t, None),  # zero-padded: no padding variant
    ]
    if paths.dq is not None:
        kernels.insert(1, ("dq", paths.dq, plan.tables, dense, None))
    cycles, steps, dense_cycles = {}, {}, {}
    heads = [0] * len(head_pattern)
    for name, kernel_paths, tables, dense_tables, padding in kernels:
        cycles[name], steps[name], _ = model_cycles(kernel_paths, tables, head_pattern, padding)
        dense_cycles[name] = model_cycles(kernel_paths, dense_tables, heads, padding)[0]
    if paths.fused:
        cycles["dq_hbm"] = _dq_hbm_cycles(plan, steps["dkv"], module)
        dense_steps = model_cycles(paths.dkv, dense_t, heads)[1]
        dense_cycles["dq_hbm"] = _dq_hbm_cycles(plan, dense_steps, module)
    return TrainingReport(paths, cycles, steps, dense_cycles)


def _dq_hbm_cycles(plan, dkv_steps: dict, module) -> int:
    """The fused walk's dq traffic in cycles at the target's HBM bandwidth (see above)."""
    d = module.HEAD_DIM
    tile_bytes = plan.spec.tiling.block_q * d * 4  # one query tile of dq, f32
    work = dkv_steps["full"] + dkv_steps["mixed"]
    rows = module.HEADS * module.PADDED_SEQ_LEN * d
    wrapper_bytes = rows * (4 + 4 + np.dtype(module.DTYPE).itemsize)
    seconds = (work * tile_bytes + wrapper_bytes) / plan.target.hbm_bytes_per_s
    return int(round(seconds * plan.target.clock_ghz * 1e9))
