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

The parts: this module (the search space and the ranking), `tune_rows` (Candidate, Row,
TuneResult), `path_estimate` (estimate_paths), `tune_text` (the table and summary the
command prints) and `tiling_rewrite` (--apply).
"""

from __future__ import annotations

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
from svgen.estimate.path_estimate import estimate_paths
from svgen.estimate.tune_rows import Candidate, Row, TuneResult

# The table, the --apply rewrite and the result types live in modules of their own;
# svgen.estimate.tune keeps their names for the commands and tests that read them here.
from svgen.estimate.tiling_rewrite import rewrite_tiling  # noqa: F401
from svgen.estimate.tune_text import format_table, summary_lines  # noqa: F401

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
        compile time, svgen.estimate.cost.KernelOutOfVmem) or its program is over the chip's
        budget: the candidate is then skipped."""
        from svgen.estimate.cost import KernelOutOfVmem

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
        from svgen.estimate import cost

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
    from svgen.estimate.tpu_schedule import ensure_dump_flags

    ensure_dump_flags()

    def measure(plan: Plan):
        from svgen.estimate import cost

        # The full-sequence kernel's paths rank tilings (a kv_cache spec's chunked call has the
        # same body per step; compiling it too would double every costed candidate's compile).
        return cost.cost_plan(plan, spec_path, chunks=False).paths

    return measure
