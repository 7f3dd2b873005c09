"""Mixture of Contexts' routing as an svgen spec: each query chunk attends its mandatory anchors
(the caption and its own frame) and the k earlier frames of its own video whose mean key
scores best, on a packed batch of two videos with a caption each, k per head (CPU, interpret
mode).

    python examples/moc_routing.py [--seed N] [--k K0,K1]

Mixture of Contexts (Cai et al., 2025, arXiv 2508.21058) cuts the token stream into
content-aligned chunks (frames, shots, the caption), scores each chunk by the dot product of
a query with the chunk's mean key, keeps the top k chunks, always keeps the caption and the
query's own chunk, and routes causally (a frame only to earlier frames). Training packs
several videos into one sequence. This script writes that rule as a spec:

    mask: {any_of: [{text: {}}, {spatial_window: {frames: 0}}]}     # the anchors
    select: {candidate: {causal_frames: {}}, top_k: {k: 1, max: 3}}  # causal routing
    runtime: {segments: true}                                        # packed videos

on a geometry whose frames are one compute block each (8 x 16 = 128 tokens), so that svgen's
blocks are MoC's frame chunks. svgen routes a block of queries (a frame) by its mean query,
where MoC routes each query token: the one place the two differ, said here and not hidden.

The kernel's output (one call, k per head as a [heads] argument) is compared with attention
under the mask built here from the rule alone (frame chunks, mean keys, top k, anchors,
segments), in float64; so is the selection the call returns.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tempfile

import jax.numpy as jnp
import numpy as np

from svgen import codegen
from svgen.analysis import analyze
from svgen.runtime import libtpu_env
from svgen.spec import parse_spec

FRAMES, HEIGHT, WIDTH, TEXT = 8, 8, 16, 128  # frames of 128 tokens, a 128-token caption block
FRAME_TOKENS = HEIGHT * WIDTH
HEADS, HEAD_DIM = 2, 128
# The two packed videos: (frames, real caption tokens, caption slots).
VIDEOS = ((4, 40, 64), (4, 50, 64))

SPEC = f"""svgen: 1
name: moc_routing
geometry: {{frames: {FRAMES}, height: {HEIGHT}, width: {WIDTH}, text_tokens: {TEXT}}}
attention: {{heads: {HEADS}, head_dim: {HEAD_DIM}, dtype: float32}}
layout: frame_major
mask: {{any_of: [{{text: {{}}}}, {{spatial_window: {{frames: 0}}}}]}}
select:
  candidate: {{causal_frames: {{}}}}
  top_k: {{k: 1, max: 3}}
runtime: {{segments: true}}
tiling: {{block_q: 128, block_kv: 128}}
"""


def segment_ids() -> np.ndarray:
    """int32 [seq]: video i's frames and its real caption tokens get i; padding slots -1."""
    ids = np.full(FRAMES * FRAME_TOKENS + TEXT, -1, np.int32)
    frame = slot = 0
    for video, (frames, real, slots) in enumerate(VIDEOS):
        ids[frame * FRAME_TOKENS : (frame + frames) * FRAME_TOKENS] = video
        start = FRAMES * FRAME_TOKENS + slot
        ids[start : start + real] = video
        frame, slot = frame + frames, slot + slots
    return ids


def routed_frames(q: np.ndarray, k: np.ndarray, ids: np.ndarray, top_k: int) -> np.ndarray:
    """bool [frames, frames]: for one head, the earlier frames of its own video each query
    frame routes to: the top_k by (mean query of the frame) . (mean key of the frame) /
    sqrt(d), ties to the earlier frame."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    means_q = q[: FRAMES * FRAME_TOKENS].reshape(FRAMES, FRAME_TOKENS, -1).mean(axis=1)
    means_k = k[: FRAMES * FRAME_TOKENS].reshape(FRAMES, FRAME_TOKENS, -1).mean(axis=1)
    video = ids[: FRAMES * FRAME_TOKENS : FRAME_TOKENS]
    routed = np.zeros((FRAMES, FRAMES), bool)
    for f in range(FRAMES):
        earlier = [g for g in range(f) if video[g] == video[f]]
        scores = np.array([means_q[f] @ means_k[g] * scale for g in earlier])
        best = np.argsort(-scores, kind="stable")[:top_k]
        routed[f, [earlier[i] for i in best]] = True
    return routed


def keep_mask(routed: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """bool [seq, seq]: same video (padding nowhere) and (the caption on either side, the
    query's own frame, or a frame it routes to)."""
    seq = ids.shape[0]
    pos = np.arange(seq)
    text = pos >= FRAMES * FRAME_TOKENS
    frame = np.where(text, 0, pos // FRAME_TOKENS)
    same = (ids[:, None] == ids[None, :]) & (ids[:, None] >= 0)
    video = ~text[:, None] & ~text[None, :]
    anchors = text[:, None] | text[None, :] | (video & (frame[:, None] == frame[None, :]))
    chosen = video & routed[frame[:, None], frame[None, :]]
    return same & (anchors | chosen)


def reference(q, k, v, keep) -> np.ndarray:
    s = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)
    top = np.max(s, axis=1, keepdims=True)
    w = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = w.sum(axis=1, keepdims=True)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0) @ v.astype(np.float64)


def compile_module(folder: pathlib.Path):
    (folder / "moc_routing.yaml").write_text(SPEC)
    plan = analyze(parse_spec(SPEC, source=str(folder / "moc_routing.yaml")))
    for name, data in codegen.render(plan, "moc_routing.yaml").items():
        (folder / name).write_bytes(data)
    spec = importlib.util.spec_from_file_location("moc_routing", folder / "moc_routing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(seed: int = 0, top_k=(1, 2), verbose: bool = True) -> dict:
    libtpu_env.prepare()
    rng = np.random.default_rng(seed)
    seq = FRAMES * FRAME_TOKENS + TEXT
    q, k, v = (rng.standard_normal((HEADS, seq, HEAD_DIM)).astype(np.float32) for _ in range(3))
    ids = segment_ids()
    with tempfile.TemporaryDirectory() as tmp:
        module = compile_module(pathlib.Path(tmp))
        out, selected = module.attention(
            jnp.asarray(q),
            jnp.asarray(k),
            jnp.asarray(v),
            segment_ids=jnp.asarray(ids),
            top_k=jnp.asarray(top_k, jnp.int32),
            return_selection=True,
            interpret=True,
        )
    out, selected = np.asarray(out), np.asarray(selected)
    rows = []
    for head in range(HEADS):
        routed = routed_frames(q[head], k[head], ids, top_k[head])
        want = reference(q[head], k[head], v[head], keep_mask(routed, ids))
        error = float(np.max(np.abs(out[head] - want)) / np.max(np.abs(want)))
        # svgen's selection, in frames: its first FRAMES rows and columns of blocks.
        same_choice = bool(np.array_equal(selected[head][:FRAMES, :FRAMES], routed))
        rows.append(
            {
                "head": head,
                "k": top_k[head],
                "routed": int(routed.sum()),
                "error": error,
                "same_choice": same_choice,
            }
        )
        if verbose:
            print(
                f"head {head}: k = {top_k[head]}, {int(routed.sum())} routed frame pairs, "
                f"the same as svgen's choice: {same_choice}, kernel vs float64 {error:.1e}"
            )
    return {"rows": rows, "spec": SPEC}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", default="1,2", help="top k per head, comma-separated")
    args = parser.parse_args(argv)
    run(args.seed, tuple(int(x) for x in args.k.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
