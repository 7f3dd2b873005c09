"""The program-size budget: no TPU kernel past its chip's instruction memory leaves the compiler
unsaid.

A kernel's code grows with its patterns' paths, its straight-line BOUNDARY bodies, its
residual-mask variants and its compute blocks per tile. On a TPU v5e, forward kernels of up to
64,358 bundles ran at the rate their work predicts, and every one of 71,080 bundles or more
ran 1.3-6x slower than a smaller program doing the same work (docs/measured.md, "The
program-size cliff"): the core then fetches its program while it runs. The chip's budget is
`Target.program_bundles` (svgen.analysis.targets).

`fit` counts a rendered module's forward kernel program with libtpu's AOT compile on this host
(svgen.perf.measure: cached on disk by everything the schedule depends on, so a spec costs one
compile the first time) and, while it is over budget, gives up what costs least
(svgen.core.program.SHRINK_STEPS: straight-line bodies, then residual-mask variants),
re-rendering the module with the code left out. Where that is not enough it raises OverBudget
with the sizes and a tiling that fits (one compute block per tile, or 512 x 512 tiles),
counted the same way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
import tempfile
from typing import Callable

from svgen.core.program import SHRINK_STEPS, ProgramLimits


#: Kernels whose tiles hold at most this many query x key pairs, of at most SMALL_PATTERNS
#: patterns, are not counted: the largest such program seen is 23,439 bundles (cogvideox_mixed
#: at 512 x 512 tiles, two patterns with residual masks, v6e), a third of the budget, and a
#: count costs a libtpu compile (about 10 s even for a tiny kernel).
SMALL_TILE_PAIRS = 512 * 512
SMALL_PATTERNS = 4


def small_by_construction(plan) -> bool:
    """The kernel cannot come near its chip's budget (see SMALL_TILE_PAIRS): not counted."""
    t = plan.spec.tiling
    return t.block_q * t.block_kv <= SMALL_TILE_PAIRS and len(plan.patterns) <= SMALL_PATTERNS


class OverBudget(Exception):
    """The forward kernel is over its chip's budget with every shrink step taken."""


class Unavailable(Exception):
    """libtpu cannot count programs here (JAX or libtpu not installed)."""


@dataclasses.dataclass(frozen=True)
class ProgramSize:
    """A module's forward kernel program against its chip's budget."""

    target: str
    bundles: int
    budget: int
    budget_measured: bool  # the budget was measured on that chip (else carried over)
    limits: ProgramLimits  # what the compiler left out to get there
    tried: tuple[tuple[ProgramLimits, int], ...]  # each count taken, in order

    @property
    def fits(self) -> bool:
        return self.bundles <= self.budget

    def words(self) -> str:
        source = "measured on the chip" if self.budget_measured else "v5e's, not measured here"
        text = (
            f"forward kernel program {self.bundles:,} bundles of {self.target}'s budget of "
            f"{self.budget:,} ({source})"
        )
        if not self.limits.is_default:
            before = self.tried[0][1]
            text += f"; {before:,} before the compiler left out: {self.limits.words()}"
        return text

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "forward_bundles": self.bundles,
            "budget": self.budget,
            "budget_measured": self.budget_measured,
            "fits": self.fits,
            "left_out": self.limits.words() or None,
            "tried": [{"left_out": lim.words() or None, "bundles": n} for lim, n in self.tried],
        }


def forward_bundles(files: dict[str, bytes], plan) -> int:
    """The forward kernel's final bundles of a rendered TPU module, from libtpu's AOT compile
    for the plan's chip (cached: svgen.perf.measure). Counted in a child process: libtpu takes
    its bundle-dump flags only when it starts, and this process may have started it already
    (a test run, a notebook that imported JAX)."""
    import subprocess

    from svgen import codegen

    try:
        import jax  # noqa: F401  (the child needs it too; JAX is optional for compiling)
    except ImportError as exc:
        raise Unavailable(f"JAX is not installed ({exc})") from None
    with tempfile.TemporaryDirectory(prefix="svgen-size-") as tmp:
        for filename, data in files.items():
            (pathlib.Path(tmp) / filename).write_bytes(data)
        module = codegen.module_filename(plan.spec.name, plan.backend)
        child = subprocess.run(
            [sys.executable, "-m", "svgen.perf.program_size", tmp, module, plan.target.name],
            capture_output=True,
            text=True,
            timeout=COUNT_TIMEOUT_S,
        )
    lines = child.stdout.strip().splitlines()
    if child.returncode != 0 or not lines or not lines[-1].isdigit():
        why = (child.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise Unavailable(f"libtpu could not count the program here ({why})")
    return int(lines[-1])


#: One count's limit: the largest kernels compile in about a minute on a 2-core host.
COUNT_TIMEOUT_S = 900


def _import(path: pathlib.Path, name: str):
    loader_spec = importlib.util.spec_from_file_location(f"_svgen_size_{name}", path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[loader_spec.name] = module
    loader_spec.loader.exec_module(module)
    return module


def _count_in_this_process(folder: str, module_file: str, target: str) -> int:
    """The child's side of forward_bundles: libtpu's dump flags first, then the module."""
    from svgen.perf import measure, tpu_schedule

    tpu_schedule.ensure_dump_flags()
    module = _import(pathlib.Path(folder) / module_file, module_file.removesuffix(".py"))
    return measure.measure_paths(module, target).program


def fit(
    plan,
    render: Callable,
    *,
    count: Callable = forward_bundles,
    suggest: Callable | None = None,
    progress: Callable[[str], None] = lambda line: None,
    steps: tuple[ProgramLimits, ...] = SHRINK_STEPS,
):
    """(plan, files, ProgramSize): the plan (its `program` limits set where code was left
    out) and its rendered files, whose forward kernel fits the chip's budget. render(plan) ->
    files; count(files, plan) -> bundles; suggest(plan) -> words naming a tiling that fits
    (or None); steps: the shrink steps allowed. OverBudget where none is enough."""
    target = plan.target
    budget = target.program_bundles
    tried: list[tuple[ProgramLimits, int]] = []
    for limits in (plan.program, *[s for s in steps if s != plan.program]):
        candidate = dataclasses.replace(plan, program=limits)
        files = render(candidate)
        progress(f"counting the forward kernel's program for {target.name} (libtpu)")
        bundles = count(files, candidate)
        if tried and bundles == tried[-1][1]:
            tried.append((limits, bundles))
            continue  # nothing of that kind to leave out: the next step
        tried.append((limits, bundles))
        if bundles <= budget:
            size = ProgramSize(
                target.name, bundles, budget, target.program_measured, limits, tuple(tried)
            )
            return candidate, files, size
    sizes = ", ".join(f"{n:,}" + (f" ({lim.words()})" if lim.words() else "") for lim, n in tried)
    hint = suggest(plan) if suggest is not None else None
    raise OverBudget(
        f"the forward kernel's program is over {target.name}'s budget of {budget:,} bundles "
        f"even with the code the compiler may leave out: {sizes}. Past the core's instruction "
        'memory a kernel ran 2-5x slower on a TPU v5e (docs/measured.md, "The program-size '
        'cliff"); fewer patterns or smaller compute blocks make a smaller program'
        + (f"; {hint}" if hint else "")
    )


#: The tilings svgen picks on a TPU v5e for a spec that gives none, best first: the first whose
#: forward program fits the budget, the first one only where no more than its straight-line
#: bodies must be left out (its residual masks are what make its BOUNDARY blocks fast).
#: Measured on a v5e (svgen bench, bench/results/v5e_rule_*.json, v5e_shipped_at_1024x2048.json,
#: v5e_untuned_*.json; docs/measured.md, "A tiling without a chip"): 1024x2048 / 512x512 is the
#: fastest tiling measured for every single-pattern 75K-token spec whose program fits (blog
#: 69.97 ms against 80.57 at 512x1024 / 512x512, spatial 36.25 against 41.18, temporal 68.38
#: against 71.23); where it does not fit, 512x1024 / 512x512 was the fastest measured (mixed,
#: frame decay, HunyuanVideo text, cogvideox, and the untuned PARO-, Jenga- and
#: Sparse-VideoGen-like specs: 72.02 against 84.76 ms at 512 x 512 for PARO's, 227.99 against
#: 259.69 for Jenga's).
V5E_TILINGS = ((1024, 2048, 512, 512), (512, 1024, 512, 512), (512, 512, 512, 512))


def chip_free(
    plan, analyze_at: Callable, render: Callable, *, count=forward_bundles, progress=None
):
    """(plan, files, ProgramSize) at the first of V5E_TILINGS that the spec takes and whose
    program fits (analyze_at(tiling) -> plan, or None where the spec cannot take it); the
    spec's own default plan, fitted as usual, where none does."""
    progress = progress or (lambda line: None)
    for index, tiling in enumerate(V5E_TILINGS):
        candidate = analyze_at(tiling)
        if candidate is None:
            continue
        steps = SHRINK_STEPS[:1] if index == 0 else SHRINK_STEPS
        try:
            return fit(candidate, render, count=count, progress=progress, steps=steps)
        except OverBudget:
            progress(f"{tiling_words(tiling)} is over the budget: the next")
    return fit(plan, render, count=count, progress=progress)


def smaller_tilings(tiling: tuple[int, int, int, int]) -> list[tuple[int, int, int, int]]:
    """Tilings of the same compute blocks with fewer of them per tile, fewest cut first:
    each halves the tile's larger side (in compute blocks) until a tile is one block."""
    bq, bkv, cq, ckv = tiling
    out = []
    while (bq, bkv) != (cq, ckv):
        if bkv // ckv > bq // cq:
            bkv //= 2
        else:
            bq //= 2
        out.append((bq, bkv, cq, ckv))
    return out


def tiling_suggestion(spec, target: str, count_plan: Callable) -> str | None:
    """Words naming the largest tiling of the spec's compute blocks whose forward program
    fits (smaller_tilings), else 512 x 512 tiles; count_plan(plan) -> bundles. None where
    none fits."""
    from svgen.analysis import analyze
    from svgen.perf.measured_tune import with_tiling

    t = spec.tiling
    candidates = smaller_tilings((t.block_q, t.block_kv, t.cq, t.ckv))
    if (512, 512, 512, 512) not in candidates:
        candidates.append((512, 512, 512, 512))
    for tiling in candidates:
        try:
            plan = analyze(with_tiling(spec, tiling), target_name=target)
        except Exception:  # noqa: BLE001 - a tiling the spec cannot take is no suggestion
            continue
        bundles = count_plan(plan)
        if bundles <= plan.target.program_bundles:
            return (
                f"{tiling_words(tiling)} fits ({bundles:,} bundles): give it as `tiling.{target}`"
            )
    return None


def tiling_words(tiling: tuple[int, int, int, int]) -> str:
    bq, bkv, cq, ckv = tiling
    compute = f", compute_q: {cq}, compute_kv: {ckv}" if (cq, ckv) != (bq, bkv) else ""
    return f"the tiling {{block_q: {bq}, block_kv: {bkv}{compute}}}"


if __name__ == "__main__":  # forward_bundles' child: FOLDER MODULE_FILE TARGET
    print(_count_in_this_process(*sys.argv[1:4]))
