"""`svgen cost`: a static model of a generated kernel's time on a TPU, from libtpu's schedule.

The TPU TensorCore issues one VLIW bundle per cycle, in order. libtpu compiles the kernel for
the target on this host (no TPU needed) and dumps its final schedule; `svgen.perf.tpu_schedule`
counts the bundles along each control-flow path of one grid step. The kernel's phases are
`pl.when` branches in a fixed order (see `svgen.runtime.forward`), inside the pipeline's
per-step branch:

    init, full, mixed[pattern 0], ..., mixed[pattern P-1], finalize

and, inside each `mixed` branch of a kernel with several compute blocks per tile, one FULL and
one BOUNDARY branch per compute block, row-major. The BOUNDARY branch of the block column that
can hold padding keys has two variants (without and with the padding test, chosen by the kv
tile); so does a one-block tile's `mixed` branch. Per path:

    bookkeeping   a step with every body skipped (table reads, index maps, DMA issue/waits)
    full          a FULL tile: bookkeeping + the unmasked body
    mixed         a BOUNDARY tile: bookkeeping + its branch + per compute block, its kind's cost
    init/finalize once per q tile

The modelled time is the sum over the tables of every head of the cost of each step (read
from the same tables the kernel walks) plus the pipeline's two extra iterations. It is a
*static* model: no DMA stalls (a FULL step's K/V fetch hides under its compute), no clock
measured (the target's assumed clock converts cycles to ms). Ratios between kernels compiled
by the same toolchain are the reliable output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import re

import numpy as np

from svgen.spec.errors import SpecError
from svgen.runtime.kinds import TileKind

# svgen.runtime.refine.SEGMENT_BOUNDARY (that module imports JAX; the cost model reads
# tables without it): a compute block across run-time segments. A test checks they agree.
SEGMENT_BOUNDARY = 3

KERNEL_NAME = "svgen_attention"
CACHE_VERSION = 5  # 5: residual_block (kernels with residual masks)


@dataclasses.dataclass(frozen=True)
class PathCosts:
    """Bundles of each path of one grid step (see the module docstring)."""

    bookkeeping: int
    full: int  # a FULL tile's step, bookkeeping included
    mixed: tuple[int, ...]  # per pattern: a BOUNDARY tile's step with every block EMPTY
    # [pattern][block] = extra bundles of the block as (FULL, BOUNDARY, BOUNDARY on the kv tile
    # holding padding keys)
    block: tuple[tuple[tuple[int, int, int], ...], ...]
    init: tuple[int, ...]  # per pattern (each decodes its own query coordinates)
    finalize: int
    pipeline: int  # one of the two extra iterations (prologue / epilogue)
    # Kernels reading run-time tables: [pattern][block] = extra bundles of a SEGMENT_BOUNDARY
    # block (pattern mask and segment test) as (plain, on the kv tile holding padding keys).
    segment_block: tuple[tuple[tuple[int, int], ...], ...] = ()
    # Kernels reading a selection's tables (svgen.runtime.select): per compute block of a
    # BOUNDARY tile (one entry: a tile of one block), the extra bundles of a PADDED block (a
    # selected block holding the end of the keys: unmasked but for them) as (plain, on the kv
    # tile holding padding keys); (0, 0) for blocks that cannot hold padding keys.
    padded_block: tuple[tuple[int, int], ...] = ()
    # Kernels with `attention.softmax: bounded`: these paths are the bounded ones (what a q
    # tile within the bound runs) and `fallback` the online twins (a q tile past it).
    fallback: "PathCosts | None" = None
    # Kernels with residual masks (svgen.analysis.residuals): [pattern][block][variant - 1] =
    # extra bundles of a BOUNDARY block running residual mask `variant`, as (plain, on the kv
    # tile holding padding keys); `block` then holds variant 0's (the whole mask).
    residual_block: tuple = ()

    def to_json(self) -> dict:
        obj = dataclasses.asdict(self)
        del obj["fallback"]  # kernels without the twin keep the form they always had
        if self.fallback is not None:
            obj["fallback"] = self.fallback.to_json()
        return obj

    @classmethod
    def from_json(cls, obj: dict) -> "PathCosts":
        return cls(
            obj["bookkeeping"],
            obj["full"],
            tuple(obj["mixed"]),
            tuple(tuple(tuple(b) for b in p) for p in obj["block"]),
            tuple(obj["init"]),
            obj["finalize"],
            obj["pipeline"],
            tuple(tuple(tuple(b) for b in p) for p in obj.get("segment_block", ())),
            tuple(tuple(b) for b in obj.get("padded_block", ())),
            None if obj.get("fallback") is None else cls.from_json(obj["fallback"]),
            tuple(
                tuple(tuple(tuple(v) for v in b) for b in p) for p in obj.get("residual_block", ())
            ),
        )

    def tile_cost(
        self, pattern: int, kind: int, word: int, padding: bool = False, variants: int = 0
    ) -> int:
        """Bundles of one grid step on a tile of this kind (and blocks word, and variants
        word: the residual mask of each BOUNDARY block); `padding`: the kv tile that holds
        padding keys."""
        if kind == TileKind.FULL:
            return self.full
        if kind == TileKind.EMPTY:
            return self.bookkeeping
        blocks = self.block[pattern]
        if kind == SEGMENT_BOUNDARY:  # a tile of one compute block: across segments, or PADDED
            return self.mixed[pattern] + self._kind3(pattern, 0, padding)
        if len(blocks) == 1 and word == 0:  # one compute block per tile: BOUNDARY
            return self.mixed[pattern] + self._boundary(pattern, 0, padding, variants)
        cost = self.mixed[pattern]
        for index, (full, _, _) in enumerate(blocks):
            block_kind = (word >> (2 * index)) & 3
            if block_kind == TileKind.FULL:
                cost += full
            elif block_kind == TileKind.BOUNDARY:
                cost += self._boundary(pattern, index, padding, variants)
            elif block_kind == SEGMENT_BOUNDARY:
                cost += self._kind3(pattern, index, padding)
        return cost

    def _boundary(self, pattern: int, index: int, padding: bool, variants: int) -> int:
        """A BOUNDARY block: the whole mask's cost, or its residual mask's."""
        variant = (variants >> (2 * index)) & 3
        if variant == 0 or not self.residual_block:  # a kernel that runs whole masks only
            return self.block[pattern][index][2 if padding else 1]
        return self.residual_block[pattern][index][variant - 1][1 if padding else 0]

    def _kind3(self, pattern: int, index: int, padding: bool) -> int:
        """A block of kind 3: SEGMENT_BOUNDARY in segment tables, PADDED in selections."""
        costs = self.segment_block[pattern] if self.segment_block else self.padded_block
        return costs[index][1 if padding else 0]


def read_paths(
    schedule,
    patterns: int,
    compute_blocks: int,
    segmented: bool = False,
    padded_column: int | None = None,
    q_blocks_per_tile: int = 1,
    bounded: bool = False,
    residuals: tuple[int, ...] = (),
) -> PathCosts:
    """Map the kernel's branches onto its phases (order checked against their contents).
    residuals: per pattern, its residual masks (svgen.analysis.residuals): each BOUNDARY
    block's branch then holds one branch per variant, the whole mask's first.
    segmented: the kernel reads run-time tables, so every BOUNDARY tile of one compute
    block has a SEGMENT_BOUNDARY twin (a phase of its own) and every compute block of a
    BOUNDARY tile a third branch (svgen.runtime.forward). padded_column: the kernel reads a
    selection's tables (svgen.runtime.select) and this block column of a tile can hold
    padding keys: each of its blocks (q_blocks_per_tile of them) has a third branch, PADDED
    (with one compute block per tile: a phase of its own after the mixed ones).
    bounded: the kernel has every FULL / BOUNDARY phase twice (`attention.softmax: bounded`),
    the bounded ones first: the paths of those, with the online twins' as `fallback`."""
    loop_branches = schedule.branches_in_loop()
    stage = min(b.depth for b in loop_branches)
    twins = 2 if segmented and compute_blocks == 1 else 1
    padded_phase = padded_column is not None and compute_blocks == 1
    # full, the mixed phases (and their twins), the PADDED tile phase: once, or per twin
    body_phases = 1 + patterns * twins + padded_phase
    sets = 1 + bounded
    init, *bodies, finalize = _kernel_phases(
        [b for b in loop_branches if b.depth == stage + 1], body_phases * sets - 1
    )
    halves = [bodies[i * body_phases : (i + 1) * body_phases] for i in range(sets)]
    read = [
        _read_phases(
            schedule,
            loop_branches,
            stage,
            [init, *half, finalize],
            patterns,
            compute_blocks,
            segmented,
            padded_column,
            q_blocks_per_tile,
            {b.address for other in halves if other is not half for b in other},
            residuals or (0,) * patterns,
        )  # fmt: skip
        for half in halves
    ]
    return dataclasses.replace(read[0], fallback=read[1]) if bounded else read[0]


def _read_phases(
    schedule,
    loop_branches,
    stage: int,
    top: list,
    patterns: int,
    compute_blocks: int,
    segmented: bool,
    padded_column: int | None,
    q_blocks_per_tile: int,
    never: set[int],
    residuals: tuple[int, ...],
) -> PathCosts:
    """`read_paths` over one set of phases: init, full, mixed..., finalize; the branches at
    `never` (a bounded kernel's other twins) are skipped on every path."""
    twins = 2 if segmented and compute_blocks == 1 else 1
    padded_phase = padded_column is not None and compute_blocks == 1
    if padded_phase:  # the PADDED tile phase follows the mixed ones
        padded_tile = top.pop(-2)
    init, full, *mixed_phases, finalize = top
    mixed, segment_tiles = mixed_phases[::twins], mixed_phases[1::twins] if twins == 2 else []
    phases = {b.address for b in top}

    def cost(skipped):
        return schedule.path_cost(skipped | never)

    def only(*run):  # a step where the given phases run and every other phase is skipped
        return cost(phases - {b.address for b in run})

    bookkeeping = only()
    per_pattern_blocks = []
    mixed_base = []

    def inside(branch):
        """The branches directly inside `branch` (by span, so that a branch the scheduler
        put in the delay slots of its parent still counts as its child)."""
        within = [
            b
            for b in loop_branches
            if branch.address < b.address < branch.target and b.target <= branch.target
        ]
        return [
            b
            for b in within
            if not any(c.address < b.address < c.target and b.target <= c.target for c in within)
        ]

    def variants(branch, skipped: set[int], base: int) -> tuple[int, int]:
        """(without, with) the padding test of a masked body inside `branch`."""
        pair = inside(branch)
        if not pair:
            cost_here = cost(skipped) - base
            return cost_here, cost_here
        if len(pair) != 2:
            raise RuntimeError(f"expected 2 padding variants of a masked block, found {len(pair)}")
        plain, padded = pair
        return (cost(skipped | {padded.address}) - base, cost(skipped | {plain.address}) - base)

    def boundary_costs(branch, skipped: set[int], base: int, count: int) -> list:
        """[(without, with) the padding test] per variant 0..count of a BOUNDARY block."""
        if not count:
            return [variants(branch, skipped, base)]
        inner = inside(branch)
        if len(inner) != count + 1:
            raise RuntimeError(
                f"expected {count + 1} residual-mask variants of a masked block, found {len(inner)}"
            )
        addresses = {b.address for b in inner}
        return [variants(b, skipped | (addresses - {b.address}), base) for b in inner]

    per_pattern_residual = []
    padded_blocks: list[tuple[int, int]] = []
    if padded_phase:
        padded_blocks.append(variants(padded_tile, phases - {padded_tile.address}, bookkeeping))
        phases = phases | {padded_tile.address}
    kv_blocks = compute_blocks // q_blocks_per_tile
    per_pattern_segment = []
    for m in segment_tiles:
        per_pattern_segment.append((variants(m, phases - {m.address}, bookkeeping),))
    per_block = 3 if segmented else 2
    for pattern_index, m in enumerate(mixed):
        others = phases - {m.address}
        count = residuals[pattern_index]
        if compute_blocks == 1:
            mixed_base.append(bookkeeping)
            costs = boundary_costs(m, others, bookkeeping, count)
            per_pattern_blocks.append(((0, *costs[0]),))
            per_pattern_residual.append((tuple(costs[1:]),))
            continue
        inner = inside(m)
        widths = [
            per_block + (padded_column is not None and index % kv_blocks == padded_column)
            for index in range(compute_blocks)
        ]
        if len(inner) != sum(widths):
            raise RuntimeError(
                f"expected {sum(widths)} compute-block branches in a "
                f"BOUNDARY tile, found {len(inner)}"
            )
        addresses = {b.address for b in inner}
        base = cost(others | addresses)
        mixed_base.append(base)
        blocks, segment_blocks, residual_blocks = [], [], []
        starts = np.cumsum([0] + widths)
        for index in range(compute_blocks):
            f, b, *sg = inner[starts[index] : starts[index + 1]]
            if padded_column is not None:
                pad = sg.pop() if sg else None
                padded_blocks.append(
                    (0, 0)
                    if pad is None
                    else variants(pad, others | (addresses - {pad.address}), base)
                )
            costs = boundary_costs(b, others | (addresses - {b.address}), base, count)
            blocks.append((cost(others | (addresses - {f.address})) - base, *costs[0]))
            residual_blocks.append(tuple(costs[1:]))
            if sg:
                segment_blocks.append(variants(sg[0], others | (addresses - {sg[0].address}), base))
        per_pattern_blocks.append(tuple(blocks))
        per_pattern_residual.append(tuple(residual_blocks))
        if segmented:
            per_pattern_segment.append(tuple(segment_blocks))
    stage_branch = [b for b in loop_branches if b.depth == stage]
    pipeline = cost({b.address for b in stage_branch}) if stage_branch else bookkeeping
    return PathCosts(
        bookkeeping,
        only(full),
        tuple(mixed_base),
        tuple(per_pattern_blocks),
        _init_per_pattern(init, inside(init), patterns, only, cost, phases),
        only(finalize) - bookkeeping,
        pipeline,
        tuple(per_pattern_segment),
        tuple(padded_blocks),
        residual_block=tuple(per_pattern_residual) if any(residuals) else (),
    )


def _kernel_phases(top: list, patterns: int) -> list:
    """init, full, mixed per pattern, finalize among the step's top-level branches: the run
    of 2 + patterns + 1 branches whose FULL and BOUNDARY ones do matmuls (the pipeline's own
    conditional DMA issues and waits sit around them at the same depth). `patterns`: the
    BOUNDARY phases (twice the patterns when each has a SEGMENT_BOUNDARY twin)."""
    expected = 2 + patterns + 1
    for start in range(1, len(top) - expected + 2):
        run = top[start - 1 : start - 1 + expected]
        if all(b.mix.get("vmatmul") for b in run[1 : 1 + 1 + patterns]) and not any(
            b.mix.get("vmatmul") for b in (run[0], run[-1])
        ):
            return run
    raise RuntimeError(
        f"expected {expected} kernel phases (init, full, {patterns} mixed, "
        f"finalize) in the schedule, found none among {len(top)} branches: "
        "the kernel and the cost model disagree"
    )


def _init_per_pattern(init, decodes, patterns: int, only, cost, phases) -> tuple[int, ...]:
    """init's cost for a head of each pattern: with several patterns that decode query
    coordinates, init holds one decode branch per such pattern, and a head runs its own."""
    bookkeeping = only()
    if patterns == 1 or not decodes:
        return (only(init) - bookkeeping,) * patterns
    if len(decodes) != patterns:
        # Patterns without query coordinates have no decode branch: charge every head the
        # dearest decode (an upper bound, said here rather than guessed per pattern).
        return (only(init) - bookkeeping,) * patterns
    run_init = phases - {init.address}
    return tuple(
        cost(run_init | {d.address for d in decodes if d is not mine}) - bookkeeping
        for mine in decodes
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

    @property
    def ms(self) -> float:
        return self.cycles / (self.clock_ghz * 1e6)

    @property
    def policy_cycles(self) -> int | None:
        """The selection program's cycles, pooling at least at HBM speed (None: no select)."""
        return None if self.policy is None else self.policy[0].cycles(self.policy[1])

    def to_json(self) -> dict:
        return {
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
    from svgen.runtime.tables import KIND_MASK, KV_BLOCK_MASK, KV_BLOCK_SHIFT, Q_BLOCK_SHIFT

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


# ----------------------------------------------------------------------------- compiling
def _cache_dir() -> pathlib.Path:
    base = os.environ.get("SVGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "svgen"
    )
    return pathlib.Path(base) / "cost"


def _cache_key(
    target: str,
    shape,
    patterns_key: str,
    slots: int,
    tables_shape: tuple,
    dtype: str,
    kind: str = "forward",
    runtime: tuple[str, ...] = (),
) -> str:
    import jax
    import jaxlib

    from svgen.runtime import (
        backward,
        calls,
        chunks,
        coords,
        cube,
        forward,
        kernel,
        layout,
        ring,
        segments,
        select,
        softmax,
        steps,
    )

    # The kernel bodies and the wrapper around them, the step reader, the coordinate
    # decoding and the run-time maps they trace (and the selection programs
    # measure_select_policy counts).
    sources = (forward, steps, cube, softmax, kernel, calls, coords, layout, backward)
    kernel_source = b"".join(
        pathlib.Path(m.__file__).read_bytes() for m in sources + (segments, chunks, ring, select)
    )
    text = json.dumps(
        [
            CACHE_VERSION,
            kind,
            target,
            dataclasses.asdict(shape),
            patterns_key,
            slots,
            list(tables_shape),
            dtype,
            jax.__version__,
            jaxlib.__version__,
            hashlib.sha256(kernel_source).hexdigest(),
        ]
        + ([list(runtime)] if runtime else []),
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _forward_masks(module) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """What the forward kernel's schedule depends on of its masks: the source of every
    pattern's mask and residual masks (the cache key), per pattern how many residual masks
    its BOUNDARY blocks branch to (`read_paths`), and the variants table's dtype (key)."""
    import inspect

    tables = module.attention.tables
    masks = "\n".join(
        inspect.getsource(mask)
        for p in module._PATTERNS
        for mask in (p.boundary_mask, *p.residual_masks)
    )
    if tables.variants is None:
        return masks, (0,) * len(module._PATTERNS), ()
    residuals = tuple(len(p.residual_masks) for p in module._PATTERNS)
    return masks, residuals, (f"variants {tables.variants.dtype}",)


def measure_paths(module, target: str, *, use_cache: bool = True, progress=None) -> PathCosts:
    """Compile the generated module's kernel for `target` and read its per-path costs.

    Cached on disk by everything the schedule depends on (kernel source, shapes, the masks'
    code, table dtypes, jax version): a spec costs one compile the first time, none after.
    """

    tables = module.attention.tables
    masks, residuals, variants = _forward_masks(module)
    key = _cache_key(
        target,
        module.SHAPE,
        masks,
        tables.slots,
        tuple(str(t.dtype) for t in tables.piece_operands()) + variants,
        module.DTYPE,
        runtime=module.attention.runtime.arguments()
        + (() if module.attention.select is None else ("select",))
        # per-video frames: [2, tile] id blocks and shifted masks, another kernel
        + (("per_video_frames",) if module.attention.runtime.per_video_frames else ()),
    )

    def measure() -> PathCosts:
        if progress:
            progress(f"compiling {module.__name__} for {target} (libtpu)")
        schedule = _compile(module, target)
        shape, select = module.SHAPE, module.attention.select
        padded = select is not None and shape.padding_kv_tile is not None
        return read_paths(
            schedule,
            len(module._PATTERNS),
            shape.compute_blocks,
            segmented=module.attention.runtime.any,
            padded_column=shape.padding_block_column if padded else None,
            q_blocks_per_tile=shape.q_blocks_per_tile,
            bounded=shape.bounded_softmax,
            residuals=residuals,
        )

    return _cached(key, use_cache, measure, PathCosts.from_json)


def measure_chunk_paths(module, target: str, *, use_cache: bool = True, progress=None) -> PathCosts:
    """The per-path costs of the module's chunked call (svgen.runtime.chunks): the same
    kernel body walking per-row tables, with the chunk's first token added to the query
    positions; compiled once with a traced q_frame_offset, cached like `measure_paths`."""
    import inspect

    tables = module.attention.tables
    masks = "\n".join(inspect.getsource(p.boundary_mask) for p in module._PATTERNS)
    key = _cache_key(
        target,
        module.SHAPE,
        masks,
        tables.slots,
        tuple(str(t.dtype) for t in tables.piece_operands()),
        module.DTYPE,
        kind="chunk",
        runtime=_chunk_call_key(module.attention.kv_cache),
    )

    def measure() -> PathCosts:
        if progress:
            progress(f"compiling {module.__name__}'s chunked call for {target} (libtpu)")
        schedule = _compile_chunk(module, target)
        return read_paths(
            schedule,
            len(module._PATTERNS),
            module.SHAPE.compute_blocks,
            bounded=module.SHAPE.bounded_softmax,
        )

    return _cached(key, use_cache, measure, PathCosts.from_json)


def _chunk_call_key(kv_cache) -> tuple[str, ...]:
    """What of the chunked call the compiled kernel depends on besides the shape: the
    chunk's rows, and a rolling cache's ring (its key mapping and cache length)."""
    key = ("q_frame_offset", str(kv_cache.rows))
    if kv_cache.rolling:
        key += (f"ring {kv_cache.sink_frames}+{kv_cache.window_frames}",)
    return key


def _compile_chunk(module, target: str):
    import jax
    import jax.numpy as jnp

    from svgen.perf import tpu_schedule

    q, k, v, head_pattern = _aot_args(module, target)
    kv_cache = module.attention.kv_cache
    chunk = jax.ShapeDtypeStruct(
        (module.HEADS, kv_cache.rows, module.HEAD_DIM), q.dtype, sharding=q.sharding
    )
    if kv_cache.rolling:  # k and v are the rolling cache
        k = v = jax.ShapeDtypeStruct(
            (module.HEADS, kv_cache.cache_tokens, module.HEAD_DIM), q.dtype, sharding=q.sharding
        )
    offset = jax.ShapeDtypeStruct((), jnp.int32, sharding=q.sharding)

    def run(q, k, v, hp, offset):
        return module.attention(q, k, v, head_pattern=hp, q_frame_offset=offset)

    return tpu_schedule.compile_and_dump(
        run, chunk, k, v, head_pattern, offset, kernel_name=KERNEL_NAME, target=target
    )


@dataclasses.dataclass(frozen=True)
class PolicyCost:
    """What a select call runs before its kernel (svgen.runtime.select): mean pooling, block
    scores, top-k / top-p and the tables' compaction, as XLA programs; libtpu's bundles of
    each, rough (a loop's trip count times one pass with every forward branch falling
    through; a run-time trip count counted once: a floor). Bundles see no HBM traffic, so
    pooling, which reads q and k once, counts at least their bytes at HBM bandwidth."""

    bundles: int  # all programs' rough cycles, as counted
    pooling: int  # of which the pooling's (svgen.runtime.select.pooled_blocks)
    programs: int
    uncounted: int  # programs whose listing could not be counted (left out)
    floors: int  # programs with a run-time trip count (counted once)

    def cycles(self, pooling_floor: int) -> int:
        return self.bundles - self.pooling + max(self.pooling, pooling_floor)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "PolicyCost":
        return cls(**obj)


def measure_select_policy(
    module, target: str, *, use_cache: bool = True, progress=None
) -> PolicyCost:
    """The per-call selection program of a select module (q, k -> the kernel's tables),
    AOT-compiled once with its amount traced; cached like `measure_paths`."""
    select = module.attention.select
    runs = np.concatenate([np.ravel(select.always_runs), np.ravel(select.candidate_runs)])
    key = _cache_key(
        target,
        module.SHAPE,
        hashlib.sha256(np.ascontiguousarray(runs, np.int64).tobytes()).hexdigest(),
        select.slots,
        (),
        module.DTYPE,
        kind="select-policy",
        runtime=tuple(map(str, dataclasses.astuple(select.policy))),
    )

    def measure() -> PolicyCost:
        if progress:
            progress(f"compiling {module.__name__}'s selection program for {target} (libtpu)")
        return _count_policy(module, target)

    return _cached(key, use_cache, measure, PolicyCost.from_json)


def _count_policy(module, target: str) -> PolicyCost:
    import jax
    import jax.numpy as jnp

    from svgen.perf import tpu_schedule

    select = module.attention.select
    sharding = tpu_schedule.tpu_sharding(target)
    qk = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.dtype(module.DTYPE), sharding=sharding
    )
    amount = jax.ShapeDtypeStruct(
        (), jnp.int32 if select.policy.rule == "top_k" else jnp.float32, sharding=sharding
    )
    scale = 1.0 / module.HEAD_DIM**0.5

    def program(q, k, amount):
        return select.forward_walk.tables(select.select(q, k, scale, amount).blocks)

    dumps, compiled = tpu_schedule.compile_programs(program, qk, qk, amount, target=target)
    emitted_by = tpu_schedule.emitting_functions(compiled.as_text(), "runtime/select.py")
    bundles = pooling = uncounted = floors = 0
    for name, text in dumps.items():
        cycles, floor = tpu_schedule.program_cycles(text)
        uncounted += cycles is None
        floors += floor
        bundles += cycles or 0
        if emitted_by.get(name.split("#")[0]) == "pooled_blocks":
            pooling += cycles or 0
    return PolicyCost(bundles, pooling, len(dumps), uncounted, floors)


def pooling_floor(plan) -> int:
    """Cycles to read q and k once at the target's HBM bandwidth (what pooling must)."""
    a = plan.spec.attention
    size = 2 if a.dtype == "bfloat16" else 4
    qk_bytes = 2 * a.heads * plan.layout.seq_len * a.head_dim * size
    return int(qk_bytes / plan.target.hbm_bytes_per_s * plan.target.clock_ghz * 1e9)


def model_chunks(paths: PathCosts, plan, head_pattern) -> "ChunkReport":
    """Per chunk position, one chunked call over all heads: the position's tables (every
    pattern's), walked as model_cycles walks the full call's. The grid is as long as the
    longest head's pieces at that position, as the kernel's is."""
    from svgen.analysis.chunks import runs_of_position
    from svgen.runtime.tables import PieceTables

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


def _cached(key: str, use_cache: bool, measure, from_json):
    """The costs cached under `key`, else `measure()`'s, written atomically for next time."""
    path = _cache_dir() / f"{key}.json"
    if use_cache and path.exists():
        return from_json(json.loads(path.read_text()))
    costs = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary per process: two processes measuring the same key (parallel test workers,
    # two shells) must not replace each other's half-written file.
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(costs.to_json()))
    tmp.replace(path)
    return costs


@dataclasses.dataclass(frozen=True)
class TrainingPaths:
    """Per-path bundles of the kernels one training step runs: the forward that also saves
    each row's log-sum-exp, dq (over the forward tables) and dk/dv (over the transposed
    tables). Each kernel is a `pallas_call` of the same phase structure as the forward
    (init, FULL, BOUNDARY per pattern with its compute blocks, finalize); the backward
    operands are zero-padded, so their masked blocks have no padding variant."""

    forward: PathCosts
    dq: PathCosts | None  # None: dq is computed inside the dk/dv walk (fused)
    dkv: PathCosts

    @property
    def fused(self) -> bool:
        return self.dq is None

    def to_json(self) -> dict:
        return {
            "forward": self.forward.to_json(),
            "dq": None if self.dq is None else self.dq.to_json(),
            "dkv": self.dkv.to_json(),
        }

    @classmethod
    def from_json(cls, obj: dict) -> "TrainingPaths":
        read = {k: None if obj[k] is None else PathCosts.from_json(obj[k]) for k in obj}
        return cls(read["forward"], read["dq"], read["dkv"])


def dkv_tables(module):
    """The dk/dv kernel's tables, as the generated module builds them on its first
    differentiated call."""
    from svgen.runtime.tables import transposed_tables

    return transposed_tables([p.runs for p in module._PATTERNS], module.SHAPE, module.HEADS)


def measure_training_paths(
    module, target: str, *, use_cache: bool = True, progress=None, fused: bool | None = None
) -> TrainingPaths:
    """Compile jax.grad through the module's attention once for `target` and read the
    per-path costs of its kernels (cached on disk like `measure_paths`); `fused`: dq inside
    the dk/dv walk or in its own kernel (None: the runtime's default, backward.FUSED_DQ)."""

    from svgen.runtime import backward

    fused = backward.FUSED_DQ if fused is None else fused
    tables, transposed = module.attention.tables, dkv_tables(module)
    # The forward kernel runs the residual masks; the backward ones run whole masks.
    masks, residuals, variants = _forward_masks(module)
    operands = tables.piece_operands() + transposed.piece_operands()
    key = _cache_key(
        target,
        module.SHAPE,
        masks,
        tables.slots * 1000 + transposed.slots,
        tuple(str(t.dtype) for t in operands) + variants,
        module.DTYPE,
        kind="training-fused" if fused else "training",
    )

    def measure() -> TrainingPaths:
        if progress:
            progress(
                f"compiling the forward and backward kernels of {module.__name__} for {target}"
            )
        names = [KERNEL_NAME, f"{KERNEL_NAME}_dkv"] + ([] if fused else [f"{KERNEL_NAME}_dq"])
        schedules = _compile_training(module, target, names, fused)
        patterns, blocks = len(module._PATTERNS), module.SHAPE.compute_blocks
        bounded = module.SHAPE.bounded_softmax  # the forward kernel's twins (not the backward's)
        read = {
            name: read_paths(
                schedules[name],
                patterns,
                blocks,
                bounded=bounded and name == KERNEL_NAME,
                residuals=residuals if name == KERNEL_NAME else (),
            )
            for name in names
        }
        return TrainingPaths(
            read[KERNEL_NAME], read.get(f"{KERNEL_NAME}_dq"), read[f"{KERNEL_NAME}_dkv"]
        )

    return _cached(key, use_cache, measure, TrainingPaths.from_json)


def _compile_training(module, target: str, names: list[str], fused: bool) -> dict:
    import jax
    import jax.numpy as jnp

    from svgen.perf import tpu_schedule
    from svgen.runtime import backward

    def loss(q, k, v, hp):
        return jnp.sum(module.attention(q, k, v, head_pattern=hp).astype(jnp.float32))

    grads = jax.grad(loss, argnums=(0, 1, 2))
    default, backward.FUSED_DQ = backward.FUSED_DQ, fused  # read when traced, in this compile
    try:
        return tpu_schedule.compile_and_dump_kernels(
            grads, *_aot_args(module, target), kernel_names=names, target=target
        )
    finally:
        backward.FUSED_DQ = default


def _compile(module, target: str):
    """The kernel's schedule; a module with run-time inputs is compiled with them (traced),
    so what is measured is the kernel that reads run-time segments."""
    from svgen.perf import tpu_schedule

    names = module.attention.runtime.arguments()

    def run(q, k, v, hp, *runtime_inputs):
        return module.attention(q, k, v, head_pattern=hp, **dict(zip(names, runtime_inputs)))

    return tpu_schedule.compile_and_dump(
        run,
        *_aot_args(module, target),
        *_runtime_args(module, target),
        kernel_name=KERNEL_NAME,
        target=target,
    )


def _runtime_args(module, target: str) -> tuple:
    """Traced run-time inputs of the module's full size (one batch element), in the order
    of `attention.runtime.arguments()`."""
    import jax
    import jax.numpy as jnp

    from svgen.perf import tpu_schedule

    sharding = tpu_schedule.tpu_sharding(target)
    shapes = {"segment_ids": (module.SEQ_LEN,), "text_lengths": ()}
    return tuple(
        jax.ShapeDtypeStruct(shapes[name], jnp.int32, sharding=sharding)
        for name in module.attention.runtime.arguments()
    )


def _aot_args(module, target: str) -> tuple:
    """q, k, v and a traced head_pattern of the module's full size, placed on the target."""
    import jax
    import jax.numpy as jnp

    from svgen.perf import tpu_schedule

    sharding = tpu_schedule.tpu_sharding(target)
    arg = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.dtype(module.DTYPE), sharding=sharding
    )
    head_pattern = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)
    return arg, arg, arg, head_pattern


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
    from svgen.runtime.tables import PieceTables

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
    in any case."""
    if plan.grid_steps == 1:
        t = plan.spec.tiling
        raise SpecError(
            f"svgen cost models a kernel's grid steps, but this one has a single grid step "
            f"per head (on a {plan.grid.num_q_blocks} x {plan.grid.num_kv_blocks} grid of "
            f"{t.block_q} x {t.block_kv} tiles), which libtpu compiles without the grid loop "
            f"the model reads: nothing to model (cost a longer sequence or smaller tiles)",
            file=plan.spec.source,
            key="tiling",
        )


class KernelOutOfVmem(SpecError):
    """libtpu refused to compile the kernel: its scoped VMEM (buffers and the compiler's
    stack) is over the limit it was compiled with (for the forward kernel, the generated
    module's: svgen.runtime.vmem undercounted this tiling). `svgen cost` reports it in one
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
            _vmem_message(plan, str(err)), file=plan.spec.source, key="tiling"
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
) -> CostReport:
    """Render the plan's module, compile its kernel for the plan's target, model one call;
    `training`: also the forward + backward kernels of a jax.grad call (one more compile);
    `chunks`: also a runtime.kv_cache module's chunked call (one more compile)."""
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
    return CostReport(
        plan.target.name,
        plan.target.clock_ghz,
        paths,
        steps,
        cycles,
        by_path,
        dense_cycles(paths, plan),
        plan.vmem.total,
        plan.table_bytes,
        len(head_pattern),
        trained,
        None if chunk_paths is None else model_chunks(chunk_paths, plan, head_pattern),
        None if plan.spec.select is None else model_select(paths, plan),
        utilisation(plan),
        _fallback_cycles(paths, plan, head_pattern),
        None if policy is None else (policy, pooling_floor(plan)),
    )


def _fallback_cycles(paths: PathCosts, plan, head_pattern) -> tuple[int, int] | None:
    """A bounded kernel's call and dense call if every q tile ran its online twin."""
    if paths.fallback is None:
        return None
    cycles = model_cycles(paths.fallback, plan.tables, head_pattern, padding_tile(plan))[0]
    return cycles, dense_cycles(paths.fallback, plan)


def model_select(paths: PathCosts, plan) -> dict:
    """A select spec's call at its two bounds: nothing selected (the mask's blocks, walked
    per head as a selection's tables are) and every selectable block selected (a FULL
    block, PADDED where it holds the end of the keys): {bound: (cycles, steps)}. What a
    call costs in between depends on its activations (bench/select_cost.py)."""
    from svgen.runtime.tables import (
        PieceTables,
        compute_block_kinds,
        runs_of_blocks,
        selectable_blocks,
        tile_grid,
    )
    from svgen.analysis.plan import pattern_shape

    shape = pattern_shape(plan.spec, plan.only)
    grid = tile_grid(shape)
    always = compute_block_kinds(plan.only.table.runs, *grid)
    selectable = selectable_blocks(always, compute_block_kinds(plan.candidate_runs, *grid), shape)
    chosen = np.full(always.shape, int(TileKind.FULL), np.int8)
    if shape.seq_len % shape.ckv:
        chosen[:, shape.seq_len // shape.ckv] = SEGMENT_BOUNDARY  # PADDED
    out = {}
    for bound, blocks in (("none", always), ("all", np.where(selectable, chosen, always))):
        runs = runs_of_blocks(blocks.astype(np.int8), *grid)
        tables = PieceTables.from_runs([runs], plan.tables.slots, shape.compute_blocks, False)
        cycles, steps, _ = model_cycles(
            paths, tables, [0] * plan.spec.attention.heads, padding_tile(plan)
        )
        out[bound] = (cycles, steps)
    return out


def _model_training(paths: TrainingPaths, plan, module) -> TrainingReport:
    """Cycles of the forward (with lse), dq and dk/dv kernels over all heads, each walking
    its own tables as the kernels do, and the same on a dense mask.

    With dq fused into the dk/dv walk, its HBM traffic is charged as well, since the static
    schedule does not show it: each step with work writes its query tile's dq back (f32) and
    waits (the read overlaps the step's matmuls), and the wrapper zeroes dq before and
    scales it after (two f32 passes and one in q's dtype)."""
    from svgen.runtime.tables import PieceTables, transposed_tables

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


def format_report(report: CostReport, plan) -> list[str]:
    p, t = report.paths, plan.spec.tiling
    per_tile = t.block_q * t.block_kv / (512 * 512)
    per_block = t.cq * t.ckv / (512 * 512)
    lines = [
        f"{plan.spec.name}: static cost model on {report.target} (libtpu's schedule; no DMA "
        f"stalls; clock {report.clock_ghz} GHz assumed)",
        f"  tiles {t.block_q} x {t.block_kv}, compute blocks {t.cq} x {t.ckv}; "
        f"VMEM {report.vmem_bytes / 2**20:.1f} MiB, SMEM tables {report.smem_bytes:,} B",
        "  bundles per grid step (per 512x512-equivalent in brackets):",
        *_path_lines(p, plan, per_tile, per_block),
    ]
    steps = report.steps
    lines.append(
        f"  steps over {report.heads} heads: {steps['full']:,} FULL, "
        f"{steps['mixed']:,} BOUNDARY, {steps['empty']:,} zero-fill, "
        f"{steps['skipped']:,} skipped"
    )
    share = {k: v / report.cycles for k, v in report.cycles_by_path.items() if v}
    lines.append("  time by path: " + ", ".join(f"{k} {v:.1%}" for k, v in share.items()))
    if plan.assign is None:
        lines.append("  heads: assigned at run time; modelled with the candidates in turn")
    lines.append(f"  modelled: {report.cycles:,} cycles = {report.ms:.2f} ms per call")
    if report.dense_cycles:
        lines.append(
            f"  the same kernel on a dense mask: {report.dense_cycles:,} cycles = "
            f"{report.dense_cycles / (report.clock_ghz * 1e6):.2f} ms "
            f"({report.dense_cycles / report.cycles:.2f}x this kernel's time)"
        )
    if report.fallback is not None:
        lines += _fallback_lines(report, plan, per_tile, per_block)
    if report.utilisation is not None:
        lines.append(_utilisation_line(report))
    if report.training is not None:
        lines += _training_lines(report.training, plan, report.clock_ghz, per_tile, per_block)
    if report.chunks is not None:
        lines += _chunk_lines(report, plan, per_tile, per_block)
    if report.select is not None:
        lines += _select_lines(report, plan)
    return lines


def _fallback_lines(report: CostReport, plan, per_tile: float, per_block: float) -> list[str]:
    """attention.softmax: bounded: the figures above are q tiles within the bound; these
    are the online twins, what a q tile past it runs."""
    f = report.paths.fallback
    cycles, dense = report.fallback
    ms = cycles / (report.clock_ghz * 1e6)
    boundary = _mean([b[1] for p in f.block for b in p])
    return [
        "  softmax: bounded (the figures above: every q tile within the bound); each q tile "
        "past it runs online:",
        f"    online FULL tile {f.full} ({(f.full - f.bookkeeping) / per_tile:.0f} body), "
        f"BOUNDARY block {boundary} ({boundary / per_block:.0f}); init {f.init[0]}",
        f"    every q tile online: {cycles:,} cycles = {ms:.2f} ms per call "
        f"({cycles / report.cycles:.3f}x); dense {dense:,} cycles "
        f"({dense / report.dense_cycles:.3f}x the bounded dense kernel)",
    ]


def _utilisation_line(report: CostReport) -> str:
    u = report.utilisation.to_json(report)
    at_least = "" if report.utilisation.exact else "at least "
    line = (
        f"  useful work (4 x head_dim per kept pair): {at_least}{u['useful_flops'] / 1e12:.2f} "
        f"TFLOP at {at_least}{u['useful_flops_per_s'] / 1e12:.1f} TFLOP/s = "
        f"{u['of_peak']:.1%} of {report.target}'s published bf16 peak "
        f"({u['peak_flops_per_s'] / 1e12:.1f} TFLOP/s per TensorCore)"
    )
    if "dense_of_peak" in u:
        line += f"; the dense kernel {u['dense_of_peak']:.1%}"
    return line


def _select_lines(report: CostReport, plan) -> list[str]:
    """A select spec's bounds: the call between nothing and everything selected."""
    ms = lambda cycles: cycles / (report.clock_ghz * 1e6)  # noqa: E731
    (none, none_steps), (every, all_steps) = report.select["none"], report.select["all"]
    lines = [
        f"  select ({plan.spec.select.rule}): the modelled call above is the mask alone's "
        "(static tables); a call walks its own selection's tables, between",
        f"    nothing selected: {none:,} cycles = {ms(none):.2f} ms "
        f"({none_steps['full'] + none_steps['mixed']:,} steps with work over all heads)",
        f"    every candidate block selected: {every:,} cycles = {ms(every):.2f} ms "
        f"({all_steps['full'] + all_steps['mixed']:,} steps with work)",
    ]
    if report.dense_cycles:
        lines.append(
            f"    dense / every-selected: {report.dense_cycles / every:.2f}x; dense / "
            f"nothing-selected: {report.dense_cycles / none:.2f}x"
        )
    if report.policy is not None:
        counts, floor = report.policy
        c = report.policy_cycles
        lines += [
            f"    selection per call (pooling, block scores, {plan.spec.select.rule}, tables; XLA "
            f"programs before the kernel): {c:,} cycles = {ms(c) * 1e3:.1f} us, "
            f"{c / every:.2%} .. {c / none:.2%} of the kernel (every .. nothing selected)",
            f"      {counts.programs} programs, {counts.bundles:,} bundles counted (pooling "
            f"{counts.pooling:,}; reading q and k once at HBM bandwidth: {floor:,} cycles)"
            + (f"; {counts.uncounted} uncounted" if counts.uncounted else "")
            + (f"; {counts.floors} with a run-time trip count (a floor)" if counts.floors else ""),
        ]
    p = report.paths
    if p.padded_block and any(any(b) for b in p.padded_block):
        plain = _mean([b[0] for b in p.padded_block if any(b)])
        lines.append(
            f"    PADDED block (a selected block holding the end of the keys): {plain:,} bundles"
        )
    return lines


def _chunk_lines(report: CostReport, plan, per_tile: float, per_block: float) -> list[str]:
    """The chunked calls: their kernel's paths, then one line per chunk position."""
    chunks = report.chunks
    ms = lambda cycles: cycles / (report.clock_ghz * 1e6)  # noqa: E731
    cf = chunks.chunk_frames
    lines = [
        f"  KV-cache chunks of {cf} frame(s) against {plan.cache_words()} (attention(..., "
        "q_frame_offset=f)): the chunked call's bundles per grid step:",
        *("  " + line for line in _path_lines(chunks.paths, plan, per_tile, per_block)),
    ]
    for i, (steps, cycles) in enumerate(zip(chunks.steps, chunks.cycles)):
        lines.append(
            f"    frames {i * cf}-{i * cf + cf - 1}: {steps['full']:,} FULL, {steps['mixed']:,} "
            f"BOUNDARY, {steps['empty']:,} zero-fill, {steps['skipped']:,} skipped steps; "
            f"{cycles:,} cycles = {ms(cycles):.3f} ms"
        )
    lines.append(
        f"    all {len(chunks.cycles)} chunks: {ms(chunks.total):.2f} ms "
        f"({chunks.total / report.cycles:.2f}x one full-sequence call, {report.ms:.2f} ms)"
    )
    return lines


_KERNEL_LABELS = {
    "forward": "forward with lse",
    "dq": "dq",
    "dkv": "dk/dv",
    "dq_hbm": "dq read-modify-write in HBM",
}


def _training_lines(training: TrainingReport, plan, clock_ghz: float, per_tile, per_block):
    ms = lambda cycles: cycles / (clock_ghz * 1e6)  # noqa: E731
    c, dense = training.cycles, training.dense_cycles
    fused = training.paths.fused
    lines = [
        "  training (jax.grad: the forward saving lse, then "
        + ("dk, dv and dq in one walk of the transposed tables):" if fused else "dq and dk/dv):")
    ]
    kernels = [("dkv", "dk/dv" + (" + dq" if fused else "") + " kernel (transposed tables)")]
    if not fused:
        kernels.insert(0, ("dq", "dq kernel"))
    for name, label in kernels:
        lines.append(f"   {label}, bundles per grid step:")
        kernel_paths = getattr(training.paths, name)
        lines += ["  " + line for line in _path_lines(kernel_paths, plan, per_tile, per_block)]
    lines += [
        "    "
        + ", ".join(f"{_KERNEL_LABELS[k]} {v:,} cycles ({ms(v):.2f} ms)" for k, v in c.items()),
        f"    backward / forward {training.backward / c['forward']:.2f}; forward + backward "
        f"{training.total:,} cycles = {ms(training.total):.2f} ms per call",
        f"    the same kernels on a dense mask: {sum(dense.values()):,} cycles = "
        f"{ms(sum(dense.values())):.2f} ms ({sum(dense.values()) / training.total:.2f}x)",
    ]
    return lines


def _path_lines(p: PathCosts, plan, per_tile: float, per_block: float) -> list[str]:
    """One kernel's per-path bundles (see the module docstring)."""
    lines = [
        f"    bookkeeping (skipped step) {p.bookkeeping}",
        f"    FULL tile                  {p.full} ({(p.full - p.bookkeeping) / per_tile:.0f} "
        f"body + {p.bookkeeping / per_tile:.0f} bookkeeping)",
    ]
    for index, pattern in enumerate(plan.patterns):
        blocks = p.block[index]
        full_blocks = [f for f, _, _ in blocks if f]
        boundary_blocks = [b for _, b, _ in blocks]
        padded = max(padding for _, _, padding in blocks)
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        full, boundary = _mean(full_blocks), _mean(boundary_blocks)
        ratio = f", {boundary / full:.2f}x FULL" if full else ""
        lines.append(
            f"    BOUNDARY tile{label}: {p.mixed[index] - p.bookkeeping} branch overhead; per "
            f"compute block FULL {full} ({full / per_block:.0f}), "
            f"BOUNDARY {boundary} ({boundary / per_block:.0f}{ratio})"
            + (
                f"; {padded} with the padding test (one kv tile)"
                if padded > max(boundary_blocks)
                else ""
            )
        )
    for index, pattern in enumerate(plan.patterns[: len(p.residual_block)]):
        per_variant = list(zip(*p.residual_block[index]))  # [variant][block] (plain, padded)
        if not per_variant:
            continue
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        found = pattern.residuals
        cells = []
        for j, costs in enumerate(per_variant, 1):
            plain = _mean([c for c, _ in costs])
            blocks = "" if found is None else f", {found.variants[j - 1].blocks:,} blocks"
            cells.append(f"{j}: {plain} ({plain / per_block:.0f}{blocks})")
        lines.append(f"    BOUNDARY block{label}, residual masks: " + "; ".join(cells))
    for index, pattern in enumerate(plan.patterns[: len(p.segment_block)]):
        plain = _mean([b for b, _ in p.segment_block[index]])
        padded = max(padding for _, padding in p.segment_block[index])
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        lines.append(
            f"    SEGMENT_BOUNDARY block{label} (across run-time segments): {plain} "
            f"({plain / per_block:.0f}); {padded} with the padding test"
        )
    init = ", ".join(str(i) for i in p.init) if len(set(p.init)) > 1 else str(p.init[0])
    lines.append(f"    init {init}, finalize {p.finalize} (per row tile)")
    return lines


def _mean(values) -> int:
    return int(round(sum(values) / len(values))) if values else 0
