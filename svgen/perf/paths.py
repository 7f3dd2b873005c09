"""Per-path costs of one grid step, read from libtpu's bundle schedule of a kernel.

The TPU TensorCore issues one VLIW bundle per cycle, in order. libtpu compiles the kernel for
the target on this host (no TPU needed) and dumps its final schedule; `svgen.perf.tpu_schedule`
counts the bundles along each control-flow path of one grid step. The kernel's phases are
`pl.when` branches in a fixed order (see `svgen.runtime.forward`), inside the pipeline's
per-step branch:

    init, full, mixed[pattern 0], ..., mixed[pattern P-1], finalize

and, inside each `mixed` branch of a kernel with several compute blocks per tile, one FULL and
one BOUNDARY branch per compute block, row-major; where the pattern has straight words
(svgen.core.straight), first one branch per word (its straight-line body), then one branch
holding those per-block branches. The BOUNDARY branch of the block column that
can hold padding keys has two variants (without and with the padding test, chosen by the kv
tile); so does a one-block tile's `mixed` branch. Per path:

    bookkeeping   a step with every body skipped (table reads, index maps, DMA issue/waits)
    full          a FULL tile: bookkeeping + the unmasked body
    mixed         a BOUNDARY tile: bookkeeping + its branch + per compute block, its kind's cost
    init/finalize once per q tile

This module owns that mapping (`read_paths`) and its result (`PathCosts`, with the cost of a
step on a tile of each kind). It is apart from the compiling (`svgen.perf.measure`) and the
model over the tables (`svgen.perf.cost`) because it is the one place that must agree with
the kernel's branch structure: it needs neither JAX nor a plan, only a parsed schedule.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.core.kinds import TileKind
from svgen.core.tables import variant_bits, variant_mask
from svgen.runtime.variant import Branches

# svgen.runtime.refine.SEGMENT_BOUNDARY (that module imports JAX; the cost model reads
# tables without it): a compute block across run-time segments. A test checks they agree.
SEGMENT_BOUNDARY = 3


@dataclasses.dataclass(frozen=True)
class PathCosts:
    """Bundles of each path of one grid step (see the module docstring)."""

    bookkeeping: int
    full: int  # a FULL tile's step, bookkeeping included
    # per pattern: a BOUNDARY tile's step with every block EMPTY (with straight words: one
    # whose word has no body, so it takes the per-block branches)
    mixed: tuple[int, ...]
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
    # Kernels with straight-line BOUNDARY tiles (svgen.core.straight): [pattern] = per
    # straight word (word, whether the kv tile holding padding keys takes the per-block
    # branches instead, the bundles of the whole step).
    straight: tuple = ()
    # The whole kernel program's bundles (0: not read, as for the tuner's interpolated
    # paths). On a v5e, large programs ran far slower than their paths add up to
    # (svgen.perf.cost.program_caveat).
    program: int = 0

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
            tuple(tuple(tuple(w) for w in p) for p in obj.get("straight", ())),
            program=obj.get("program", 0),
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
        for straight_word, avoid_padding_tile, step in (
            self.straight[pattern] if self.straight else ()
        ):
            if word == straight_word and not (padding and avoid_padding_tile):
                return step
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
        blocks = len(self.block[pattern])
        variant = (variants >> (variant_bits(blocks) * index)) & variant_mask(blocks)
        if variant == 0 or not self.residual_block:  # a kernel that runs whole masks only
            return self.block[pattern][index][2 if padding else 1]
        return self.residual_block[pattern][index][variant - 1][1 if padding else 0]

    def _kind3(self, pattern: int, index: int, padding: bool) -> int:
        """A block of kind 3: SEGMENT_BOUNDARY in segment tables, PADDED in selections."""
        costs = self.segment_block[pattern] if self.segment_block else self.padded_block
        return costs[index][1 if padding else 0]


def read_paths(schedule, branches: Branches) -> PathCosts:
    """Map the kernel's branches onto its phases (order checked against their contents).
    `branches`: what the kernel emits (svgen.runtime.variant.Branches, from the kernel's
    variant), which this reads as follows.
    residuals: per pattern, its residual masks (svgen.analysis.residuals): each BOUNDARY
    block's branch then holds one branch per variant, the whole mask's first.
    segmented: the kernel reads run-time tables, so every BOUNDARY tile of one compute
    block has a SEGMENT_BOUNDARY twin (a phase of its own) and every compute block of a
    BOUNDARY tile a third branch (svgen.runtime.forward). padded_column: the kernel reads a
    selection's tables (svgen.runtime.select) and this block column of a tile can hold
    padding keys: each of its blocks (q_blocks_per_tile of them) has a third branch, PADDED
    (with one compute block per tile: a phase of its own after the mixed ones).
    bounded: the kernel has every FULL / BOUNDARY phase twice (`attention.softmax: bounded`),
    each set inside one branch on the q tile's mode, the bounded set first: the paths of
    those, with the online twins' as `fallback`.
    straight: per pattern, its straight words (svgen.core.straight): each BOUNDARY tile's
    branch then holds one branch per word, then one holding the per-block branches."""
    patterns, compute_blocks = branches.patterns, branches.compute_blocks
    segmented, padded_column = branches.segmented, branches.padded_column
    bounded, residuals, straight = branches.bounded, branches.residuals, branches.straight
    q_blocks_per_tile = branches.q_blocks_per_tile
    loop_branches = schedule.branches_in_loop()
    stage = min(b.depth for b in loop_branches)
    # full, the mixed phases (and their twins), the PADDED tile phase: once, or per twin
    body_phases = len(branches.phases())
    top = [b for b in loop_branches if b.depth == stage + 1]
    if bounded:  # init, the bounded set's branch, the online set's, finalize
        init, *sets, finalize = _kernel_phases(top, 1)
        halves = [_phases_inside(loop_branches, s, stage + 2, body_phases) for s in sets]
    else:
        init, *bodies, finalize = _kernel_phases(top, body_phases - 1)
        halves = [bodies]
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
            {s.address for s in sets if s is not set_} if bounded else set(),
            residuals or (0,) * patterns,
            # A bounded kernel's online twin has no straight bodies (svgen.runtime.forward).
            (straight if half is halves[0] else ()) or ((),) * patterns,
        )  # fmt: skip
        for half, set_ in zip(halves, sets if bounded else [None])
    ]
    paths = dataclasses.replace(read[0], fallback=read[1]) if bounded else read[0]
    return dataclasses.replace(paths, program=len(schedule.bundles))


def _phases_inside(loop_branches, branch, depth: int, expected: int) -> list:
    """The `expected` phases directly inside a bounded kernel's set `branch` (at `depth`)."""
    phases = [
        b for b in loop_branches if b.depth == depth and branch.address < b.address < branch.target
    ]
    if len(phases) != expected:
        raise RuntimeError(
            f"expected {expected} phases in a softmax mode's branch, found {len(phases)}: "
            "the kernel and the cost model disagree"
        )
    return phases


# Long (~135 lines): its helpers close over the schedule and the phase set, so they nest here.
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
    straight: tuple,
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
    per_pattern_straight = []
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
            per_pattern_straight.append(())
            mixed_base.append(bookkeeping)
            costs = boundary_costs(m, others, bookkeeping, count)
            per_pattern_blocks.append(((0, *costs[0]),))
            per_pattern_residual.append((tuple(costs[1:]),))
            continue
        words = straight[pattern_index]
        if words:  # one branch per straight word, then the per-block branches in one
            *bodies, block_branches = inside(m)
            if len(bodies) != len(words):
                raise RuntimeError(
                    f"expected {len(words)} straight-line bodies in a BOUNDARY tile, "
                    f"found {len(bodies)}"
                )
            addresses = {b.address for b in bodies} | {block_branches.address}
            per_pattern_straight.append(
                tuple(
                    (w.word, w.avoid_padding_tile, cost(others | (addresses - {b.address})))
                    for w, b in zip(words, bodies)
                )
            )
            others = others | {b.address for b in bodies}
            inner = inside(block_branches)
        else:
            per_pattern_straight.append(())
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
        straight=tuple(per_pattern_straight) if any(per_pattern_straight) else (),
    )


def _kernel_phases(top: list, patterns: int) -> list:
    """init, full, mixed per pattern, finalize among the step's top-level branches: the run
    of 2 + patterns + 1 branches whose FULL and BOUNDARY ones do matmuls and whose last does
    none (the pipeline's own conditional DMA issues and waits sit around them at the same
    depth; a bounded kernel's init does one, its rows' norms). `patterns`: the BOUNDARY
    phases (twice the patterns when each has a SEGMENT_BOUNDARY twin); for a bounded kernel,
    1: its two sets of phases, one branch each."""
    expected = 2 + patterns + 1
    for start in range(1, len(top) - expected + 2):
        run = top[start - 1 : start - 1 + expected]
        if all(b.mix.get("vmatmul") for b in run[1 : 1 + 1 + patterns]) and not run[-1].mix.get(
            "vmatmul"
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


def mean(values) -> float:
    """The mean of `values` (any iterable; 0.0 when empty): what `svgen tune` fits its
    per-path estimates with."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def mean_rounded(values) -> int:
    """`mean`, rounded to whole bundles (0 when empty): the per-block figures `svgen cost`
    prints."""
    return int(round(mean(values)))
