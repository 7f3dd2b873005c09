"""Autoregressive video generation with a rolling KV cache, chunk by chunk, through one
compiled svgen module (a spec with `runtime: {kv_cache: {chunk_frames: 2, sink_frames: 2,
window_frames: 4}}`), on the CPU (interpret mode).

    .venv/bin/python examples/autoregressive_video.py [--seed N]

The model: a tiny video DiT of LAYERS blocks (LayerNorm -> Q/K/V -> attention -> output
projection, then an MLP, random weights) over an 8-frame, 8 x 12 latent, generated 2 frames at
a time as CausVid / Self-Forcing do. Each chunk's tokens run through every block; each block
writes the chunk's keys and values into its own rolling cache and attends the chunk's queries
against it:

    attention(q_chunk, k_ring, v_ring, q_frame_offset=first frame of the chunk)

The cache holds SINK = 2 sink frames and a ring of RING = 4 frame slots (576 keys, not the
video's 768, and the same 576 however long the video runs): frame a < SINK lives in slot a,
frame a >= SINK in slot SINK + (a - SINK) mod RING, so each chunk's frames overwrite the
oldest ring frames. The spec's mask (SPEC below) is a sink plus a window in absolute frames:
every query attends the first chunk and the frames within RADIUS = 2 of its own; the
compiler adds block-causality over the chunks and checks that the ring holds every frame the
mask keeps. Slots not written yet hold garbage (1e4): the kernel never attends them.

What it checks: chunk by chunk, every block's attention output equals float64 NumPy attention
of the chunk against the ring's keys the mask keeps (the slot map written out here by hand),
and the whole generated video equals one pass of the full sequence through the same model with
the module's full-sequence call (whose mask is the same block-causal one): recomputing
everything gives what the rolling cache gave. It prints per chunk the kernel's grid steps per
head (the chunk's own tiles against the ring's) and its q and cache bytes next to the full
sequence's, and a last line `RESULT {json}` for tests. About 20 s on two CPU cores.
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
from svgen.spec import parse_spec

SPEC = """
svgen: 1
name: ar_video
geometry: {frames: 8, height: 8, width: 12}
attention: {heads: 2, head_dim: 64, dtype: float32}
layout: frame_major
mask:
  any_of:
    - first_frame: {frames: 2}
    - spatial_window: {frames: 2}
tiling: {block_q: 128, block_kv: 128}
runtime: {kv_cache: {chunk_frames: 2, sink_frames: 2, window_frames: 4}}
"""
FRAMES, PER_FRAME, CHUNK, SINK, RADIUS, RING = 8, 96, 2, 2, 2, 4
CACHE_FRAMES = SINK + RING
HEADS, HEAD_DIM, LAYERS = 2, 64, 2
MODEL_DIM = HEADS * HEAD_DIM
GARBAGE = 1e4  # what a cache slot holds before its first frame is written
TOLERANCE = 2e-5


def compile_module(directory: pathlib.Path):
    spec = parse_spec(SPEC, source="ar_video.yaml")
    plan = analyze(spec)
    for filename, data in codegen.render(plan, "examples/autoregressive_video.py").items():
        (directory / filename).write_bytes(data)
    path = directory / codegen.module_filename(spec.name)
    module_spec = importlib.util.spec_from_file_location("ar_video", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return plan, module


def weights(rng) -> list[dict]:
    def dense(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    return [
        {
            "qkv": dense(MODEL_DIM, 3 * MODEL_DIM),
            "out": dense(MODEL_DIM, MODEL_DIM),
            "up": dense(MODEL_DIM, 2 * MODEL_DIM),
            "down": dense(2 * MODEL_DIM, MODEL_DIM),
        }
        for _ in range(LAYERS)
    ]


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def heads_of(x):
    """[tokens, MODEL_DIM] -> [heads, tokens, head_dim]."""
    return jnp.swapaxes(x.reshape(x.shape[0], HEADS, HEAD_DIM), 0, 1)


def block(x, w, attend):
    """One DiT block; attend(q, k, v) -> [heads, tokens, head_dim]."""
    q, k, v = jnp.split(layer_norm(x) @ w["qkv"], 3, axis=-1)
    o = attend(heads_of(q), heads_of(k), heads_of(v))
    x = x + jnp.swapaxes(o, 0, 1).reshape(x.shape) @ w["out"]
    return x + jax.nn.gelu(layer_norm(x) @ w["up"]) @ w["down"]


def slot_of(frame: int) -> int:
    """The rolling cache's convention: the sink in place, later frames round the ring."""
    return frame if frame < SINK else SINK + (frame - SINK) % RING


def attention64(q, k, v, keep):
    s = np.where(keep, q @ k.T / np.sqrt(q.shape[-1]), -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    return (p / np.maximum(p.sum(-1, keepdims=True), 1e-300)) @ v


def chunk_keep(chunk: int, held: np.ndarray) -> np.ndarray:
    """keep[chunk row, cache key] of the spec's mask in absolute frames (NumPy, by hand), the
    keys read through `held` (the video frame each slot holds, -1 for none yet)."""
    q_frame = chunk * CHUNK + np.arange(CHUNK * PER_FRAME) // PER_FRAME
    k_frame = np.repeat(held, PER_FRAME)
    near = np.abs(q_frame[:, None] - k_frame[None, :]) <= RADIUS
    causal = k_frame[None, :] // CHUNK <= q_frame[:, None] // CHUNK
    return (k_frame[None, :] >= 0) & ((k_frame[None, :] < SINK) | near) & causal


def check_ring_holds(chunk: int, held: np.ndarray) -> None:
    """Every frame the mask keeps for this chunk is in the ring (what svgen compile checked)."""
    last = chunk * CHUNK + CHUNK - 1
    wanted = {a for a in range(FRAMES) if a < SINK or chunk * CHUNK - RADIUS <= a <= last}
    assert wanted <= set(held.tolist()), (chunk, wanted, held)


def generate(module, params, latents):
    """Chunk by chunk with a rolling KV cache per block; returns (video [tokens, MODEL_DIM],
    worst attention error against float64)."""
    rows = CHUNK * PER_FRAME
    caches = [
        [jnp.full((HEADS, CACHE_FRAMES * PER_FRAME, HEAD_DIM), GARBAGE, jnp.float32)] * 2
        for _ in params
    ]
    held = np.full(CACHE_FRAMES, -1)  # the video frame each slot holds
    outputs, worst = [], 0.0
    attend_chunk = jax.jit(
        lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f, interpret=True)
    )
    for chunk in range(FRAMES // CHUNK):
        frames = range(chunk * CHUNK, chunk * CHUNK + CHUNK)
        for a in frames:
            held[slot_of(a)] = a
        check_ring_holds(chunk, held)
        x = latents[chunk * rows : (chunk + 1) * rows]
        for w, cache in zip(params, caches):

            def attend(q, k, v, cache=cache, chunk=chunk, frames=frames):
                nonlocal worst
                for i, a in enumerate(frames):  # the chunk's frames into their slots
                    slot = slice(slot_of(a) * PER_FRAME, (slot_of(a) + 1) * PER_FRAME)
                    own = slice(i * PER_FRAME, (i + 1) * PER_FRAME)
                    cache[0] = cache[0].at[:, slot].set(k[:, own])
                    cache[1] = cache[1].at[:, slot].set(v[:, own])
                o = attend_chunk(q, cache[0], cache[1], jnp.int32(chunk * CHUNK))
                keep = chunk_keep(chunk, held)
                for h in range(HEADS):
                    want = attention64(
                        *(np.asarray(a[h], np.float64) for a in (q, cache[0], cache[1])), keep
                    )
                    worst = max(worst, float(np.abs(np.asarray(o[h]) - want).max()))
                return o

            x = block(x, w, attend)
        outputs.append(x)
    return jnp.concatenate(outputs), worst


def run(seed: int = 0, verbose: bool = True) -> dict:
    libtpu_env.quiet()
    with tempfile.TemporaryDirectory(prefix="svgen_ar_") as tmp:
        plan, module = compile_module(pathlib.Path(tmp))
        rng = np.random.default_rng(seed)
        params = weights(rng)
        latents = jnp.asarray(rng.standard_normal((FRAMES * PER_FRAME, MODEL_DIM)), jnp.float32)
        video, worst_attention = generate(module, params, latents)

        # The same model over the whole sequence at once, the full-sequence call.
        def full_attend(q, k, v):
            return module.attention(q, k, v, interpret=True)

        x = latents
        for w in params:
            x = block(x, w, full_attend)
        recompute = float(np.abs(np.asarray(video) - np.asarray(x)).max())
        steps = plan.chunk_steps()
        rows = CHUNK * PER_FRAME
        result = {
            "worst_attention_error": worst_attention,
            "recompute_difference": recompute,
            "chunk_steps": steps,
            "full_steps": plan.grid_steps,
            "chunk_q_bytes": HEADS * rows * HEAD_DIM * 4,
            "full_q_bytes": HEADS * FRAMES * PER_FRAME * HEAD_DIM * 4,
            "cache_keys": module.attention.kv_cache.cache_tokens,
            "video_keys": FRAMES * PER_FRAME,
        }
        if verbose:
            for chunk, n in enumerate(steps):
                print(
                    f"chunk {chunk} (frames {chunk * CHUNK}-{chunk * CHUNK + CHUNK - 1}): {n} grid "
                    f"steps per head, q {result['chunk_q_bytes']:,} bytes, a cache of "
                    f"{result['cache_keys']:,} keys"
                )
            print(
                f"full sequence: {plan.grid_steps} grid steps per head, q "
                f"{result['full_q_bytes']:,} bytes, {result['video_keys']:,} keys"
            )
            print(
                f"attention vs float64: {worst_attention:.1e}; chunked generation vs "
                f"recomputing the whole sequence: {recompute:.1e}"
            )
            print("RESULT " + json.dumps(result))
        return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    result = run(parser.parse_args().seed)
    ok = result["worst_attention_error"] <= TOLERANCE and result["recompute_difference"] <= 1e-3
    sys.exit(0 if ok else 1)
