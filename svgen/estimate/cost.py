"""`svgen cost`: a static model of a generated kernel's time on a TPU, from libtpu's schedule.

libtpu compiles the kernel for the target on this host (`svgen.estimate.measure`) and the bundles
of each control-flow path of one grid step are read from its schedule (`svgen.estimate.paths`,
whose docstring maps the kernel's phases onto paths). This module costs a spec: `cost_plan`
(render, compile, model one call; what it refuses before compiling, and libtpu's VMEM
refusal in one line) and the dense kernel at its best tiling (`dense_best`). The model over
the tables is `svgen.estimate.cycle_model` (`model_cycles`), the report's dataclasses
`svgen.estimate.cost_report`, its text `svgen.estimate.cost_text`.

The modelled time is the sum over the tables of every head of the cost of each step (read
from the same tables the kernel walks) plus the pipeline's two extra iterations. It is a
*static* model: no DMA stalls (a FULL step's K/V fetch hides under its compute), no clock
measured (the target's assumed clock converts cycles to ms). Ratios between kernels compiled
by the same toolchain are the reliable output.
"""

from __future__ import annotations

import contextlib
import pathlib
import re

from svgen.spec.errors import SpecError
from svgen.estimate.measure import (
    measure_chunk_paths,
    measure_paths,
    measure_select_policy,
    measure_training_paths,
)

# The report, and the model over the tables, live in modules of their own; svgen.estimate.cost
# keeps their names for the commands, benches and tests that read them here (PathCosts and
# SEGMENT_BOUNDARY, of svgen.estimate.paths, too).
from svgen.estimate.cost_report import (  # noqa: F401
    MODEL_CAVEAT,
    ChunkReport,
    CostReport,
    TrainingReport,
    Utilisation,
    program_caveat,
)
from svgen.estimate.cycle_model import (  # noqa: F401
    dense_cycles,
    fallback_cycles,
    key_bytes,
    key_pass_cycles,
    model_chunks,
    model_cycles,
    model_head_pattern,
    model_select,
    model_training,
    padding_tile,
    pooling_floor,
    sampled_selection,
    utilisation,
)
from svgen.estimate.paths import SEGMENT_BOUNDARY, PathCosts  # noqa: F401


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
            "it on a chip (svgen bench; against Splash given every block it could choose: "
            "python -m svgen.chip.runtime_features --select SPEC)",
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
                trained = model_training(training_paths, plan, module)
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
        fallback_cycles(paths, plan, head_pattern),
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
