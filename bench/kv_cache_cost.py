"""What a chunk costs: autoregressive generation with a KV cache, Self-Forcing's geometry.

    .venv/bin/python bench/kv_cache_cost.py [--spec specs/self_forcing_chunks.yaml] [--no-cache]
    .venv/bin/python bench/kv_cache_cost.py --spec specs/self_forcing_rolling.yaml

The shipped spec (21 x 30 x 52 latent, 32,760 tokens, 12 heads, d 128, bf16, chunks of 3
frames, sink + window) through `svgen cost`'s static v6e model (libtpu's schedule of the
kernels, AOT-compiled on this host once and cached). Per chunk position, one chunked call
(attention(q_chunk, k_cache, v_cache, q_frame_offset=f)):

  * grid steps per head (the chunk's own tiles; one zero-fill step per q tile that visits
    nothing), FULL / BOUNDARY tiles, and the modelled time over all heads;
  * q and o bytes of the call (the chunk's), next to the workaround a user had before
    (a full-length q buffer holding the chunk, one pattern per chunk position): its q/o
    bytes and its grid steps per head (the full sequence's q tiles: the visited tiles of the
    q tiles that hold the chunk's rows, and one zero-fill step for every other q tile).

Then the whole video chunk by chunk against one full-sequence call (what recomputing every
frame at once costs), and the per-step bookkeeping of the chunked kernel next to the static
one-pattern kernel's, and the k + v bytes the cache holds (a rolling cache's sink and
ring against the whole video's).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from svgen.estimate import cost  # noqa: E402
from svgen.analysis import analyze  # noqa: E402
from svgen.analysis.chunks import runs_of_position  # noqa: E402
from svgen.core.kinds import TileKind  # noqa: E402
from svgen.spec import load_spec  # noqa: E402


def workaround_steps(plan, position: int) -> int:
    """Grid steps per head of a full-length q buffer holding one chunk: the full sequence's
    q tiles that hold chunk rows walk their visited tiles, every other q tile one zero-fill
    step (its rows are not the call's)."""
    runs = plan.patterns[0].table.runs
    rows = plan.spec.runtime.chunk_frames * plan.layout.tokens_per_frame
    block = plan.grid.block_q
    first, last = position * rows // block, ((position + 1) * rows - 1) // block
    inside = (runs[:, 0] >= first) & (runs[:, 0] <= last)
    return int(runs[inside, 2].sum()) + plan.grid.num_q_blocks - (last - first + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(REPO / "specs" / "self_forcing_chunks.yaml"))
    parser.add_argument("--no-cache", action="store_true", help="compile even when cached")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    plan = analyze(spec)
    report = cost.cost_plan(plan, args.spec, use_cache=not args.no_cache)
    chunks, clock = report.chunks, report.clock_ghz
    heads, d = spec.attention.heads, spec.attention.head_dim
    itemsize = 2 if spec.attention.dtype == "bfloat16" else 4
    rows = spec.runtime.chunk_frames * plan.layout.tokens_per_frame
    chunk_bytes = 2 * heads * rows * d * itemsize  # q and o
    full_bytes = 2 * heads * plan.layout.seq_len * d * itemsize
    steps = plan.chunk_steps()
    print(
        f"{spec.name}: {plan.layout.frames} x {plan.layout.height} x {plan.layout.width}, "
        f"{heads} heads, chunks of {spec.runtime.chunk_frames} frames ({rows:,} tokens); "
        f"tiles {spec.tiling.block_q} x {spec.tiling.block_kv}, v6e static model"
    )
    print(
        f"{'frames':>8} {'steps/head':>10} {'FULL':>6} {'BOUNDARY':>8} {'ms':>7} "
        f"{'q+o MB':>7} {'workaround steps':>16} {'workaround q+o MB':>17}"
    )
    for position, (walked, cycles) in enumerate(zip(chunks.steps, chunks.cycles)):
        f0 = position * spec.runtime.chunk_frames
        kinds = runs_of_position(plan.chunk_runs[0], position)
        assert steps[position] == int(kinds[:, 2].sum())  # one pattern, one tile slot
        print(
            f"{f0:>3}-{f0 + spec.runtime.chunk_frames - 1:<4} {steps[position]:>10} "
            f"{walked['full'] // heads:>6} {walked['mixed'] // heads:>8} "
            f"{cycles / (clock * 1e6):>7.3f} {chunk_bytes / 1e6:>7.2f} "
            f"{workaround_steps(plan, position):>16} {full_bytes / 1e6:>17.2f}"
        )
    total = chunks.total / (clock * 1e6)
    print(
        f"all chunks: {sum(steps)} steps per head, {total:.2f} ms; one full-sequence call: "
        f"{plan.grid_steps} steps per head, {report.ms:.2f} ms ({chunks.total / report.cycles:.2f}x)"
    )
    visited = int((plan.patterns[0].kinds != TileKind.EMPTY).sum())
    print(f"full sequence: {visited} visited tiles of {plan.patterns[0].kinds.size}")
    print(
        f"bookkeeping per step: chunked call {chunks.paths.bookkeeping}, static one-pattern "
        f"kernel {report.paths.bookkeeping} ({chunks.paths.bookkeeping / report.paths.bookkeeping - 1:+.1%}); "
        f"FULL tile {chunks.paths.full} vs {report.paths.full}"
    )
    print(f"workaround steps in all: {sum(workaround_steps(plan, c) for c in range(len(steps)))}")
    runtime = spec.runtime
    cache_frames = runtime.sink_frames + runtime.window_frames if runtime.rolling else None
    video_kv = 2 * heads * plan.layout.seq_len * d * itemsize
    if cache_frames:
        cache_kv = 2 * heads * cache_frames * plan.layout.tokens_per_frame * d * itemsize
        print(
            f"k + v cache: {plan.cache_words()}, {cache_kv / 1e6:.2f} MB against "
            f"{video_kv / 1e6:.2f} MB for the whole video ({cache_kv / video_kv:.2f}x)"
        )
    else:
        print(f"k + v cache: {plan.cache_words()}, {video_kv / 1e6:.2f} MB")
    np.testing.assert_equal(len(steps), len(chunks.steps))


if __name__ == "__main__":
    main()
