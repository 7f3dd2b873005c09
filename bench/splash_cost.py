"""Static cycle count of dense Splash Attention's forward kernel on a TPU target (no TPU needed).

    .venv/bin/python bench/splash_cost.py

Builds the Splash Attention forward shipped with JAX (``make_splash_mha`` over a
``MultiHeadMask`` of ``FullMask``), AOT-compiles it for the target with libtpu, and reads the
kernel's final VLIW schedule (``svgen.tpu_schedule``): one bundle issues per cycle, so the
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
"""

from __future__ import annotations

import math
import os
import sys

try:
    from svgen import tpu_schedule
except ImportError:  # run from a checkout without svgen installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from svgen import tpu_schedule

FWD_KERNEL = "splash_mha_fwd"
"""Substring of the forward kernel's name (``get_kernel_name(..., phase="fwd")``)."""

DEFAULT_CLOCK_GHZ = 1.75


def _clock_ghz(target: str) -> float:
    try:
        from svgen.targets import TARGETS
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


def dense_splash_cost(
    *,
    seq_len: int,
    heads: int,
    head_dim: int,
    dtype: str = "bfloat16",
    block_q: int = 2048,
    block_kv: int = 2048,
    block_kv_compute: int = 512,
    target: str = "v6e",
) -> dict:
    """Static cycles of one dense (full-mask) Splash Attention forward call over all heads.

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
    loop = schedule.grid_loop
    if loop.trip_count is not None and loop.trip_count != grid_steps + 2:
        raise RuntimeError(
            f"grid loop runs {loop.trip_count} times, expected {grid_steps} steps + 2"
        )

    roles = _classify(schedule)
    init, final, stage = roles["init"].address, roles["finalize"].address, roles["stage"].address
    step = schedule.path_cost({init, final})
    init_extra = schedule.path_cost({final}) - step
    final_extra = schedule.path_cost({init}) - step
    pipeline = schedule.path_cost({stage})
    masked_step = None
    if roles["masked"] is not None:
        masked_step = schedule.path_cost({init, final, roles["compute"].address})

    cycles = grid_steps * step + q_tiles * heads * (init_extra + final_extra) + 2 * pipeline
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
        "step": step,
        "masked_step": masked_step,
        "init": init_extra,
        "finalize": final_extra,
        "pipeline": pipeline,
        "outside_loop": schedule.outside_loop_bundles,
        "cycles": cycles,
        "clock_ghz": clock,
        "ms": cycles / (clock * 1e6),
    }


CONFIGS = ((512, 512, 512), (1024, 1024, 1024), (2048, 1024, 1024), (2048, 2048, 512))


def main() -> None:
    tpu_schedule.ensure_dump_flags()
    seq_len, heads, head_dim, target = 75_600, 10, 128, "v6e"
    rows = [
        dense_splash_cost(
            seq_len=seq_len,
            heads=heads,
            head_dim=head_dim,
            dtype="bfloat16",
            block_q=bq,
            block_kv=bkv,
            block_kv_compute=bkvc,
            target=target,
        )
        for bq, bkv, bkvc in CONFIGS
    ]
    first = rows[0]
    print(
        f"dense Splash forward ({first['kernel']}*), {seq_len:,} tokens "
        f"(padded to {first['seq_len_padded']:,}), {heads} heads, head_dim {head_dim}, "
        f"bf16, {target} at {first['clock_ghz']} GHz"
    )
    print()
    print("| bq/bkv/compute | grid steps | step | init | finalize | pipeline | cycles | ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['block_q']}/{r['block_kv']}/{r['block_kv_compute']} "
            f"| {r['grid_steps']:,} | {r['step']:,} | {r['init']} | {r['finalize']} "
            f"| {r['pipeline']} | {r['cycles']:.3e} | {r['ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
