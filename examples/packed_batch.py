"""A packed training batch: several videos of different lengths, each with its own prompt of
its own length, in one sequence, through one compiled svgen module (a `runtime:` section).

    .venv/bin/python examples/packed_batch.py [--seed N]

The spec (SPEC below) is a spatial head with a first-frame anchor for a 12-frame, 4 x 8
latent with 48 text tokens; `runtime: {segments: true, per_video_frames: true}` lets each
call say which video every token belongs to, and each video counts its frames from its own
first frame. Two batch elements pack different videos:

    element 0: videos of 3, 5 and 4 frames; prompts of 9, 16 and 4 real tokens (16 slots each)
    element 1: videos of 6 and 6 frames;    prompts of 20 and 11 real tokens (24 slots each)

Segment ids say the video (and its prompt's slots); a negative id marks a padding slot of a
prompt. With per-video frames every video (and its prompt) attends its *own* first frame, as
it would alone: the anchor moves with the video, which the sequence's frame numbers cannot
say (see docs/runtime.md).

What it checks, against float64 NumPy: the packed kernel's output equals each video run on
its own (its tokens and its prompt's real tokens only, the mask built from the video's own
frame numbers), and one training step's gradient (jax.grad through the kernel's backward)
equals the sum of the per-video gradients. It prints, per batch element, the grid steps the
call's tables hold next to the union of the per-video visited tiles, and a last line
`RESULT {json}` for tests to read. About 30 s on two CPU cores (interpret mode).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from svgen import codegen
from svgen.runtime import libtpu_env
from svgen.analysis import analyze
from svgen.runtime import segments
from svgen.spec import parse_spec

SPEC = """
svgen: 1
name: packed_spatial
geometry: {frames: 12, height: 4, width: 8, text_tokens: 48, text_position: last}
attention: {heads: 2, head_dim: 64, dtype: float32}
mask:
  any_of:
    - spatial_window: {frames: 1, rows: 2}
    - first_frame: {frames: 1}
    - text: {}
tiling: {block_q: 128, block_kv: 128}
runtime: {segments: true, per_video_frames: true}
"""
FRAMES, HEIGHT, WIDTH, TEXT = 12, 4, 8, 48
PER_FRAME = HEIGHT * WIDTH
# Per batch element: (frames, real prompt tokens, prompt slots) of each packed video.
PACKING = [
    [(3, 9, 16), (5, 16, 16), (4, 4, 16)],
    [(6, 20, 24), (6, 11, 24)],
]
TOLERANCE = 1e-5


def compile_module(directory: pathlib.Path):
    spec = parse_spec(SPEC, source="packed_spatial.yaml")
    plan = analyze(spec)
    for filename, data in codegen.render(plan, "examples/packed_batch.py").items():
        (directory / filename).write_bytes(data)
    path = directory / codegen.module_filename(spec.name)
    module_spec = importlib.util.spec_from_file_location("packed_spatial", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return plan, module


def video_tokens(packing, video: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions in the packed sequence, the video's own frame of each; -1 for text)."""
    first = sum(f for f, _, _ in packing[:video])
    frames, real, _ = packing[video]
    slot = FRAMES * PER_FRAME + sum(s for _, _, s in packing[:video])
    video_pos = np.arange(first * PER_FRAME, (first + frames) * PER_FRAME)
    own_frame = np.arange(frames * PER_FRAME) // PER_FRAME
    text_pos = np.arange(slot, slot + real)
    return np.concatenate([video_pos, text_pos]), np.concatenate([own_frame, np.full(real, -1)])


def own_keep(positions: np.ndarray, own_frame: np.ndarray) -> np.ndarray:
    """The model's intent for one video alone, from its own frame numbers: |df| <= 1 and
    |dh| <= 2 between its video tokens, every query to the video's first frame, and every
    pair with a text token."""
    text = own_frame < 0
    row = (positions % PER_FRAME) // WIDTH
    near = (np.abs(own_frame[:, None] - own_frame[None, :]) <= 1) & (
        np.abs(row[:, None] - row[None, :]) <= 2
    )
    anchor = (own_frame == 0)[None, :]
    return (near & ~text[:, None] & ~text[None, :]) | anchor | text[:, None] | text[None, :]


def attention64(q, k, v, keep):
    s = np.where(keep, q @ k.T / np.sqrt(q.shape[-1]), -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return p @ v, p


def grads64(q, k, v, keep, do):
    o, p = attention64(q, k, v, keep)
    ds = p * (do @ v.T - (do * o).sum(-1, keepdims=True))
    scale = 1 / np.sqrt(q.shape[-1])
    return ds @ k * scale, ds.T @ q * scale, p.T @ do


def tile_counts(module, ids: np.ndarray, packing) -> tuple[int, int]:
    """(steps of the call's tables per head, union of the per-video visited tiles + one
    zero-fill step per q tile that visits none)."""
    pattern = module._PATTERNS[0]
    walk = segments.SegmentTables.build(
        [pattern.runs],
        (0,),
        module.SHAPE,
        module.SLOTS_PER_PIECE,
        False,
        video=(pattern.video_frames,),
        layouts=(pattern.layout,),
    )
    runtime = module.attention.runtime
    call = segments.call_ids(runtime, jnp.asarray(ids)[None], None, 1, [pattern.layout])
    steps = int(walk.tables(call, jnp.zeros(1, jnp.int32)).row_num_pieces[0])
    block = module.SHAPE.block_q
    tiles = -(-len(ids) // block)
    visited = np.zeros((tiles, tiles), bool)
    for video in range(len(packing)):
        positions, own = video_tokens(packing, video)
        keep = own_keep(positions, own)
        rows, cols = np.nonzero(keep)
        visited[positions[rows] // block, positions[cols] // block] = True
    union = int(visited.sum() + (~visited.any(axis=1)).sum())
    return steps, union


def run(seed: int = 0, verbose: bool = True) -> dict:
    libtpu_env.quiet()
    with tempfile.TemporaryDirectory(prefix="svgen_packed_") as tmp:
        plan, module = compile_module(pathlib.Path(tmp))
        seq = plan.layout.seq_len
        rng = np.random.default_rng(seed)
        ids = np.stack([segments.packed_segment_ids(plan.layout, p) for p in PACKING])
        batch, heads, d = len(PACKING), module.HEADS, module.HEAD_DIM
        q, k, v, do = (
            rng.standard_normal((batch, heads, seq, d)).astype(np.float32) for _ in range(4)
        )

        @jax.jit
        def step(q, k, v, ids):
            def loss(q, k, v):
                out = module.attention(q, k, v, segment_ids=ids, interpret=True)
                return jnp.sum(out * do), out

            return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

        (_, out), grads = step(q, k, v, ids)
        out, grads = np.asarray(out), [np.asarray(g) for g in grads]
        worst_out = worst_grad = 0.0
        rows = []
        for b, packing in enumerate(PACKING):
            covered = np.zeros(seq, bool)
            for video in range(len(packing)):
                pos, own = video_tokens(packing, video)
                covered[pos] = True
                keep = own_keep(pos, own)
                for h in range(heads):
                    x64 = [x[b, h][pos].astype(np.float64) for x in (q, k, v, do)]
                    want, _ = attention64(*x64[:3], keep)
                    err = np.abs(out[b, h][pos] - want).max() / np.abs(want).max()
                    worst_out = max(worst_out, err)
                    for g, w in zip(grads, grads64(*x64[:3], keep, x64[3])):
                        err = np.linalg.norm(g[b, h][pos] - w) / max(np.linalg.norm(w), 1.0)
                        worst_grad = max(worst_grad, err)
            # Padding slots attend nothing and nothing attends them: zero rows, zero grads.
            assert np.all(out[b][:, ~covered] == 0.0), "a padding row is not zero"
            assert all(np.all(g[b][:, ~covered] == 0.0) for g in grads), "padding got gradient"
            steps, union = tile_counts(module, ids[b], packing)
            static = int(module.attention.tables.num_pieces[0])
            rows.append(
                {
                    "element": b,
                    "videos": len(packing),
                    "steps": steps,
                    "union": union,
                    "static_steps": static,
                }
            )
            if verbose:
                print(
                    f"element {b}: {len(packing)} videos, {steps} grid steps per head "
                    f"(static tables: {static}), union of the per-video visited tiles {union}"
                )
        result = {"worst_output_error": worst_out, "worst_gradient_error": worst_grad, "rows": rows}
        if verbose:
            print(f"packed vs each video alone: output {worst_out:.1e}, gradients {worst_grad:.1e}")
            print("RESULT " + json.dumps(result))
        assert worst_out <= TOLERANCE and worst_grad <= TOLERANCE, result
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    run(parser.parse_args().seed)


if __name__ == "__main__":
    main()
