"""`svgen tune`: pick a spec's tiles (and align mode) with the `svgen cost` model.

The search space: DMA tiles q x kv from TILE_SIZES (kv tiles also of WIDE_KV_SIZES with
`--wide`), compute blocks from COMPUTE_SIZES that divide them (at most 16 per tile), the
spec's own tiling, times the align modes asked for.
When every head uses one tiled layout whose cube is a multiple of 128 tokens, tiles of 1, 2,
4 and 8 cubes and compute blocks of one cube join them: whole cubes make a cube window's
blocks FULL or EMPTY, which powers of two cut (STA's 6 x 8 x 8 cubes are 384 tokens).
Each candidate is analyzed as `svgen compile` would (a candidate over the SMEM or VMEM budget
is dropped, with the reason), then costed.

Costing every candidate exactly would take one libtpu compile each (~15-25 s here). But the
per-path costs of a grid step depend on the compute-block shape, the number of blocks per
tile and the mask code, not on the tile counts, which the model walks from the tables
exactly. So:
  1. the spec's own tiling is compiled, and per compute-block shape and mask code (exact, or
     aligned: an aligned kernel has no mask code) one *probe*: the candidate with 2 x 4 such
     blocks per tile (or the nearest shape that exists);
  2. every other candidate's per-path costs are *estimated* from the compiled ones of its
     compute-block shape and mask code (`estimate_paths`: per-block and per-branch costs as
     measured, what grows with the tile fitted);
  3. the ranking walks the tables of every candidate with those costs (`cost.model_cycles`);
     while one of the first `confirm` rows is an estimate, the best such is compiled, its
     shape's estimates are refitted with the new point, and the rows re-ranked.
Estimates charge every BOUNDARY tile its per-block branches: a compiled kernel runs its
commonest blocks words straight-line (svgen.core.straight), a little faster, which only the
compiled rows show. The first choice is therefore always an exactly costed kernel; `exhaustive` compiles every
candidate (to check the estimates). Compiles are cached on disk by `svgen cost`, so the
aligned modes of one tiling (the same mask-free code) share theirs, and a second tune costs
no compile.

On the blog spec (wan21_720p_band, 44 tilings; 88 candidates with two align modes) a cold
tune compiles 12 kernels in about 4 minutes on a 2-core machine; an exhaustive run (88
compiles, 12.8 minutes) finds the same first choice. Estimates were 2.6% off on average; the
worst (up to 14% low) are one-block tiles, which the confirm loop compiles if they rank high.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

import yaml

from svgen.analysis import DEFAULT_SMEM_BUDGET, Plan, analyze
from svgen.spec.errors import SpecError
from svgen.core.layout import Tiled
from svgen.spec import (
    ALIGN_MODES,
    BLOCK_MAX,
    BLOCK_MULTIPLE,
    MAX_COMPUTE_BLOCKS,
    Spec,
    parse_spec,
)
from svgen.analysis.targets import DEFAULT_TARGET, TARGETS
from svgen.perf.paths import PathCosts, mean

TILE_SIZES = (512, 1024, 2048, 4096)
COMPUTE_SIZES = (
    512,
    1024,
)  # the MXU works near its peak on these (docs/measured.md, bench/kernel_cost.py)
DEFAULT_CONFIRM = 3
# A spec whose every query keeps fewer keys than this (at most, over its patterns) is narrow:
# its queries' keys fit in less than one tile of the smallest TILE_SIZES, and the search adds
# NARROW_SIZES to the tiles and compute blocks, where fewer of a visited tile's pairs are
# empty. (NATTEN 3 x 7 x 7 at 75.6K tokens, 147 keys a query: 256-wide tiles model 8-35%
# slower than 512 x 512, the step's bookkeeping outweighing the pairs saved; measured at
# commit ba4f3f8 with `svgen cost`.)
NARROW_KEYS = 512
NARROW_SIZES = (256,)
# `wide` (svgen tune --wide): kv tiles of this width too. They halve the grid steps of
# 4096-wide ones (the blog spec with a bounded softmax and `align: balanced`: 3.259x over
# dense Splash's best at 2048 x 8192 against 3.230x at 2048 x 4096, bench/kernel_cost.py
# --blog), but each such kernel compiles in 3-4 minutes here, so they are asked for.
WIDE_KV_SIZES = (8192,)

Progress = Callable[[str, int, int], None]  # (what, done, total)
Measure = Callable[[Plan], object]  # a plan -> its exact cost.PathCosts (compiles)


@dataclasses.dataclass(frozen=True, order=True)
class Candidate:
    block_q: int
    block_kv: int
    compute_q: int
    compute_kv: int
    align: str = "exact"

    @property
    def compute_shape(self) -> tuple[int, int]:
        return self.compute_q, self.compute_kv

    @property
    def blocks(self) -> int:
        return (self.block_q // self.compute_q) * (self.block_kv // self.compute_kv)

    @property
    def tiling_key(self) -> tuple[int, int, int, int]:
        return self.block_q, self.block_kv, self.compute_q, self.compute_kv

    @property
    def aligned(self) -> bool:
        """Every aligned mode generates the same mask-free code; exact keeps the mask."""
        return self.align != "exact"

    @property
    def code_key(self) -> tuple[int, int, int, int, bool]:
        """What the kernel's code depends on: the tiling and whether the mask is aligned."""
        return self.tiling_key + (self.aligned,)

    def label(self) -> str:
        tile = f"{self.block_q}x{self.block_kv}"
        if self.blocks == 1:
            return tile
        return f"{tile} / {self.compute_q}x{self.compute_kv}"

    def tiling(self) -> dict:
        """The spec's `tiling` mapping (compute blocks and align only when they matter)."""
        out = {"block_q": self.block_q, "block_kv": self.block_kv}
        if self.blocks > 1:
            out.update(compute_q=self.compute_q, compute_kv=self.compute_kv)
        if self.align != "exact":
            out["align"] = self.align
        return out


@dataclasses.dataclass
class Row:
    """One costed candidate."""

    candidate: Candidate
    plan: Plan
    cycles: int
    dense_cycles: int
    steps: int  # grid steps of one call, all heads
    exact: bool  # compiled (True) or estimated from its probe
    estimated_cycles: int | None = None  # the estimate, when it was also compiled
    current: bool = False  # the spec's own tiling

    @property
    def ms(self) -> float:
        return self.cycles / (self.plan.target.clock_ghz * 1e6)

    def to_json(self, dense_reference: int) -> dict:
        p = self.plan
        out = {
            "tiling": self.candidate.tiling(),
            "label": self.candidate.label(),
            "align": self.candidate.align,
            "steps": self.steps,
            "visited_fraction": _visited(p),
            "smem_bytes": p.table_bytes,
            "vmem_bytes": p.kernel.vmem.limit(),
            "cycles": self.cycles,
            "ms": self.ms,
            "speedup_vs_dense": dense_reference / self.cycles,
            "dense_cycles": self.dense_cycles,
            "cost": "compiled" if self.exact else "estimated",
            "current": self.current,
        }
        if self.estimated_cycles is not None:
            out["estimated_cycles"] = self.estimated_cycles
        if len(p.patterns) == 1:
            out.update(_pattern_pairs(p.only))
        else:
            out["patterns"] = {x.name: _pattern_pairs(x) for x in p.patterns}
        return out


@dataclasses.dataclass
class TuneResult:
    spec: Spec
    target: str
    rows: list[Row]  # ranked, fastest first
    dropped: list[tuple[Candidate, str]]  # over a budget: (candidate, why)
    compiles: int
    seconds: float

    @property
    def choice(self) -> Row:
        return self.rows[0]

    @property
    def dense_reference(self) -> int:
        """The fastest dense (keep-everything) kernel among the compiled candidates: one
        denominator for every row's speedup."""
        compiled = [r.dense_cycles for r in self.rows if r.exact] or [
            r.dense_cycles for r in self.rows
        ]
        return min(compiled)

    def to_json(self) -> dict:
        from svgen.perf.cost import MODEL_CAVEAT

        ref = self.dense_reference
        return {
            "estimate": MODEL_CAVEAT,
            "spec": self.spec.name,
            "target": self.target,
            "seconds": self.seconds,
            "compiles": self.compiles,
            "candidates": len(self.rows) + len(self.dropped),
            "dense_reference_cycles": ref,
            "choice": self.choice.to_json(ref),
            "rows": [r.to_json(ref) for r in self.rows],
            "dropped": [
                {"tiling": c.tiling(), "label": c.label(), "align": c.align, "reason": why}
                for c, why in self.dropped
            ],
        }


def candidates(
    spec: Spec, aligns: Sequence[str], narrow: bool = False, wide: bool = False
) -> list[Candidate]:
    """The search space (module docstring), the spec's own tiling first; with NARROW_SIZES
    for a `narrow` spec (NARROW_KEYS), and kv tiles of WIDE_KV_SIZES where asked (`wide`)."""
    t = spec.tiling
    out = [Candidate(t.block_q, t.block_kv, t.cq, t.ckv, a) for a in aligns]
    tiles, computes = TILE_SIZES, COMPUTE_SIZES
    if narrow:
        tiles, computes = NARROW_SIZES + tiles, NARROW_SIZES + computes
    cube = _cube_tokens(spec)
    if cube:
        computes = tuple(sorted({*computes, cube}))
        tiles = tuple(sorted({*tiles, *(cube * m for m in (1, 2, 4, 8) if cube * m <= BLOCK_MAX)}))
    kv_tiles = tuple(sorted({*tiles, *WIDE_KV_SIZES})) if wide else tiles
    for bq in tiles:
        for bkv in kv_tiles:
            for cq in (c for c in computes if c <= bq and bq % c == 0):
                for ckv in (c for c in computes if c <= bkv and bkv % c == 0):
                    if (bq // cq) * (bkv // ckv) > MAX_COMPUTE_BLOCKS:
                        continue
                    out += [Candidate(bq, bkv, cq, ckv, a) for a in aligns]
    seen: set[Candidate] = set()
    return [c for c in out if not (c in seen or seen.add(c))]


def _cube_tokens(spec: Spec) -> int | None:
    """The tokens of the cube of the one tiled layout every head uses, when they are a whole
    number of 128-token TPU tiles (else None)."""
    layouts = {c.layout for c in spec.head_patterns().candidates}
    if len(layouts) != 1:
        return None
    (layout,) = layouts
    if not isinstance(layout, Tiled):
        return None
    tokens = layout.frames * layout.rows * layout.cols
    return tokens if tokens % BLOCK_MULTIPLE == 0 and tokens <= BLOCK_MAX else None


def candidate_spec(spec_text: str, source: str, c: Candidate) -> Spec:
    """The spec with this candidate's tiling, read as `svgen compile` reads a file (every
    check of the spec reader applies); the candidate's is its only tiling (the chips' own,
    `tiling.<chip>`, go with the rest of `tiling`)."""
    data = yaml.safe_load(spec_text)
    data["tiling"] = {**c.tiling(), "compute_q": c.compute_q, "compute_kv": c.compute_kv}
    return parse_spec(yaml.safe_dump(data, sort_keys=False), source=source)


def tune(
    spec_path: str,
    *,
    target: str = DEFAULT_TARGET,
    aligns: Sequence[str] | None = None,
    smem_budget: int = DEFAULT_SMEM_BUDGET,
    confirm: int = DEFAULT_CONFIRM,
    exhaustive: bool = False,
    wide: bool = False,
    measure: Measure | None = None,
    progress: Progress | None = None,
) -> TuneResult:
    """Rank the search space of the spec at `spec_path` (module docstring), read for
    `target` (its own tiling, `tiling.<target>`, where the spec names it); `wide`: with kv
    tiles of WIDE_KV_SIZES."""
    start = time.perf_counter()
    text = _read(spec_path)
    spec = parse_spec(text, source=spec_path, chip=target if target in TARGETS else None)
    aligns = tuple(aligns or (spec.tiling.align,))
    for mode in aligns:
        if mode not in ALIGN_MODES:
            raise SpecError(f"--align: unknown mode {mode!r}; one of {', '.join(ALIGN_MODES)}")
    if measure is None:
        measure = _compile_measure(spec_path)
    progress = progress or (lambda what, done, total: None)
    plans, dropped = _analyze_all(
        text, spec_path, spec, aligns, target, smem_budget, progress, wide
    )
    if not plans:
        raise SpecError(
            "no candidate tiling fits the SMEM and VMEM budgets", file=spec_path, key="tiling"
        )
    costs = _Costs(measure, progress, spec.geometry.seq_len)
    t = spec.tiling
    current = Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align)
    if current in plans:  # what the user has, costed exactly (often in the cache already)
        costs.exact(current, plans[current])
    for shape, aligned in sorted({(c.compute_shape, c.aligned) for c in plans}):
        _probe_exactly(shape, aligned, plans, costs)
    rows = [costs.row(c, plan) for c, plan in plans.items() if c.code_key not in costs.refused]
    for row in rows:
        row.current = row.candidate == current
    rows = _confirm(rows, costs, len(rows) if exhaustive else confirm)
    dropped += costs.skipped(plans)
    if not rows:
        raise SpecError(
            f"no candidate tiling compiled within the chip's VMEM and program budgets "
            f"({dropped[-1][1]})",
            file=spec_path,
            key="tiling",
        )
    return TuneResult(spec, target, rows, dropped, costs.compiles, time.perf_counter() - start)


def estimate_paths(points: Sequence[tuple[Candidate, object]], c: Candidate, seq_len: int):
    """Per-path costs of candidate `c` from the exact ones of `points` (candidates of the
    same compute-block shape, and their PathCosts), by what libtpu's schedules show:
      * bookkeeping, a compute block's cost by kind inside a BOUNDARY tile (FULL, BOUNDARY,
        BOUNDARY with the padding test) and the pipeline step do not depend on the tile;
      * a BOUNDARY tile's branch overhead grows with its number of blocks;
      * a FULL tile's straight-line body costs, per row of blocks, r0 + (blocks in the row)
        x c (the state is loaded and stored once per row): fitted when the points have two
        row lengths, else r0 = 0 through the one (over-estimating longer rows a little);
      * init and finalize grow with the q tile's rows.
    With one block per tile the kernel has no blocks word: a BOUNDARY tile is then the
    bookkeeping, the branch overhead of one block and one masked block."""
    first = points[0][1]
    bk = round(mean(p.bookkeeping for _, p in points))
    r0, per_block = _fit_rows(points)
    rk = c.block_kv // c.compute_kv
    full = bk + round((c.block_q // c.compute_q) * (r0 + rk * per_block))
    scale = [c.block_q / k.block_q for k, _ in points]
    init = tuple(
        round(mean(p.init[i] * r for (_, p), r in zip(points, scale)))
        for i in range(len(first.init))
    )
    finalize = round(mean(p.finalize * r for (_, p), r in zip(points, scale)))
    column = (seq_len - 1) % c.block_kv // c.compute_kv if seq_len % c.compute_kv else -1
    multi = [(k, p) for k, p in points if k.blocks > 1] or list(points)
    mixed, blocks = [], []
    for index in range(len(first.mixed)):
        overhead = mean((p.mixed[index] - p.bookkeeping) / k.blocks for k, p in multi)
        per_block_costs = [b for _, p in multi for b in p.block[index]]
        f = mean(b[0] for b in per_block_costs if b[0])
        b = mean(b[1] for b in per_block_costs)
        extra = max(x[2] - x[1] for x in per_block_costs)
        if c.blocks == 1:
            mixed.append(bk)
            blocks.append(((0, round(b + overhead), round(b + overhead + extra)),))
            continue
        mixed.append(bk + round(overhead * c.blocks))
        blocks.append(
            tuple(
                (round(f), round(b), round(b + extra) if i % rk == column else round(b))
                for i in range(c.blocks)
            )
        )
    return PathCosts(
        bk,
        full,
        tuple(mixed),
        tuple(blocks),
        init,
        finalize,
        round(mean(p.pipeline for _, p in points)),
    )


def _fit_rows(points) -> tuple[float, float]:
    """(r0, c) of a FULL tile's body per row of blocks, r0 + blocks_in_row * c, by least
    squares over the points (r0 = 0 when they all have one row length)."""
    xs = [k.block_kv // k.compute_kv for k, _ in points]
    ys = [(p.full - p.bookkeeping) / (k.block_q // k.compute_q) for k, p in points]
    if len(set(xs)) < 2:
        return 0.0, mean(y / x for x, y in zip(xs, ys))
    mx, my = mean(xs), mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


# ----------------------------------------------------------------------------- internals
def _read(spec_path: str) -> str:
    try:
        with open(spec_path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise SpecError(
            f"cannot read the spec file: {exc.strerror or exc}", file=spec_path
        ) from None


def _analyze_all(text, spec_path, spec, aligns, target, smem_budget, progress, wide=False):
    """{candidate: plan} of those within the budgets and of more than one grid step, and
    [(candidate, why)] of the rest. The spec's own tiling first: its plan says whether the
    spec is narrow (NARROW_KEYS)."""
    space = candidates(spec, aligns, wide=wide)
    own = space[: len(aligns)]
    plans, dropped = {}, []

    def analyze_one(c: Candidate, done: int, total: int) -> Plan | None:
        progress(f"analyzing {c.label()} {c.align}", done, total)
        try:
            plan = analyze(
                candidate_spec(text, spec_path, c), smem_budget=smem_budget, target_name=target
            )
        except SpecError as err:
            dropped.append((c, err.message))
            return None
        if plan.grid_steps == 1:  # tiles as long as a short sequence: nothing to cost (svgen
            # cost refuses it, blaming `tiling:`): libtpu leaves out the grid loop it reads
            dropped.append((c, "a single grid step per head: the cost model has no step to read"))
        else:
            plans[c] = plan
        return plan

    own_plans = [analyze_one(c, done, len(space)) for done, c in enumerate(own, 1)]
    own_plans = [plan for plan in own_plans if plan is not None]
    if own_plans and _is_narrow(own_plans[0]):
        space = candidates(spec, aligns, narrow=True, wide=wide)
    rest = [c for c in space if c not in own]
    for done, c in enumerate(rest, len(own) + 1):
        analyze_one(c, done, len(space))
    return plans, dropped


def _is_narrow(plan: Plan) -> bool:
    """Every query keeps fewer than NARROW_KEYS keys, at most (NARROW_KEYS)."""
    seq_len = plan.spec.geometry.seq_len
    return max(p.classification.kept_pairs_upper for p in plan.patterns) < NARROW_KEYS * seq_len


def _probe(shape: tuple[int, int], aligned: bool, plans: dict) -> Candidate:
    """The first candidate compiled for a compute-block shape and mask code (exact, or
    aligned): 2 x 4 blocks per tile when it exists (rows of several blocks, as the fast
    tilings have; every per-block cost is in it), else the one closest to that; of several
    aligned modes, the first."""
    same = [c for c in plans if c.compute_shape == shape and c.aligned == aligned]

    def distance(c: Candidate):
        return (
            abs(math.log2(c.block_q // c.compute_q) - 1)
            + abs(math.log2(c.block_kv // c.compute_kv) - 2),
            c.blocks == 1,
            c,
        )

    return min(same, key=distance)


def _probe_exactly(shape: tuple[int, int], aligned: bool, plans: dict, costs: "_Costs") -> None:
    """Compile the probe of a compute-block shape; where libtpu refuses it, the next one, so
    that the shape's other candidates have a compiled point to be estimated from (or, every
    one refused, none is left to estimate)."""
    left = {c: p for c, p in plans.items() if c.compute_shape == shape and c.aligned == aligned}
    while left:
        probe = _probe(shape, aligned, left)
        if costs.exact(probe, left[probe]) is not None:
            return
        left = {c: p for c, p in left.items() if c.code_key not in costs.refused}


class _Costs:
    """Exact per-path costs, one compile per kernel code (`Candidate.code_key`: the aligned
    modes of one tiling share theirs), and estimates from the compiled ones of the same
    compute-block shape and mask code."""

    def __init__(self, measure: Measure, progress: Progress, seq_len: int):
        self.measure, self.progress, self.seq_len = measure, progress, seq_len
        self.paths: dict[tuple, object] = {}  # code key -> exact PathCosts
        self.refused: dict[tuple, str] = {}  # code key -> why libtpu did not compile it
        self.compiles = 0

    def exact(self, c: Candidate, plan: Plan):
        """The candidate's exact costs; None when libtpu refused its kernel (out of VMEM at
        compile time, svgen.perf.cost.KernelOutOfVmem) or its program is over the chip's
        budget: the candidate is then skipped."""
        from svgen.perf.cost import KernelOutOfVmem

        if c.code_key in self.refused:
            return None
        if c.code_key not in self.paths:
            self.compiles += 1
            self.progress(f"costing {c.label()} (libtpu)", self.compiles, 0)
            try:
                self.paths[c.code_key] = self.measure(plan)
            except KernelOutOfVmem as err:
                self.refused[c.code_key] = err.message
                self.progress(f"skipping {c.label()}: libtpu ran out of VMEM", self.compiles, 0)
                return None
            over = _over_program_budget(self.paths[c.code_key], plan)
            if over:  # its costs stay a point for estimates; the candidate is never picked
                self.refused[c.code_key] = over
                self.progress(f"skipping {c.label()}: {over}", self.compiles, 0)
                return None
        return self.paths[c.code_key]

    def skipped(self, plans: dict) -> list[tuple[Candidate, str]]:
        """(candidate, why) of the candidates whose kernel libtpu refused."""
        return [(c, self.refused[c.code_key]) for c in plans if c.code_key in self.refused]

    def row(self, c: Candidate, plan: Plan) -> Row:
        """The candidate costed exactly when its code was compiled, else estimated."""
        from svgen.perf import cost

        paths = self.paths.get(c.code_key)
        exact = paths is not None
        if not exact:
            points = [
                (Candidate(*key[:4]), p)
                for key, p in sorted(self.paths.items())
                if key[2:4] == c.compute_shape and key[4] == c.aligned  # (code_key order)
            ]
            paths = estimate_paths(points, c, self.seq_len)
        cycles, steps, _ = cost.model_cycles(
            paths, plan.tables, cost.model_head_pattern(plan), cost.padding_tile(plan)
        )
        return Row(c, plan, cycles, cost.dense_cycles(paths, plan), sum(steps.values()), exact)


def _over_program_budget(paths, plan: Plan) -> str | None:
    """Why a candidate's kernel is off the table for its program size (None: it fits, or its
    size was not read): past the chip's budget a kernel ran slower on a TPU v5e than the model
    says (svgen.analysis.targets.V5E_MEASURED), and `svgen compile` would not emit it as costed."""
    budget = plan.target.program_bundles
    if not paths.program or paths.program <= budget:
        return None
    return (
        f"its forward program is {paths.program:,} bundles, over {plan.target.name}'s budget "
        f"of {budget:,}"
    )


def _confirm(rows: list[Row], costs: _Costs, top: int) -> list[Row]:
    """Rank; compile the best estimated row among the first `top` and re-estimate its
    compute-block shape's rows with the new point, until the first `top` are all exact."""
    while True:
        rows.sort(key=lambda r: (r.cycles, r.candidate))
        pending = [r for r in rows[:top] if not r.exact]
        if not pending:
            return rows
        compiled = pending[0]
        if costs.exact(compiled.candidate, compiled.plan) is None:  # skipped, with why
            rows = [r for r in rows if r.candidate.code_key not in costs.refused]
            continue
        for i, r in enumerate(rows):
            if not r.exact and r.candidate.compute_shape == compiled.candidate.compute_shape:
                again = costs.row(r.candidate, r.plan)
                again.current = r.current
                if again.exact:
                    again.estimated_cycles = r.cycles
                rows[i] = again


def _compile_measure(spec_path: str) -> Measure:
    """Per-path costs from libtpu's schedule (svgen cost). The dump flags must be set before
    libtpu starts: here, before the first compile (nothing earlier in a tune touches JAX)."""
    from svgen.perf.tpu_schedule import ensure_dump_flags

    ensure_dump_flags()

    def measure(plan: Plan):
        from svgen.perf import cost

        # The full-sequence kernel's paths rank tilings (a kv_cache spec's chunked call has the
        # same body per step; compiling it too would double every costed candidate's compile).
        return cost.cost_plan(plan, spec_path, chunks=False).paths

    return measure


def _visited(plan: Plan) -> float:
    return sum(p.visited_fraction for p in plan.patterns) / len(plan.patterns)


def _pattern_pairs(pattern) -> dict:
    """Density (of the mask the kernel runs) and, aligned, what aligning changed."""
    b = pattern.budget
    if b is None:
        return {"density": pattern.density}
    return {
        "density": b.density,
        "exact_density": b.exact_density,
        "recall": b.recall,
        "precision": b.precision,
        "rows_emptied": b.rows_emptied,
    }


# ----------------------------------------------------------------------------- output
def format_table(result: TuneResult) -> list[str]:
    """The ranked table (Markdown, so it pastes into a README), then a line per dropped kind."""
    ref = result.dense_reference
    aligned = any(r.candidate.align != "exact" for r in result.rows)
    head = (
        [
            "#",
            "tiles / compute blocks",
            "align",
            "steps",
            "visited",
            "SMEM B",
            "VMEM MiB",
            "cycles",
            "ms",
            "vs dense",
            "density",
        ]
        + (["recall"] if aligned else [])
        + ["cost"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, r in enumerate(result.rows, 1):
        j = r.to_json(ref)
        density, recall = _per_pattern(j, "density"), _per_pattern(j, "recall")
        cells = [
            str(rank),
            r.candidate.label() + (" (current)" if r.current else ""),
            r.candidate.align,
            f"{r.steps:,}",
            f"{j['visited_fraction']:.4f}",
            f"{j['smem_bytes']:,}",
            f"{j['vmem_bytes'] / 2**20:.0f}",
            f"{r.cycles:,}",
            f"{r.ms:.2f}",
            f"{j['speedup_vs_dense']:.2f}x",
            density,
        ]
        if aligned:
            cells.append(recall)
        cells.append(j["cost"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _per_pattern(row: dict, key: str) -> str:
    """A row's value of `key`, one per pattern (comma-separated) for several patterns."""
    values = [row] if "patterns" not in row else list(row["patterns"].values())
    return ", ".join(f"{v[key]:.4f}" for v in values if key in v)


def summary_lines(result: TuneResult) -> list[str]:
    from svgen.perf.cost import MODEL_CAVEAT

    c = result.choice
    lines = [
        f"{result.spec.name}: {len(result.rows)} candidates costed on {result.target} "
        f"({result.compiles} kernels compiled or read from the cost cache, the rest "
        f"estimated from them), {len(result.dropped)} over a budget; "
        f"{result.seconds:.0f} s",
        f"vs dense: against the fastest dense (keep-everything) kernel among the compiled "
        f"candidates, {result.dense_reference:,} cycles",
        f"first choice: {c.candidate.label()}, align {c.candidate.align}: "
        f"{c.ms:.2f} ms (static model)",
        f"every figure here is {MODEL_CAVEAT}; `svgen tune --measure` times the candidates on "
        "an attached TPU",
    ]
    reasons: dict[str, int] = {}
    for _, why in result.dropped:
        kind = "VMEM" if "VMEM" in why else "SMEM" if "SMEM" in why or "scalar" in why else why
        reasons[kind] = reasons.get(kind, 0) + 1
    for kind, n in sorted(reasons.items()):
        lines.append(
            f"dropped: {n} candidate(s) over the {kind} budget"
            if kind in ("VMEM", "SMEM")
            else f"dropped: {n} candidate(s): {kind}"
        )
    return lines


# ----------------------------------------------------------------------------- --apply
def rewrite_tiling(
    text: str, c: Candidate, source: str = "<string>", chip: str | None = None
) -> tuple[str, list[str]]:
    """The spec text with the candidate's tiling, through a round-trip YAML parser (comments,
    key order and flow style kept), and what changed, in words. Keys the file has are set;
    missing ones are added only when they matter (compute blocks other than the whole tile,
    an align mode other than exact).

    `chip` (a TPU target's name): the candidate's sizes go under `tiling.<chip>` (that chip's
    own tiling; a flow mapping of the keys that matter when the spec has none yet, and
    `tiling:` itself when missing), its align at the plain `tiling.align` (every chip's:
    align changes the mask); the changes name them `<chip>.block_q`, ... and `align`.

    A `tiling` mapping (or `tiling.<chip>`) that is a YAML anchor or alias (`tiling: &t
    {...}` with `gpu: *t`) is refused: the rewrite would change every key sharing it (the
    GPU's tiles would get compute blocks). Anchored scalars inside it are fine: a new value
    replaces the alias."""
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.util import load_yaml_guess_indent

    _, sequence, offset = load_yaml_guess_indent(text)
    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 4096
    rt.indent(mapping=2, sequence=sequence or 4, offset=offset if offset is not None else 2)
    data = rt.load(text)
    wanted = {
        "block_q": c.block_q,
        "block_kv": c.block_kv,
        "compute_q": c.compute_q,
        "compute_kv": c.compute_kv,
        "align": c.align,
    }
    needed = c.tiling()
    tiling = data.get("tiling")
    _refuse_anchor(tiling, data, "tiling", source)
    if not isinstance(tiling, dict):
        tiling = CommentedMap()
        tiling.fa.set_flow_style()
        data["tiling"] = tiling
    changes = []
    sizes, prefix = tiling, ""
    if chip is not None:
        sizes, prefix = tiling.get(chip), f"{chip}."
        _refuse_anchor(sizes, tiling, f"tiling.{chip}", source)
        if not isinstance(sizes, dict):
            sizes = CommentedMap()
            sizes.fa.set_flow_style()
            tiling[chip] = sizes
    for key, value in wanted.items():
        where, shown = (tiling, key) if key == "align" else (sizes, prefix + key)
        if key in where:
            if where[key] != value:
                changes.append(f"{shown}: {where[key]} -> {value}")
                where[key] = value
        elif key in needed:
            changes.append(f"{shown}: (not given) -> {value}")
            where[key] = value
    out = io.StringIO()
    rt.dump(data, out)
    return out.getvalue(), changes


def _refuse_anchor(mapping, parent, path: str, source: str) -> None:
    """A SpecError when ``mapping`` (``parent``'s value at the last key of ``path``) is a
    YAML anchor: rewriting it would change every key that shares it."""
    from ruamel.yaml.comments import CommentedMap

    if isinstance(mapping, CommentedMap) and mapping.anchor.value is not None:
        line, column = parent.lc.key(path.rpartition(".")[2])
        raise SpecError(
            f"--apply does not rewrite a tiling written with a YAML anchor or alias "
            f"(&{mapping.anchor.value}): it would change every key that shares it; write "
            f"{path}'s keys out in full, then run again",
            file=source,
            line=line + 1,
            column=column + 1,
            key=path,
        )
