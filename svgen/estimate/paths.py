"""Per-path costs of one grid step, read from libtpu's bundle schedule of a kernel.

The TPU TensorCore issues one VLIW bundle per cycle, in order. libtpu compiles the kernel for
the target on this host (no TPU needed) and dumps its final schedule; `svgen.estimate.tpu_schedule`
counts the bundles along each control-flow path of one grid step. The kernel's branches are
declared beside its variant (`svgen.runtime.branch_tree.step`: a tree of named `pl.when`
branches in the order the body emits them), inside the pipeline's per-step branch:

    init, full, mixed[0], ..., mixed[P-1], finalize

and, inside each `mixed[p]` branch of a kernel with several compute blocks per tile,
full@i and boundary@i per compute block i, row-major; where the pattern has straight words
(svgen.core.straight), first straight[j] per word (its straight-line body), then `blocks`
holding those per-block branches. A masked body on the block column that can hold padding
keys has two twins, plain and padding (without and with the padding test, chosen by the kv
tile). `read_paths` finds each declared branch in the schedule by its place in that tree (the
count at each level checked) and reads every cost by name. Per path:

    bookkeeping   a step with every body skipped (table reads, index maps, DMA issue/waits)
    full          a FULL tile: bookkeeping + the unmasked body
    mixed         a BOUNDARY tile: bookkeeping + its branch + per compute block, its kind's cost
    init/finalize once per q tile

This module owns that mapping (`read_paths`) and its result (`PathCosts`, with the cost of a
step on a tile of each kind). It is apart from the compiling (`svgen.estimate.measure`) and the
model over the tables (`svgen.estimate.cycle_model`) because it is the one place that reads the
kernel's branch structure: it needs neither JAX nor a plan, only a parsed schedule and the
kernel's declared branches.
"""

from __future__ import annotations

import dataclasses

from svgen.core.kinds import TileKind
from svgen.core.tables import variant_bits, variant_mask
from svgen.runtime import branch_tree
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
    # (svgen.estimate.cost.program_caveat).
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
    """Map the kernel's branches onto its phases. `branches`: what the kernel emits
    (svgen.runtime.variant.Branches, from the kernel's variant), whose declared tree
    (svgen.runtime.branch_tree.step) names every branch of a grid step: each is found in the schedule by
    its place in that tree (the count at each level checked), and each cost read by name.
    A bounded kernel's sets (`attention.softmax: bounded`) give the bounded paths, with the
    online twins' as `fallback`."""
    loop_branches = schedule.branches_in_loop()
    stage = min(b.depth for b in loop_branches)
    step = branch_tree.step(branches)
    top = _kernel_phases([b for b in loop_branches if b.depth == stage + 1], len(step) - 2)
    pipeline = {b.address for b in loop_branches if b.depth == stage}
    if not branches.bounded:
        reader = _StepReader(schedule, loop_branches, pipeline, never=set())
        return _with_program(_read_set(reader, reader.matched(step, top), branches), schedule)
    init, *sets, finalize = top
    read = []
    for declared, found in zip(step[1:-1], sets):
        inner = _phases_inside(loop_branches, found, stage + 2, len(declared.children))
        never = {s.address for s in sets if s is not found}
        reader = _StepReader(schedule, loop_branches, pipeline, never)
        phases = reader.matched((step[0], *declared.children, step[-1]), [init, *inner, finalize])
        read.append(_read_set(reader, phases, branches))
    return _with_program(dataclasses.replace(read[0], fallback=read[1]), schedule)


def _with_program(paths: PathCosts, schedule) -> PathCosts:
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


@dataclasses.dataclass(frozen=True)
class _Found:
    """A declared branch (svgen.runtime.branch_tree.Branch) and the schedule's branch that is
    it, with its declared children found likewise (a leaf's inside is not read)."""

    name: str
    branch: object  # svgen.estimate.tpu_schedule.Branch
    children: tuple["_Found", ...] = ()

    @property
    def address(self) -> int:
        return self.branch.address

    def __getitem__(self, name: str) -> "_Found":
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(f"no branch {name} inside {self.name}")

    def __contains__(self, name: str) -> bool:
        return any(child.name == name for child in self.children)

    def addresses(self) -> set[int]:
        return {c.address for c in self.children}


class _StepReader:
    """Path costs of one grid step of the schedule: the bundles run when the branches at the
    given addresses are skipped (and always those of `never`, a bounded kernel's other set),
    and the declared branches found in it."""

    def __init__(self, schedule, loop_branches, pipeline: set[int], never: set[int]):
        self.schedule, self.loop_branches = schedule, loop_branches
        self.pipeline, self.never = pipeline, never

    def cost(self, skipped: set[int]) -> int:
        return self.schedule.path_cost(skipped | self.never)

    def inside(self, branch) -> list:
        """The branches directly inside `branch` (by span, so that a branch the scheduler
        put in the delay slots of its parent still counts as its child)."""
        within = [
            b
            for b in self.loop_branches
            if branch.address < b.address < branch.target and b.target <= branch.target
        ]
        return [
            b
            for b in within
            if not any(c.address < b.address < c.target and b.target <= c.target for c in within)
        ]

    def matched(self, declared, found) -> dict[str, _Found]:
        """The declared branches `declared`, found in order as the schedule's `found`."""
        if len(found) != len(declared):
            names = ", ".join(d.name for d in declared)
            raise RuntimeError(
                f"expected {len(declared)} branches ({names}), found {len(found)}: "
                "the kernel and the cost model disagree"
            )
        return {d.name: self.found(d, f) for d, f in zip(declared, found)}

    def found(self, declared, branch) -> _Found:
        if not declared.children:
            return _Found(declared.name, branch)
        children = self.matched(declared.children, self.inside(branch))
        return _Found(declared.name, branch, tuple(children.values()))

    def masked(self, body: _Found, skipped: set[int], base: int) -> tuple[int, int]:
        """(without, with) the padding test: a masked body's extra bundles over `base`,
        the phases of `skipped` skipped (the same twice where it has no PADDING_TWINS)."""
        if not body.children:
            cost = self.cost(skipped) - base
            return cost, cost
        plain, padding = body["plain"], body["padding"]
        return (
            self.cost(skipped | {padding.address}) - base,
            self.cost(skipped | {plain.address}) - base,
        )

    def variants(self, block: _Found, residuals: int, skipped: set[int], base: int) -> list:
        """[(without, with) the padding test] per variant 0..residuals of a BOUNDARY block."""
        if not residuals:
            return [self.masked(block, skipped, base)]
        bodies = [block[f"variant[{j}]"] for j in range(residuals + 1)]
        every = block.addresses()
        return [self.masked(b, skipped | (every - {b.address}), base) for b in bodies]


def _read_set(reader: _StepReader, phases: dict[str, _Found], branches: Branches) -> PathCosts:
    """`read_paths` over one set of phases (init, full, the mixed ones and their twins,
    finalize), each found in the schedule under its declared name."""
    init, finalize = phases["init"], phases["finalize"]
    padded = phases.get("padded")
    # The step's bookkeeping: every phase skipped, a one-block selection's padded tile too
    # (read with it running, the bookkeeping took the padded tile's work into every skipped
    # step and left the FULL, BOUNDARY and finalize figures negative).
    every_phase = {f.address for f in phases.values()}
    bookkeeping = reader.cost(every_phase)
    padded_blocks = []
    if padded is not None:
        padded_blocks.append(reader.masked(padded, every_phase - {padded.address}, bookkeeping))
    tiles = [
        _boundary_tile(reader, branches, p, phases[f"mixed[{p}]"], every_phase, bookkeeping)
        for p in range(branches.patterns)
    ]
    if branches.compute_blocks == 1:  # a one-block tile across segments: a phase of its own
        segment = [
            (reader.masked(phases[name], every_phase - {phases[name].address}, bookkeeping),)
            for name in (f"segment[{p}]" for p in range(branches.patterns))
            if name in phases
        ]
    else:
        segment = [t.segment for t in tiles] if branches.segmented else []
    padded_blocks += [costs for t in tiles for costs in t.padded]
    pipeline = reader.cost(reader.pipeline) if reader.pipeline else bookkeeping
    run_init = every_phase - {init.address}
    return PathCosts(
        bookkeeping,
        reader.cost(every_phase - {phases["full"].address}),
        tuple(t.base for t in tiles),
        tuple(t.blocks for t in tiles),
        _init_per_pattern(reader, init, branches.patterns, run_init, reader.cost(every_phase)),
        reader.cost(every_phase - {finalize.address}) - bookkeeping,
        pipeline,
        tuple(segment),
        tuple(padded_blocks),
        residual_block=tuple(t.residual for t in tiles) if any(branches.residuals) else (),
        straight=tuple(t.straight for t in tiles) if any(t.straight for t in tiles) else (),
    )


@dataclasses.dataclass(frozen=True)
class _TileCosts:
    """What a BOUNDARY tile of one pattern costs (PathCosts' entries of the pattern)."""

    base: int  # the step with every block EMPTY
    blocks: tuple  # per block: (FULL, BOUNDARY, BOUNDARY on the padding tile)
    residual: tuple  # per block: per residual variant (plain, on the padding tile)
    straight: tuple = ()  # per straight word: (word, avoid_padding_tile, the whole step)
    segment: tuple = ()  # per block: a SEGMENT_BOUNDARY block's (plain, padding)
    padded: tuple = ()  # per block of a selection: a PADDED block's (plain, padding)


def _boundary_tile(
    reader: _StepReader, branches: Branches, pattern: int, tile: _Found, phases, bookkeeping
) -> _TileCosts:
    """The costs of a BOUNDARY tile of `pattern` (its phase `tile`), every other phase of
    `phases` skipped."""
    others = phases - {tile.address}
    residuals = branches.residuals[pattern]
    if branches.compute_blocks == 1:
        first, *rest = reader.variants(tile, residuals, others, bookkeeping)
        return _TileCosts(bookkeeping, ((0, *first),), (tuple(rest),))
    straight = ()
    per_block = tile
    if "blocks" in tile:  # straight-line bodies, then the per-block branches in one
        per_block, words = tile["blocks"], branches.straight[pattern]
        every = tile.addresses()
        straight = tuple(
            (w.word, w.avoid_padding_tile, reader.cost(others | (every - {body.address})))
            for w, body in zip(words, (tile[f"straight[{i}]"] for i in range(len(words))))
        )
        others = others | (every - {per_block.address})
    every = per_block.addresses()
    base = reader.cost(others | every)

    def extra(branch: _Found) -> tuple[int, int]:  # the block's branch run alone
        return reader.masked(branch, others | (every - {branch.address}), base)

    blocks, residual, segment, padded = [], [], [], []
    for index in range(branches.compute_blocks):
        full, boundary = per_block[f"full@{index}"], per_block[f"boundary@{index}"]
        skipped = others | (every - {boundary.address})
        first, *rest = reader.variants(boundary, residuals, skipped, base)
        blocks.append((extra(full)[0], *first))
        residual.append(tuple(rest))
        if branches.segmented:
            segment.append(extra(per_block[f"segment@{index}"]))
        if branches.padded_column is not None:  # (0, 0): a block off the padding column
            name = f"padded@{index}"
            padded.append(extra(per_block[name]) if name in per_block else (0, 0))
    return _TileCosts(base, tuple(blocks), tuple(residual), straight, tuple(segment), tuple(padded))


def _kernel_phases(top: list, phases: int) -> list:
    """init, the `phases` between (full and the mixed ones, or a bounded kernel's two sets)
    and finalize among the step's top-level branches: the run of phases + 2 branches whose
    middle ones do matmuls and whose last does none (the pipeline's own conditional DMA
    issues and waits sit around them at the same depth; a bounded kernel's init does one,
    its rows' norms)."""
    expected = phases + 2
    for start in range(len(top) - expected + 1):
        run = top[start : start + expected]
        if all(b.mix.get("vmatmul") for b in run[1:-1]) and not run[-1].mix.get("vmatmul"):
            return run
    raise RuntimeError(
        f"expected {expected} kernel phases (init, {phases} with matmuls, finalize) in the "
        f"schedule, found none among {len(top)} branches: the kernel and the cost model disagree"
    )


def _init_per_pattern(reader, init: _Found, patterns: int, run_init, every) -> tuple[int, ...]:
    """init's cost for a head of each pattern (`every`: the step with every phase skipped,
    `run_init`: all but init): with several patterns that decode query coordinates, init
    holds one decode branch per such pattern, and a head runs its own."""
    decodes = reader.inside(init.branch)
    bookkeeping = every
    whole = reader.cost(run_init) - bookkeeping
    if patterns == 1 or not decodes or len(decodes) != patterns:
        # Patterns without query coordinates have no decode branch: charge every head the
        # dearest decode (an upper bound, said here rather than guessed per pattern).
        return (whole,) * patterns
    return tuple(
        reader.cost(run_init | {d.address for d in decodes if d is not mine}) - bookkeeping
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
