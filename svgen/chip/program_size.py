"""The program-size budget: no TPU kernel past its chip's instruction memory leaves the compiler
unsaid.

A kernel's code grows with its patterns' paths, its straight-line BOUNDARY bodies, its
residual-mask variants and its compute blocks per tile. On a TPU v5e, forward kernels up to a
size ran at the rate their work predicts, and every one past it ran several times slower than a
smaller program doing the same work (docs/measured.md, "The program-size cliff"): the core then fetches its program while it runs. The chip's budget is
`Target.program_bundles` (svgen.analysis.targets).

`fit` counts every kernel program of a rendered module (the forward kernel, and the dq and
dk/dv kernels of its jax.grad) with libtpu's AOT compile on this host, cached on disk by the
module's files, the chip, JAX's versions and svgen's kernel sources (a spec costs one compile
the first time), and, while the largest is over budget, gives up what costs least
(svgen.core.program.shrink_steps: one forward kernel per pattern where there are several, then
straight-line bodies, then residual-mask variants), re-rendering the module with the code left
out. Where that is not enough it raises OverBudget with the sizes and a tiling that fits (one
compute block per tile, or 512 x 512 tiles), counted the same way.

What the steps change, and what the budget holds, is the forward kernel: the one a video model
calls at every step of every denoising pass. The backward kernels (which run whole masks, with
neither straight-line bodies nor residual variants) are counted beside it; one over the budget
is said as a warning with its size (jax.grad through the module would then run slowly), not
refused, since a module used for inference never runs it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import pathlib
import sys
import tempfile
from typing import Callable

from svgen.core.program import ProgramLimits, shrink_steps


#: Kernels whose tiles hold at most this many query x key pairs, of at most SMALL_PATTERNS
#: patterns, are not counted: the largest such program seen (cogvideox_mixed at 512 x 512 tiles,
#: two patterns with residual masks, v6e; bench/results/v5e_program_sizes.json) is a third of
#: the budget, and a count costs a libtpu compile (seconds even for a tiny kernel).
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
    """A module's kernel programs against its chip's budget: `bundles` is the largest forward
    kernel's (what the budget holds), `kernels` every kernel's, the backward's too."""

    target: str
    bundles: int
    budget: int
    budget_measured: bool  # the budget was measured on that chip (else carried over)
    limits: ProgramLimits  # what the compiler left out to get there
    tried: tuple[tuple[ProgramLimits, int], ...]  # each count taken, in order
    kernels: tuple[tuple[str, int], ...] = ()  # (kernel name, bundles) of the module emitted

    @property
    def fits(self) -> bool:
        return self.bundles <= self.budget

    @property
    def backward_over(self) -> tuple[tuple[str, int], ...]:
        """The backward kernels over the budget."""
        return tuple((n, b) for n, b in self.kernels if is_backward(n) and b > self.budget)

    def words(self) -> str:
        source = "measured on the chip" if self.budget_measured else "v5e's, not measured here"
        text = (
            f"forward kernel program {self.bundles:,} bundles of {self.target}'s budget of "
            f"{self.budget:,} ({source})"
        )
        if self.kernels:
            text += " [" + ", ".join(f"{_short(n)} {b:,}" for n, b in self.kernels) + "]"
        if not self.limits.is_default:
            before = self.tried[0][1]
            text += f"; {before:,} before the compiler left out: {self.limits.words()}"
        return text

    def warning(self) -> str | None:
        """A backward kernel over the budget, in words (None: none is)."""
        if not self.backward_over:
            return None
        sizes = ", ".join(f"{_short(n)} {b:,} bundles" for n, b in self.backward_over)
        return (
            f"backward kernel program over {self.target}'s budget of {self.budget:,} ({sizes}): "
            "jax.grad through this module may run several times slower than its work; fewer compute "
            "blocks per tile make a smaller program"
        )

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "forward_bundles": self.bundles,
            "kernels": {name: n for name, n in self.kernels},
            "backward_over_budget": [name for name, _ in self.backward_over],
            "budget": self.budget,
            "budget_measured": self.budget_measured,
            "fits": self.fits,
            "left_out": self.limits.words() or None,
            "tried": [{"left_out": lim.words() or None, "bundles": n} for lim, n in self.tried],
        }


def is_backward(kernel: str) -> bool:
    """A backward kernel's name (the dq and dk/dv walks)."""
    return re.match(r"svgen_attention_(dq|dkv)(_pattern\d+)?$", kernel) is not None


def _short(kernel: str) -> str:
    """A kernel's name without the prefix every svgen kernel has."""
    return kernel.removeprefix("svgen_attention").lstrip("_") or "forward"


def kernel_bundles(files: dict[str, bytes], plan) -> dict[str, int]:
    """{kernel name: final bundles} of every svgen kernel of a rendered TPU module's forward
    call and jax.grad (svgen_attention, or svgen_attention_pattern<i> per pattern;
    svgen_attention_dkv, svgen_attention_dq), from libtpu's AOT compile for the plan's chip.
    Cached on disk by the files, the chip, JAX's versions and svgen's kernel sources. Counted
    in a child process: libtpu takes its bundle-dump flags only when it starts, and this
    process may have started it already (a test run, a notebook that imported JAX)."""
    import subprocess

    from svgen import codegen
    from svgen.estimate import measure

    try:
        import jax  # noqa: F401  (the child needs it too; JAX is optional for compiling)
    except ImportError as exc:
        raise Unavailable(f"JAX is not installed ({exc})") from None

    def count() -> _Counts:
        with tempfile.TemporaryDirectory(prefix="svgen-size-") as tmp:
            for filename, data in files.items():
                (pathlib.Path(tmp) / filename).write_bytes(data)
            module = codegen.module_filename(plan.spec.name, plan.backend)
            child = subprocess.run(
                [sys.executable, "-m", "svgen.chip.program_size", tmp, module, plan.target.name],
                capture_output=True,
                text=True,
                timeout=COUNT_TIMEOUT_S,
                env=_COUNTING_ENV | dict(os.environ) | _NO_DEVICE,
            )
        lines = child.stdout.strip().splitlines()
        try:
            return _Counts.from_json(json.loads(lines[-1]))
        except (IndexError, ValueError, TypeError, AttributeError):
            why = (child.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise Unavailable(f"libtpu could not count the program here ({why})") from None

    key = _files_key(files, plan.target.name)
    return dict(measure.cached_counts(key, count, _Counts.from_json).bundles)


#: A count compiles for a named topology and never needs a device: the child starts no TPU
#: backend (on a TPU VM, `svgen bench` holds the chip while it asks what `svgen compile` would
#: write) and loads libtpu beside any process holding it (svgen.runtime.libtpu_env).
_NO_DEVICE = {"JAX_PLATFORMS": "cpu"}
_COUNTING_ENV = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def forward_bundles(counts: dict[str, int]) -> int:
    """The largest forward kernel program among kernel_bundles' counts: what the budget
    holds."""
    return max(n for name, n in counts.items() if not is_backward(name))


@dataclasses.dataclass(frozen=True)
class _Counts:
    """kernel_bundles' cached value."""

    bundles: tuple[tuple[str, int], ...]

    @classmethod
    def from_json(cls, obj) -> "_Counts":
        if (
            not isinstance(obj, dict)
            or not obj
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in obj.values())
        ):
            raise ValueError("not a kernel count")
        return cls(tuple(sorted((str(k), int(v)) for k, v in obj.items())))

    def to_json(self) -> dict:
        return dict(self.bundles)


def _files_key(files: dict[str, bytes], target: str) -> str:
    """What a count depends on: the module's files, the chip, and (in measure's key) JAX's
    versions and svgen's kernel sources."""
    import hashlib

    from svgen.estimate import measure

    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return measure.counts_key(f"programs {COUNT_VERSION}", target, digest.hexdigest())


#: What the counting child does (which kernels, which calls): a new version is a new key.
COUNT_VERSION = 2


#: One count's limit: the largest kernels compile in about a minute on a 2-core host.
COUNT_TIMEOUT_S = 900


def _import(path: pathlib.Path, name: str):
    loader_spec = importlib.util.spec_from_file_location(f"_svgen_size_{name}", path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[loader_spec.name] = module
    loader_spec.loader.exec_module(module)
    return module


def _count_in_this_process(folder: str, module_file: str, target: str) -> dict[str, int]:
    """The child's side of kernel_bundles: libtpu's dump flags first, then the module's
    forward call and jax.grad compiled once, and each svgen kernel's bundles read."""
    import jax
    import jax.numpy as jnp

    from svgen.estimate import measure, tpu_schedule

    tpu_schedule.ensure_dump_flags()
    module = _import(pathlib.Path(folder) / module_file, module_file.removesuffix(".py"))
    names = module.attention.runtime.arguments()

    def both(q, k, v, hp, *runtime_inputs):
        extra = dict(zip(names, runtime_inputs))

        def loss(q, k, v):
            out = module.attention(q, k, v, head_pattern=hp, **extra)
            return jnp.sum(out.astype(jnp.float32))

        out = module.attention(q, k, v, head_pattern=hp, **extra)
        return out, jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    args = measure.aot_args(module, target) + measure.runtime_args(module, target)
    dumps, _ = tpu_schedule.compile_programs(both, *args, target=target)
    counts: dict[str, int] = {}
    for name, text in dumps.items():
        # The forward kernel compiles twice (the call's, and the gradient's with its lse):
        # one name, the larger program.
        kernel = tpu_schedule.base_kernel_name(name)
        if kernel.startswith("svgen_attention"):
            bundles = len(tpu_schedule.parse_bundles(text).bundles)
            counts[kernel] = max(counts.get(kernel, 0), bundles)
    return counts


def fit(
    plan,
    render: Callable,
    *,
    count: Callable | None = None,
    suggest: Callable | None = None,
    progress: Callable[[str], None] = lambda line: None,
    steps: tuple[ProgramLimits, ...] | None = None,
):
    """(plan, files, ProgramSize): the plan (its `program` limits set where code was left
    out) and its rendered files, whose kernel programs fit the chip's budget. render(plan) ->
    files; count(files, plan) -> {kernel: bundles} (or the largest, an int); suggest(plan) ->
    words naming a tiling that fits (or None); steps: the shrink steps allowed (default:
    shrink_steps for the plan). OverBudget where none is enough."""
    count = count or kernel_bundles  # looked up when called: tests replace it
    target = plan.target
    budget = target.program_bundles
    if steps is None:
        steps = shrink_steps(len(plan.patterns), plan.target.cores_per_chip)
    tried: list[tuple[ProgramLimits, int]] = []
    for limits in (plan.program, *[s for s in steps if s != plan.program]):
        candidate = dataclasses.replace(plan, program=limits)
        files = render(candidate)
        progress(f"counting the kernels' programs for {target.name} (libtpu)")
        counted = count(files, candidate)
        kernels = tuple(sorted(counted.items())) if isinstance(counted, dict) else ()
        bundles = forward_bundles(counted) if isinstance(counted, dict) else counted
        if tried and bundles == tried[-1][1]:
            tried.append((limits, bundles))
            continue  # nothing of that kind to leave out: the next step
        tried.append((limits, bundles))
        if bundles <= budget:
            size = ProgramSize(
                target.name, bundles, budget, target.program_measured, limits, tuple(tried), kernels
            )
            return candidate, files, size
    sizes = ", ".join(f"{n:,}" + (f" ({lim.words()})" if lim.words() else "") for lim, n in tried)
    hint = suggest(plan) if suggest is not None else None
    raise OverBudget(
        f"the forward kernel's program is over {target.name}'s budget of {budget:,} bundles "
        f"even with the code the compiler may leave out: {sizes}. Past the core's instruction "
        'memory a kernel ran several times slower on a TPU v5e (docs/measured.md, "The program-size '
        'cliff"); fewer patterns or smaller compute blocks make a smaller program'
        + (f"; {hint}" if hint else "")
    )


#: The tilings svgen picks on a TPU v5e for a spec that gives none, best first: the first whose
#: forward programs fit the budget, with what the compiler may leave out (shrink_steps: one
#: kernel per pattern, straight-line bodies, whole masks). Measured on a v5e (svgen bench;
#: docs/measured.md, "A tiling without a chip", generated from bench/results):
#: 1024x2048 / 512x512 was the fastest tiling measured for every 75K-token spec whose programs
#: fit, with its default code or with code left out to fit (jenga-like with its residual masks
#: left out 203.81 ms, against 207.25 at 1024x1024 and 228.09 at 512x1024; hunyuan_720p_text
#: 187.95 against 207.29 at 512x1024; one kernel per pattern: sparse-vDiT-like 59.07 against
#: 70.04, PARO-like 58.86 against 62.05 and 71.95, wan21_720p_mixed 26.61 against 31.05).
#: Where it does not fit, 1024x1024 / 512x512 was within 2 % of the best measured (jenga-like,
#: PARO-like) and 512x1024 / 512x512 the fastest of the rest.
V5E_TILINGS = (
    (1024, 2048, 512, 512),
    (1024, 1024, 512, 512),
    (512, 1024, 512, 512),
    (512, 512, 512, 512),
)


def chip_free(plan, analyze_at: Callable, render: Callable, *, count=None, progress=None):
    """(plan, files, ProgramSize) at the first of V5E_TILINGS that the spec takes and whose
    programs fit with what the compiler may leave out (analyze_at(tiling) -> plan, or None
    where the spec cannot take it); the spec's own default plan, fitted as usual, where none
    does."""
    progress = progress or (lambda line: None)
    for tiling in V5E_TILINGS:
        candidate = analyze_at(tiling)
        if candidate is None:
            continue
        try:
            return fit(candidate, render, count=count, progress=progress)
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


def tiling_suggestion(spec, target: str, fits_at: Callable) -> str | None:
    """Words naming the largest tiling of the spec's compute blocks whose programs fit
    (smaller_tilings), else 512 x 512 tiles; fits_at(plan) -> its ProgramSize with what the
    compiler may leave out, or None where it is over budget. None where no tiling fits."""
    from svgen.analysis import analyze
    from svgen.chip.measured_tune import with_tiling

    t = spec.tiling
    candidates = smaller_tilings((t.block_q, t.block_kv, t.cq, t.ckv))
    if (512, 512, 512, 512) not in candidates:
        candidates.append((512, 512, 512, 512))
    for tiling in candidates:
        try:
            plan = analyze(with_tiling(spec, tiling), target_name=target)
        except Exception:  # noqa: BLE001 - a tiling the spec cannot take is no suggestion
            continue
        size = fits_at(plan)
        if size is not None:
            left_out = f"; {size.limits.words()}" if not size.limits.is_default else ""
            return (
                f"{tiling_words(tiling)} fits ({size.bundles:,} bundles{left_out}): give it as "
                f"`tiling.{target}`"
            )
    return None


def tiling_words(tiling: tuple[int, int, int, int]) -> str:
    bq, bkv, cq, ckv = tiling
    compute = f", compute_q: {cq}, compute_kv: {ckv}" if (cq, ckv) != (bq, bkv) else ""
    return f"the tiling {{block_q: {bq}, block_kv: {bkv}{compute}}}"


if __name__ == "__main__":  # kernel_bundles' child: FOLDER MODULE_FILE TARGET
    print(json.dumps(_count_in_this_process(*sys.argv[1:4]), sort_keys=True))
