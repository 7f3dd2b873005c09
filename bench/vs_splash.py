"""Mask metadata, side by side: Splash Attention's MaskInfo vs svgen's plan, for the same masks.

For each case both systems build, from the same mask, what their forward kernel needs before
it can run; nothing is run on an accelerator. Measured per case and system:

  build s        wall time to build the metadata. Splash: `make_splash_mha(...)` (mask
                 processing, evaluated tile by tile in NumPy). svgen: `parse_spec` + `analyze`.
  peak MiB       ru_maxrss at the end minus ru_maxrss right after the imports, in the same
                 fresh subprocess (one subprocess per case and system).
  SMEM bytes     bytes the kernel scalar-prefetches into SMEM. Splash (jax 0.10.2,
                 `_splash_attention_forward`): `num_scalar_prefetch = 3`, the arrays
                 `data_next`, `block_mask`, `mask_next` of the forward MaskInfo (`mask_next` is
                 None with an in-kernel mask function). svgen: `table_bytes` of
                 `plan.summary()` (the `svgen inspect --json` object).
  other metadata the MaskInfo arrays the Splash kernel takes from HBM through BlockSpecs:
                 `partial_mask_blocks` (loaded masks) and `q_sequence` (the query indices an
                 in-kernel mask function reads). svgen computes masks in-kernel from coordinates:
                 0.
  grid steps     the forward kernel's grid size as launched. Splash: heads x q_blocks x
                 data_next.shape[-1] (the grid `_splash_attention_forward` builds; checked
                 against the traced pallas_call). svgen: `grid_steps` (per head) x heads.
  visited        fraction of (head, q tile, kv tile) triples the kernel computes. Splash:
                 non-zero `block_mask` entries / (heads in block_mask x q_blocks x kv_blocks);
                 svgen: `visited_fraction`.

Masks (f = token // S, S = 45 x 80 tokens per frame, frame-major, no text tokens):
  spatial   keep(q, k) = |f_q - f_k| <= 1  or  f_k < 1
  temporal  keep(q, k) = q mod S == k mod S  or  f_k < 1
Splash needs the sequence padded to a multiple of the tile; its masks keep no pair that
involves a padding token (svgen never attends padding and discards padded query rows).
All heads use 512 x 512 tiles, forward only.

Reproduce (CPU only; Splash runs with interpret=True, which only affects running):

    nice -n 10 .venv/bin/python bench/vs_splash.py            # all cases (~15 min on 2 cores)
    .venv/bin/python bench/vs_splash.py --quick               # the 75.6K single-pattern cases

Progress goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HEIGHT, WIDTH = 45, 80
TOKENS_PER_FRAME = HEIGHT * WIDTH
BLOCK = 512
HEADS = 10

# (label, frames, pattern of each head). Single-pattern cases give all heads the same mask,
# as a real layer would (Splash deduplicates identical heads and broadcasts one table).
CASES = [
    ("spatial 75.6K", 21, ("spatial",) * HEADS),
    ("temporal 75.6K", 21, ("temporal",) * HEADS),
    ("5 spatial + 5 temporal 75.6K", 21, ("spatial",) * 5 + ("temporal",) * 5),
    ("spatial 400K", 111, ("spatial",) * HEADS),
    ("temporal 400K", 111, ("temporal",) * HEADS),
]
QUICK = {"spatial 75.6K", "temporal 75.6K"}
SYSTEMS = ("Splash", "svgen")

SVGEN_MASKS = {
    "spatial": "any_of: [{first_frame: {frames: 1}}, {spatial_window: {frames: 1}}]",
    "temporal": "any_of: [{first_frame: {frames: 1}}, {temporal_stride: {rows: 0, cols: 0}}]",
}


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


# ----------------------------------------------------------------------------- Splash side


def _keep(pattern: str, seq_len: int, q, k):
    """keep(q, k) of one pattern on token indices; NumPy or jax.numpy arrays alike."""
    fq, fk = q // TOKENS_PER_FRAME, k // TOKENS_PER_FRAME
    if pattern == "spatial":
        core = abs(fq - fk) <= 1
    else:
        core = (q % TOKENS_PER_FRAME) == (k % TOKENS_PER_FRAME)
    return (core | (fk < 1)) & (q < seq_len) & (k < seq_len)  # never attend padding


def _splash_head_mask(pattern: str, seq_len: int):
    """A Splash computable mask (built through its public mask base class) for one pattern."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    class VideoMask(sm._ComputableMask):
        def __init__(self):
            self.pattern, self.seq_len = pattern, seq_len
            padded = _padded(seq_len)
            super().__init__(
                shape=(padded, padded), mask_function=lambda q, k: _keep(pattern, seq_len, q, k)
            )

        def __eq__(self, other):
            return (
                type(other) is type(self)
                and self.pattern == other.pattern
                and self.seq_len == other.seq_len
            )

        def __hash__(self):
            return hash((type(self).__name__, self.pattern, self.seq_len))

    return VideoMask()


def _traced_grid(kernel, heads: int, padded: int) -> tuple[int, ...]:
    """The grid of the forward pallas_call, read from the traced kernel (nothing is run)."""
    import jax
    import jax.numpy as jnp

    shape = jax.ShapeDtypeStruct((heads, padded, 128), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(kernel)(shape, shape, shape)

    def grids(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "pallas_call":
                yield tuple(eqn.params["grid_mapping"].grid)
            for p in eqn.params.values():
                inner = getattr(p, "jaxpr", p)
                if hasattr(inner, "eqns"):
                    yield from grids(inner)

    return next(grids(jaxpr.jaxpr))


def measure_splash(frames: int, patterns: tuple[str, ...]) -> dict:
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    baseline = _max_rss_mib()
    seq_len = frames * TOKENS_PER_FRAME
    padded = _padded(seq_len)
    t0 = time.perf_counter()
    heads = {p: _splash_head_mask(p, seq_len) for p in set(patterns)}
    mask = sm.MultiHeadMask(tuple(heads[p] for p in patterns))
    kernel = sk.make_splash_mha(
        mask,
        head_shards=1,
        q_seq_shards=1,
        interpret=True,
        block_sizes=sk.BlockSizes(block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK),
    )
    build_s = time.perf_counter() - t0
    peak = _max_rss_mib() - baseline

    info = kernel.fwd_mask_info
    smem = [info.data_next, info.block_mask, info.mask_next]  # the 3 scalar-prefetch operands
    hbm = [info.partial_mask_blocks, info.q_sequence]
    block_mask = np.asarray(info.block_mask)
    n_blocks = padded // BLOCK
    grid = (len(patterns), n_blocks, info.data_next.shape[-1])
    traced = _traced_grid(kernel, len(patterns), padded)
    assert traced == grid, (traced, grid)
    # Tile kinds over all heads (block_mask holds one shared row of tables or one per head).
    per_table = len(patterns) // block_mask.shape[0]
    return {
        "build_s": build_s,
        "peak_mib": peak,
        "baseline_mib": baseline,
        "smem_bytes": sum(int(a.nbytes) for a in smem if a is not None),
        "other_bytes": sum(int(a.nbytes) for a in hbm if a is not None),
        "other_detail": {
            name: int(a.nbytes)
            for name, a in zip(("partial_mask_blocks", "q_sequence"), hbm)
            if a is not None
        },
        "grid_steps": int(np.prod(grid)),
        "grid": list(grid),
        "visited": float(np.count_nonzero(block_mask)) / (block_mask.shape[0] * n_blocks**2),
        "full": int(np.count_nonzero(block_mask == 2)) * per_table,
        "partial": int(np.count_nonzero(block_mask == 1)) * per_table,
        "smem_shapes": {
            k: [list(a.shape), str(a.dtype)]
            for k, a in zip(("data_next", "block_mask", "mask_next"), smem)
            if a is not None
        },
    }


# ------------------------------------------------------------------------------ svgen side


def svgen_spec_text(frames: int, patterns: tuple[str, ...]) -> str:
    """One spec for the case: a `mask` when all heads agree, else patterns assigned per head
    (all frame-major, the same masks as Splash's)."""
    distinct = list(dict.fromkeys(patterns))
    lines = [
        "svgen: 1",
        f"name: bench_{'_'.join(distinct)}_{frames}f",
        f"geometry: {{frames: {frames}, height: {HEIGHT}, width: {WIDTH}, text_tokens: 0}}",
        f"attention: {{heads: {len(patterns)}, head_dim: 128, dtype: bfloat16}}",
        "layout: frame_major",
        f"tiling: {{block_q: {BLOCK}, block_kv: {BLOCK}}}",
    ]
    if len(distinct) == 1:
        lines.append(f"mask: {{{SVGEN_MASKS[distinct[0]]}}}")
    else:
        lines.append("patterns:")
        lines += [f"  {p}: {{{SVGEN_MASKS[p]}}}" for p in distinct]
        lines.append("heads:")
        lines.append("  candidates: [" + ", ".join(f"{{pattern: {p}}}" for p in distinct) + "]")
        lines.append(f"  assign: [{', '.join(patterns)}]")
    return "\n".join(lines + [""])


def measure_svgen(frames: int, patterns: tuple[str, ...]) -> dict:
    """One plan for all heads (one table per distinct pattern).

    The figures come from `plan.summary()`, the documented `svgen inspect --json` object:
    `table_bytes` (scalar-prefetch bytes), `grid_steps` (per head: every head walks the
    longest pattern's table), and the per-pattern tile kinds.
    """
    import numpy as np
    from svgen.analysis import analyze
    from svgen.analysis.tables import kernel_kinds
    from svgen.core.kinds import TileKind
    from svgen.spec import parse_spec

    baseline = _max_rss_mib()
    t0 = time.perf_counter()
    plan = analyze(parse_spec(svgen_spec_text(frames, patterns), source="bench.yaml"))
    build_s = time.perf_counter() - t0
    peak = _max_rss_mib() - baseline
    summary = plan.summary()
    by_name = {p.name: p for p in plan.patterns}
    name_of = (lambda p: p) if len(by_name) > 1 else (lambda p: plan.patterns[0].name)
    # tile kinds as the kernel runs them (a FULL tile in the padded last kv tile: BOUNDARY)
    kinds = {p: kernel_kinds(by_name[name_of(p)].kinds, plan.grid) for p in set(patterns)}

    def over_heads(value_of) -> int:
        return sum(value_of(p) for p in patterns)

    return {
        "build_s": build_s,
        "peak_mib": peak,
        "baseline_mib": baseline,
        "smem_bytes": summary["table_bytes"],
        "other_bytes": 0,
        "grid_steps": summary["grid_steps"] * len(patterns),
        "visited": over_heads(lambda p: by_name[name_of(p)].visited_fraction) / len(patterns),
        "full": over_heads(lambda p: int(np.count_nonzero(kinds[p] == TileKind.FULL))),
        "partial": over_heads(lambda p: int(np.count_nonzero(kinds[p] == TileKind.BOUNDARY))),
        # FULL tiles in the last q tile: Splash cannot have any (its padded rows keep nothing)
        "full_in_last_q_tile": over_heads(
            lambda p: int(np.count_nonzero(kinds[p][-1] == TileKind.FULL))
        ),
    }


# ----------------------------------------------------------------------------- the driver


def run_child(system: str, label: str) -> None:
    _, frames, patterns = next(c for c in CASES if c[0] == label)
    measure = measure_splash if system == "Splash" else measure_svgen
    print(json.dumps(measure(frames, patterns)))


def run_case(system: str, label: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")  # metadata only: no accelerator runtime
    out = subprocess.run(
        [sys.executable, __file__, "--child", system, label],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"{system} / {label} failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _span(values: list[float]) -> str:
    lo, hi = round(min(values)), round(max(values))
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def print_table(results: list[tuple[str, str, dict]]) -> None:
    print(
        "| case | system | build s | peak MiB | SMEM (scalar prefetch) bytes "
        "| other metadata bytes | grid steps | visited fraction |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, system, r in results:
        case = label + (" ¹" if "+" in label and system == "svgen" else "")
        print(
            f"| {case} | {system} | {r['build_s']:.3f} | {r['peak_mib']:.0f} | "
            f"{r['smem_bytes']:,} | {r['other_bytes']:,} | {r['grid_steps']:,} | "
            f"{r['visited']:.4f} |"
        )
    print()
    print("Tiles computed, summed over the 10 heads (kernel kinds; Splash: block_mask 2 / 1):")
    print()
    print("| case | system | full | partial / boundary | visited tiles | full in last q tile |")
    print("|---|---|---|---|---|---|")
    for label, system, r in results:
        last = f"{r['full_in_last_q_tile']:,}" if "full_in_last_q_tile" in r else "0"
        print(
            f"| {label} | {system} | {r['full']:,} | {r['partial']:,} | "
            f"{r['full'] + r['partial']:,} | {last} |"
        )
    print()
    print(
        "Visited tiles agree exactly. Full/partial differ only in the last q tile, which is "
        "part padding: svgen discards padded query rows, so a tile there is FULL when every "
        "real pair is kept; Splash's padded query rows keep no key, so it marks those tiles "
        "partial."
    )
    print()
    print(
        f"All cases: {HEADS} heads, 512 x 512 tiles, forward only, one fresh subprocess per row; "
        "peak MiB is above the idle baseline measured after the imports ("
        + ", ".join(
            f"{s} {_span([r['baseline_mib'] for _, t, r in results if t == s])} MiB"
            for s in SYSTEMS
        )
        + ")."
    )
    print()
    print(
        "¹ svgen's mixed case is one kernel with two patterns assigned per head (both "
        "frame-major, the masks Splash gets): one table per pattern, however many heads use "
        "it; every head walks the longest pattern's table, skipping past its own end."
    )
    for label, system, r in results:
        if system == "Splash":
            print(
                f"\n{label}, Splash: grid {' x '.join(map(str, r['grid']))}; SMEM arrays "
                + ", ".join(f"{k} {v[0]} {v[1]}" for k, v in r["smem_shapes"].items())
                + "; other: "
                + ", ".join(f"{k} {v:,} B" for k, v in r["other_detail"].items())
                + (
                    " (q_sequence is broadcast to 128 lanes at call time: x128 in HBM)"
                    if "q_sequence" in r["other_detail"]
                    else ""
                )
                + "."
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the 75.6K single-pattern cases")
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(*args.child)
        return
    started = time.perf_counter()
    results = []
    for label, _, _ in CASES:
        if args.quick and label not in QUICK:
            continue
        for system in SYSTEMS:
            print(
                f"[{time.perf_counter() - started:7.1f} s] {label}: {system} ...",
                file=sys.stderr,
                flush=True,
            )
            r = run_case(system, label)
            print(
                f"          build {r['build_s']:.2f} s, visited {r['visited']:.4f}",
                file=sys.stderr,
                flush=True,
            )
            results.append((label, system, r))
    print_table(results)
    print(f"[{time.perf_counter() - started:7.1f} s] done", file=sys.stderr)


if __name__ == "__main__":
    main()
