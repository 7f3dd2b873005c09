"""Static cycle count of dense Splash Attention's forward kernel on a TPU target (no TPU needed).

    .venv/bin/python bench/splash_cost.py

Builds the Splash Attention forward shipped with JAX (``make_splash_mha`` over a
``MultiHeadMask`` of ``FullMask``), AOT-compiles it for the target with libtpu, and reads the
kernel's final VLIW schedule (``svgen.estimate.tpu_schedule``): one bundle issues per cycle, so the
bundles executed along a control-flow path of one grid step are that step's cycles (DMA waits
count one bundle each; stalls the schedule does not show are not modelled).

The forward kernel (``splash_mha_fwd_no_residuals`` in jax 0.10.2) runs one grid step per
(head, q tile, kv tile). Inside the grid loop, Pallas wraps the step in an outer pipeline
"stage" branch (skipped on the prologue and epilogue iterations); inside it the kernel has
three ``pl.when`` bodies, identified by their op mix:

  init      ``j == 0``: zeroes the m/l/o scratch -- stores only (no vmatmul, no vrcp);
  compute   ``should_run``: QK^T, online softmax, PV -- holds the ``vmatmul`` ops;
  finalize  ``j == last``: o / l -- holds the ``vrcp`` ops (and no vmatmul).

With a full mask Splash's MaskInfo has no ``mask_next`` (no partial blocks), so the kernel
has no masking code at all: there is no separate masked-compute path (``masked_step`` is
None). Should a build ever emit two compute bodies, the one with fewer ``vsel``/``vcmp`` ops
is taken as the unmasked one.

Model of one call over all heads:

  cycles = grid steps x step + q tiles x heads x (init + finalize) + 2 x pipeline

where ``step`` is one iteration running the compute body only, ``init``/``finalize`` are
the extra bundles of the iterations that also run those bodies, and ``pipeline`` is an
iteration with the stage branch taken (prologue / epilogue). The loop-exit-test trip count
of the grid loop is checked to equal grid steps + 2. Code outside the grid loop (a few
dozen bundles, once per call) is reported but not added.

Backward (``dense_splash_backward_cost``)
------------------------------------------

AOT-compiles ``jax.grad`` of ``sum(kernel(q, k, v))`` w.r.t. q, k, v under ``jax.jit`` and
reads every bundle dump of that ONE compile (``_compile_dumps``; ``compile_and_dump`` keeps
only one kernel). In jax 0.10.2 the compile holds three Splash kernels (dump names
``splash_mha_fwd_residuals.1``, ``splash_mha_dkv_no_residuals.1`` and, unless fused,
``splash_mha_dq_no_residuals.1``) and a handful of XLA ops (``convert_reduce_fusion``: di =
sum(o * do); broadcasts of logsumexp/di to 8 sublanes and of the ones cotangent; layout
copies; with the fused kernel ``reduce.1``, the sum of the per-kv-tile dq partials).

  dkv kernel  grid (kv tiles, heads, q tiles), kv tiles = seq / block_kv_dkv; one step is one
              (kv tile, q tile) pair of one head: the ``fori_loop(unroll=True)`` over
              block_kv_dkv / block_kv_dkv_compute sub-tiles doing QK^T, P dO (dv), V dO^T
              (dp), dS Q (dk) -- and with ``use_fused_bwd_kernel`` also dS^T K (dq), whose
              per-step zeroing and write of the dq tile sit outside any ``pl.when`` (so they
              are in ``step``). Its dq output is a (kv tiles, heads, seq, head_dim) array of
              partials that XLA then sums over kv tiles (``dq_unreduced_bytes``).
  dq kernel   (unfused only) grid (heads, q tiles, kv tiles), one QK^T, dO V^T and dS K per
              step, no sub-tiling (block_kv_dq is the compute block).

Inside the pipeline-stage branch each has three ``pl.when`` bodies at depth 1, told apart
by op mix and position (the forward's ``vrcp`` rule does not apply: neither finalize
divides):

  compute   ``should_run``: the only body with ``vmatmul`` ops (two if a mask were partial:
            the one with fewer vsel/vcmp is the unmasked one, as in the forward);
  init      before the compute body, stores and no loads: zeroes the dk/dv (dq) scratch
            (dkv: ``q_index == 0``; dq: ``j == 0``);
  finalize  after the compute body, loads and stores: casts the scratch to the dk/dv (dq)
            outputs and re-zeroes it (dkv: ``q_index == last``; dq: ``j == last``).

Each kernel is modelled like the forward, with its own grid: ``rows`` are the grid prefixes
that run init and finalize once (dkv: kv tiles x heads; dq: heads x q tiles):

  cycles = grid steps x step + rows x (init + finalize) + 2 x pipeline

and its grid loop's trip count is checked to equal grid steps + 2. The backward total is
the dkv (+ dq) kernels. The forward-with-residuals kernel of the same compile (it also
writes logsumexp, so its finalize has ``vlog2`` besides ``vrcp``) is counted with the
forward rules. The XLA ops are not Pallas grids; they get a rough count only
(``xla_cycles``: bundles outside their longest loop + its trip count x one iteration with
every conditional forward branch falling through; DMA waits count one bundle, so
memory-bound ops may take longer). They are reported apart, and ``bwd_total`` adds them to
the backward kernels because the fused kernel moves work into them (the dq reduction, which
reads kv tiles x the size of dq from HBM). ``hbm_bytes`` is the compile's argument + output
+ temp memory (``memory_analysis``): the fused dq partials can exceed the chip's HBM.
"""

from __future__ import annotations

import math
import os
import sys

try:
    from svgen.estimate import tpu_schedule
except ImportError:  # run from a checkout without svgen installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from svgen.estimate import tpu_schedule

FWD_KERNEL = "splash_mha_fwd"
"""Substring of the forward kernel's name (``get_kernel_name(..., phase="fwd")``)."""
DKV_KERNEL = "splash_mha_dkv"
"""Substring of the dk/dv (and, fused, dq) backward kernel's name."""
DQ_KERNEL = "splash_mha_dq"
"""Substring of the unfused dq backward kernel's name."""
HBM_GIB = {"v5e": 16, "v6e": 32, "v7x": 192}
"""Published HBM capacity per chip, to flag configurations that cannot run."""

DEFAULT_CLOCK_GHZ = 1.75


def _clock_ghz(target: str) -> float:
    try:
        from svgen.analysis.targets import TARGETS
    except ImportError:
        return DEFAULT_CLOCK_GHZ
    spec = TARGETS.get(target)
    return float(getattr(spec, "clock_ghz", DEFAULT_CLOCK_GHZ)) if spec else DEFAULT_CLOCK_GHZ


def padded_seq_len(seq_len: int, *blocks: int) -> int:
    """``seq_len`` rounded up to a multiple of the lcm of the block sizes (Splash needs it)."""
    unit = math.lcm(*blocks)
    return -(-seq_len // unit) * unit


def _classify(schedule: tpu_schedule.Schedule) -> dict:
    """The grid-loop branches of the Splash forward, by role (see the module docstring)."""
    branches = schedule.branches_in_loop()
    computes = [b for b in branches if b.mix.get("vmatmul", 0) > 0]
    # The pipeline stage: the outermost branch whose body holds the compute bodies.
    stages = [b for b in computes if b.depth == 0]
    if len(stages) != 1:
        raise RuntimeError(f"expected one pipeline-stage branch, got {len(stages)}")
    stage = stages[0]
    inner = [b for b in branches if b.address in stage.skipped]
    bodies = [b for b in computes if b.address in stage.skipped]
    if not bodies:
        raise RuntimeError("no compute (vmatmul) branch inside the pipeline stage")
    masking = lambda b: b.mix.get("vsel", 0) + b.mix.get("vcmp", 0)  # noqa: E731
    bodies.sort(key=masking)
    unmasked, masked = bodies[0], (bodies[1] if len(bodies) > 1 else None)
    others = [b for b in inner if b.mix.get("vmatmul", 0) == 0 and b.depth == stage.depth + 1]
    finals = [b for b in others if b.mix.get("vrcp", 0) > 0]
    inits = [
        b
        for b in others
        if b.mix.get("vrcp", 0) == 0 and b.mix.get("vst", 0) > 0 and b.address < unmasked.address
    ]
    if len(finals) != 1 or len(inits) != 1:
        raise RuntimeError(
            f"expected one init and one finalize branch, got {len(inits)} "
            f"init and {len(finals)} finalize"
        )
    return {
        "stage": stage,
        "compute": unmasked,
        "masked": masked,
        "init": inits[0],
        "finalize": finals[0],
    }


def _classify_bwd(schedule: tpu_schedule.Schedule) -> dict:
    """The grid-loop branches of a Splash backward kernel (dkv or dq), by role: the body
    with vmatmul is compute, the store-only body before it is init, the load-and-store
    body after it is finalize (see the module docstring)."""
    branches = schedule.branches_in_loop()
    computes = [b for b in branches if b.mix.get("vmatmul", 0) > 0]
    stages = [b for b in computes if b.depth == 0]
    if len(stages) != 1:
        raise RuntimeError(f"expected one pipeline-stage branch, got {len(stages)}")
    stage = stages[0]
    inner = [b for b in branches if b.address in stage.skipped and b.depth == stage.depth + 1]
    bodies = [b for b in inner if b.mix.get("vmatmul", 0) > 0]
    if not bodies:
        raise RuntimeError("no compute (vmatmul) branch inside the pipeline stage")
    first, last = min(b.address for b in bodies), max(b.address for b in bodies)
    masking = lambda b: b.mix.get("vsel", 0) + b.mix.get("vcmp", 0)  # noqa: E731
    bodies.sort(key=masking)
    others = [b for b in inner if b.mix.get("vmatmul", 0) == 0]
    inits = [
        b
        for b in others
        if b.address < first and b.mix.get("vst", 0) > 0 and b.mix.get("vld", 0) == 0
    ]
    finals = [
        b
        for b in others
        if b.address > last and b.mix.get("vst", 0) > 0 and b.mix.get("vld", 0) > 0
    ]
    if len(finals) != 1 or len(inits) != 1:
        raise RuntimeError(
            f"expected one init and one finalize branch, got {len(inits)} "
            f"init and {len(finals)} finalize"
        )
    return {
        "stage": stage,
        "compute": bodies[0],
        "masked": bodies[1] if len(bodies) > 1 else None,
        "init": inits[0],
        "finalize": finals[0],
    }


def _grid_cost(
    schedule: tpu_schedule.Schedule, roles: dict, *, steps: int, rows: int, name: str
) -> dict:
    """Per-path bundles and cycles of one Pallas grid kernel (module docstring's model):
    ``steps`` grid steps, ``rows`` of which also run init and finalize."""
    loop = schedule.grid_loop
    if loop.trip_count is not None and loop.trip_count != steps + 2:
        raise RuntimeError(
            f"{name}: grid loop runs {loop.trip_count} times, expected {steps} steps + 2"
        )
    init, final, stage = roles["init"].address, roles["finalize"].address, roles["stage"].address
    step = schedule.path_cost({init, final})
    init_extra = schedule.path_cost({final}) - step
    final_extra = schedule.path_cost({init}) - step
    pipeline = schedule.path_cost({stage})
    masked_step = None
    if roles["masked"] is not None:
        masked_step = schedule.path_cost({init, final, roles["compute"].address})
    return {
        "step": step,
        "masked_step": masked_step,
        "init": init_extra,
        "finalize": final_extra,
        "pipeline": pipeline,
        "outside_loop": schedule.outside_loop_bundles,
        "cycles": steps * step + rows * (init_extra + final_extra) + 2 * pipeline,
    }


# One copy of the compile-and-read helpers, in the product (svgen.estimate.tpu_schedule).
_compile_dumps = tpu_schedule.compile_programs
_rough_cycles = tpu_schedule.rough_cycles


def _one_dump(dumps: dict[str, str], kernel_name: str) -> tuple[str, str]:
    """(name, text) of the one dump whose name contains ``kernel_name``."""
    hits = [name for name in dumps if kernel_name in name]
    if len(hits) != 1:
        raise RuntimeError(
            f"expected one dump for {kernel_name!r}, got {hits} among {sorted(dumps)}"
        )
    return hits[0], dumps[hits[0]]


def dense_splash_cost(
    *,
    seq_len: int,
    heads: int,
    head_dim: int,
    dtype: str = "bfloat16",
    block_q: int = 2048,
    block_kv: int = 2048,
    block_kv_compute: int = 1024,
    target: str = "v6e",
) -> dict:
    """Static cycles of one dense (full-mask) Splash Attention forward call over all heads
    (default blocks: BEST_FWD_BLOCKS).

    ``seq_len`` is padded up to a multiple of the lcm of the block sizes. Returns a dict with
    the block sizes, padded length, grid steps, per-path bundles (``step``, ``init``,
    ``finalize``, ``pipeline``; ``masked_step`` is None for a full mask), the kernel name,
    total ``cycles`` and ``ms`` at the target's assumed clock.
    """
    tpu_schedule.ensure_dump_flags()  # before anything starts libtpu
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
        splash_attention_mask as splash_mask,
    )

    seq = padded_seq_len(seq_len, block_q, block_kv, block_kv_compute)
    mask = splash_mask.MultiHeadMask([splash_mask.FullMask((seq, seq)) for _ in range(heads)])
    sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute)
    kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes)

    info = kernel.fwd_mask_info
    q_tiles = seq // block_q
    grid_width = info.data_next.shape[-1] if info.data_next is not None else seq // block_kv
    grid_steps = heads * q_tiles * grid_width

    arg = jax.ShapeDtypeStruct(
        (heads, seq, head_dim), jnp.dtype(dtype), sharding=tpu_schedule.tpu_sharding(target)
    )
    schedule = tpu_schedule.compile_and_dump(
        lambda q, k, v: kernel(q, k, v), arg, arg, arg, kernel_name=FWD_KERNEL, target=target
    )
    cost = _grid_cost(
        schedule, _classify(schedule), steps=grid_steps, rows=q_tiles * heads, name=FWD_KERNEL
    )
    cycles = cost["cycles"]
    clock = _clock_ghz(target)
    return {
        "kernel": FWD_KERNEL,
        "target": target,
        "seq_len": seq_len,
        "seq_len_padded": seq,
        "heads": heads,
        "head_dim": head_dim,
        "dtype": str(jnp.dtype(dtype)),
        "block_q": block_q,
        "block_kv": block_kv,
        "block_kv_compute": block_kv_compute,
        "q_tiles": q_tiles,
        "kv_tiles": grid_width,
        "grid_steps": grid_steps,
        "step": cost["step"],
        "masked_step": cost["masked_step"],
        "init": cost["init"],
        "finalize": cost["finalize"],
        "pipeline": cost["pipeline"],
        "outside_loop": cost["outside_loop"],
        "cycles": cycles,
        "clock_ghz": clock,
        "ms": cycles / (clock * 1e6),
    }


def dense_splash_backward_cost(
    *,
    seq_len: int,
    heads: int,
    head_dim: int,
    dtype: str = "bfloat16",
    block_q: int = 2048,
    block_kv: int = 2048,
    block_kv_compute: int = 1024,
    block_q_dkv: int = 512,
    block_kv_dkv: int = 512,
    block_kv_dkv_compute: int = 512,
    block_q_dq: int = 512,
    block_kv_dq: int = 512,
    fused: bool = False,
    target: str = "v6e",
) -> dict:
    """Static cycles of the backward of one dense (full-mask) Splash Attention call over all
    heads: the kernels of ``jax.grad(sum(splash(q, k, v)))`` (module docstring).

    ``block_q``/``block_kv``/``block_kv_compute`` are the forward's (its residual-saving
    kernel runs in the same compile); ``block_*_dkv`` the dkv kernel's; ``block_*_dq`` the
    dq kernel's, ignored when ``fused`` (dq is then computed in the dkv kernel). ``seq_len``
    is padded up to a multiple of the lcm of all the block sizes used.

    Returns a dict with the block sizes and shapes; ``kernels``: per backward kernel
    (``dkv``, and ``dq`` unless fused) its dump name, grid, grid steps, rows (grid prefixes
    running init/finalize once), per-path bundles (``step``, ``masked_step``, ``init``,
    ``finalize``, ``pipeline``, ``outside_loop``), ``cycles`` and ``ms``; ``cycles``/``ms``:
    the backward kernels' total; ``forward``: the same for the forward-with-residuals
    kernel; ``xla_ops``: rough cycles of every other program of the compile by dump name,
    ``xla_cycles`` their sum; ``bwd_total_cycles``/``bwd_total_ms``: backward kernels +
    XLA ops; ``dq_unreduced_bytes`` (fused: the dq partials the XLA sum reads, else 0);
    ``hbm_bytes``/``hbm_gib``: argument + output + temp memory of the compile.
    """
    tpu_schedule.ensure_dump_flags()  # before anything starts libtpu
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
        splash_attention_mask as splash_mask,
    )

    if fused:
        block_q_dq = block_kv_dq = None
    dq_blocks = () if fused else (block_q_dq, block_kv_dq)
    seq = padded_seq_len(
        seq_len,
        block_q,
        block_kv,
        block_kv_compute,
        block_q_dkv,
        block_kv_dkv,
        block_kv_dkv_compute,
        *dq_blocks,
    )
    mask = splash_mask.MultiHeadMask([splash_mask.FullMask((seq, seq)) for _ in range(heads)])
    sizes = splash.BlockSizes(
        block_q=block_q,
        block_kv=block_kv,
        block_kv_compute=block_kv_compute,
        block_q_dkv=block_q_dkv,
        block_kv_dkv=block_kv_dkv,
        block_kv_dkv_compute=block_kv_dkv_compute,
        block_q_dq=block_q_dq,
        block_kv_dq=block_kv_dq,
        use_fused_bwd_kernel=fused,
    )
    kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes)

    # Grids as Splash builds them (``_splash_attention_forward`` / ``_bwd_dkv`` / ``_bwd_dq``).
    fwd_info, dkv_info, dq_info = kernel.fwd_mask_info, kernel.dkv_mask_info, kernel.dq_mask_info
    fwd_width = fwd_info.data_next.shape[-1] if fwd_info.data_next is not None else seq // block_kv
    fwd_grid = (heads, seq // block_q, fwd_width)
    dkv_width = (
        dkv_info.data_next.shape[-2] if dkv_info.data_next is not None else seq // block_q_dkv
    )
    grids = {"dkv": (seq // block_kv_dkv, heads, dkv_width)}
    if not fused:
        dq_width = (
            dq_info.data_next.shape[-1] if dq_info.data_next is not None else seq // block_kv_dq
        )
        grids["dq"] = (heads, seq // block_q_dq, dq_width)

    arg = jax.ShapeDtypeStruct(
        (heads, seq, head_dim), jnp.dtype(dtype), sharding=tpu_schedule.tpu_sharding(target)
    )

    def loss(q, k, v):
        return jnp.sum(kernel(q, k, v).astype(jnp.float32))

    dumps, compiled = _compile_dumps(
        jax.grad(loss, argnums=(0, 1, 2)), arg, arg, arg, target=target
    )
    clock = _clock_ghz(target)

    def kernel_cost(substring: str, grid: tuple[int, int, int], classify) -> dict:
        name, text = _one_dump(dumps, substring)
        schedule = tpu_schedule.parse_bundles(text)
        steps, rows = math.prod(grid), grid[0] * grid[1]
        cost = _grid_cost(schedule, classify(schedule), steps=steps, rows=rows, name=name)
        return {
            "name": name,
            "grid": grid,
            "grid_steps": steps,
            "rows": rows,
            **cost,
            "ms": cost["cycles"] / (clock * 1e6),
        }

    forward = kernel_cost(FWD_KERNEL, fwd_grid, _classify)
    kernels = {"dkv": kernel_cost(DKV_KERNEL, grids["dkv"], _classify_bwd)}
    if not fused:
        kernels["dq"] = kernel_cost(DQ_KERNEL, grids["dq"], _classify_bwd)
    splash_names = {forward["name"]} | {k["name"] for k in kernels.values()}
    xla_ops = {n: _rough_cycles(t) for n, t in dumps.items() if n not in splash_names}
    xla_cycles = sum(c for c in xla_ops.values() if c is not None)
    cycles = sum(k["cycles"] for k in kernels.values())

    memory = compiled.memory_analysis()
    hbm_bytes = None
    if memory is not None:
        hbm_bytes = (
            memory.argument_size_in_bytes
            + memory.output_size_in_bytes
            + memory.temp_size_in_bytes
            - memory.alias_size_in_bytes
        )
    itemsize = jnp.dtype(dtype).itemsize
    dq_unreduced = grids["dkv"][0] * heads * seq * head_dim * itemsize if fused else 0
    return {
        "target": target,
        "seq_len": seq_len,
        "seq_len_padded": seq,
        "heads": heads,
        "head_dim": head_dim,
        "dtype": str(jnp.dtype(dtype)),
        "fused": fused,
        "block_q": block_q,
        "block_kv": block_kv,
        "block_kv_compute": block_kv_compute,
        "block_q_dkv": block_q_dkv,
        "block_kv_dkv": block_kv_dkv,
        "block_kv_dkv_compute": block_kv_dkv_compute,
        "block_q_dq": block_q_dq,
        "block_kv_dq": block_kv_dq,
        "kernels": kernels,
        "forward": forward,
        "xla_ops": xla_ops,
        "xla_cycles": xla_cycles,
        "cycles": cycles,
        "clock_ghz": clock,
        "ms": cycles / (clock * 1e6),
        "bwd_total_cycles": cycles + xla_cycles,
        "bwd_total_ms": (cycles + xla_cycles) / (clock * 1e6),
        "dq_unreduced_bytes": dq_unreduced,
        "hbm_bytes": hbm_bytes,
        "hbm_gib": HBM_GIB.get(target),
    }


def _forward_grid() -> tuple[tuple[int, int, int], ...]:
    """Every forward (block_q, block_kv, block_kv_compute) searched: tiles of 512-4096 per
    side, compute blocks of 512 up to the kv tile (dividing it). Configurations libtpu
    refuses (over the default scoped VMEM) are reported as such."""
    sizes = (512, 1024, 2048, 4096)
    return tuple(
        (bq, bkv, bkvc)
        for bq in sizes
        for bkv in sizes
        for bkvc in sizes
        if bkvc <= bkv and bkvc <= 2048 and not (bq == 512 and bkv == 4096)
    )


FWD_GRID = _forward_grid()
#: The fastest forward of FWD_GRID at the Wan 2.1 720p geometry (75,600 tokens, 10 heads,
#: d 128, bf16, v6e): what every "vs dense Splash" figure of the benches and docs is
#: quoted against (`python bench/splash_cost.py` re-runs the search and prints it).
BEST_FWD_BLOCKS = (2048, 2048, 1024)


BWD_CONFIGS = (
    # ((block_q_dkv, block_kv_dkv, block_kv_dkv_compute), (block_q_dq, block_kv_dq) or None)
    ((512, 512, 512), (512, 512)),
    ((1024, 1024, 512), (1024, 1024)),
    ((2048, 1024, 512), (2048, 1024)),
    ((2048, 2048, 512), (2048, 2048)),
    ((512, 512, 512), None),
    ((1024, 1024, 512), None),
    ((2048, 1024, 512), None),
    ((1024, 2048, 512), None),
    ((2048, 2048, 512), None),
    ((2048, 2048, 2048), None),
)
"""Backward blocks for ``main``; None for dq means the fused kernel."""


def _backward_rows(seq_len, heads, head_dim, target, fwd_blocks) -> list[tuple[tuple, dict | str]]:
    """(config, result or the reason it does not compile) per ``BWD_CONFIGS`` entry."""
    rows = []
    for dkv, dq in BWD_CONFIGS:
        dq_kwargs = {"block_q_dq": dq[0], "block_kv_dq": dq[1]} if dq else {}
        try:
            result = dense_splash_backward_cost(
                seq_len=seq_len,
                heads=heads,
                head_dim=head_dim,
                dtype="bfloat16",
                block_q=fwd_blocks[0],
                block_kv=fwd_blocks[1],
                block_kv_compute=fwd_blocks[2],
                block_q_dkv=dkv[0],
                block_kv_dkv=dkv[1],
                block_kv_dkv_compute=dkv[2],
                fused=dq is None,
                target=target,
                **dq_kwargs,
            )
        except Exception as error:  # libtpu rejects it (VMEM OOM...): a row saying why
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            result = f"{type(error).__name__}: {first[:90]}"
        rows.append(((dkv, dq), result))
    return rows


def forward_search(seq_len, heads, head_dim, target, grid=None) -> list[tuple[tuple, dict | str]]:
    """(blocks, result or the reason libtpu refused them) for every forward configuration."""
    rows = []
    for bq, bkv, bkvc in grid or FWD_GRID:
        try:
            result = dense_splash_cost(
                seq_len=seq_len,
                heads=heads,
                head_dim=head_dim,
                dtype="bfloat16",
                block_q=bq,
                block_kv=bkv,
                block_kv_compute=bkvc,
                target=target,
            )
        except Exception as error:  # libtpu rejects it (VMEM OOM...): a row saying why
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            result = f"{type(error).__name__}: {first[:90]}"
        print(
            f"  {bq}/{bkv}/{bkvc}: "
            + (f"{result['cycles']:,}" if isinstance(result, dict) else result),
            file=sys.stderr,
        )
        rows.append(((bq, bkv, bkvc), result))
    return rows


def main() -> None:
    tpu_schedule.ensure_dump_flags()
    seq_len, heads, head_dim, target = 75_600, 10, 128, "v6e"
    quick = "--quick" in sys.argv[1:]  # only the best blocks known, for the backward table
    searched = forward_search(
        seq_len, heads, head_dim, target, [BEST_FWD_BLOCKS] if quick else None
    )
    rows = [r for _, r in searched if isinstance(r, dict)]
    first = rows[0]
    best_fwd = min(rows, key=lambda r: r["cycles"])
    print(
        f"dense Splash forward ({first['kernel']}*), {seq_len:,} tokens, {heads} heads, "
        f"head_dim {head_dim}, bf16, {target} at {first['clock_ghz']} GHz: {len(searched)} "
        f"configurations searched (block_q, block_kv 512-4096, block_kv_compute 512-2048 "
        f"dividing block_kv), {len(rows)} compiled"
    )
    print()
    print(
        "| bq/bkv/compute | padded | grid steps | step | init | finalize | pipeline | cycles | ms | |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for blocks, r in searched:
        label = "/".join(map(str, blocks))
        if isinstance(r, str):
            print(f"| {label} | {r} |" + " |" * 8)
            continue
        print(
            f"| {label} | {r['seq_len_padded']:,} | {r['grid_steps']:,} | {r['step']:,} "
            f"| {r['init']} | {r['finalize']} | {r['pipeline']} | {r['cycles']:,} "
            f"| {r['ms']:.2f} | {'**best**' if r is best_fwd else ''} |"
        )
    if tuple(best_fwd[k] for k in ("block_q", "block_kv", "block_kv_compute")) != BEST_FWD_BLOCKS:
        print(f"\nnote: the best blocks differ from BEST_FWD_BLOCKS {BEST_FWD_BLOCKS}: update it")

    fwd_blocks = (best_fwd["block_q"], best_fwd["block_kv"], best_fwd["block_kv_compute"])
    bwd = _backward_rows(seq_len, heads, head_dim, target, fwd_blocks)
    done = [r for _, r in bwd if isinstance(r, dict)]
    if not done:
        print("\nno backward configuration compiled")
        return
    best = min(done, key=lambda r: r["bwd_total_cycles"])
    print()
    print(
        f"dense Splash backward (jax.grad of sum(splash(q, k, v)), forward blocks "
        f"{'/'.join(map(str, fwd_blocks))}), {seq_len:,} tokens (padded to "
        f"{best['seq_len_padded']:,}), {heads} heads, head_dim {head_dim}, bf16, {target} at "
        f"{best['clock_ghz']} GHz; step and init+fin in bundles; XLA ops rough; "
        f"total = kernels + XLA ops"
    )
    print()
    print(
        "| dkv bq/bkv/compute | dq bq/bkv | dkv steps | dkv step | dkv init+fin "
        "| dq steps | dq step | dq init+fin | dkv ms | dq ms | kernels cycles | kernels ms "
        "| XLA ops ms | total ms | HBM GiB | |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for (dkv, dq), r in bwd:
        label = "/".join(map(str, dkv))
        dq_label = "/".join(map(str, dq)) if dq else "fused"
        if isinstance(r, str):
            print(f"| {label} | {dq_label} | {r} |" + " |" * 13)
            continue
        k = r["kernels"]["dkv"]
        q = r["kernels"].get("dq")
        dq_cells = (
            f"{q['grid_steps']:,} | {q['step']:,} | {q['init'] + q['finalize']} "
            if q
            else "- | - | - "
        )
        dq_ms = f"{q['ms']:.1f}" if q else "-"
        hbm = r["hbm_bytes"] / 2**30 if r["hbm_bytes"] is not None else float("nan")
        print(
            f"| {label} | {dq_label} | {k['grid_steps']:,} | {k['step']:,} "
            f"| {k['init'] + k['finalize']} | {dq_cells}| {k['ms']:.1f} "
            f"| {dq_ms} | {r['cycles']:.3e} | {r['ms']:.1f} "
            f"| {r['xla_cycles'] / (r['clock_ghz'] * 1e6):.1f} | {r['bwd_total_ms']:.1f} "
            f"| {hbm:.1f} | {'**best**' if r is best else ''} |"
        )

    fwd = best["forward"]
    total = fwd["cycles"] + best["bwd_total_cycles"]
    names = sorted(
        {fwd["name"]}
        | {k["name"] for _, r in bwd if isinstance(r, dict) for k in r["kernels"].values()}
    )
    print()
    print(f"Splash kernels in the grad compiles: {', '.join(names)}")
    print(
        f"forward with residuals ({fwd['name']}, same compile): step {fwd['step']:,}, "
        f"init {fwd['init']}, finalize {fwd['finalize']}, {fwd['cycles']:.3e} cycles = "
        f"{fwd['ms']:.1f} ms (forward without residuals: {best_fwd['ms']:.1f} ms)"
    )
    print(
        f"forward + backward at the best blocks (fwd {'/'.join(map(str, fwd_blocks))}, "
        f"dkv {best['block_q_dkv']}/{best['block_kv_dkv']}/{best['block_kv_dkv_compute']}"
        + (" fused" if best["fused"] else f", dq {best['block_q_dq']}/{best['block_kv_dq']}")
        + f"): {total:.3e} cycles = {total / (best['clock_ghz'] * 1e6):.1f} ms "
        f"(forward with residuals {fwd['ms']:.1f} + backward kernels {best['ms']:.1f} "
        f"+ XLA ops {best['xla_cycles'] / (best['clock_ghz'] * 1e6):.1f})"
    )
    big = {n: c for n, c in best["xla_ops"].items() if c and c > 0.01 * best["xla_cycles"]}
    print(f"XLA ops at the best blocks (rough cycles): {big}")


if __name__ == "__main__":
    main()
