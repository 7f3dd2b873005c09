"""A small video-DiT self-attention layer running svgen's sparse kernel (CPU, interpret mode).

    python examples/video_dit_layer.py [--seed N]

The layer: LayerNorm -> Q/K/V projections -> attention -> output projection, with random
weights. So that heads have something to find, the tokens carry a frame code and a place code
(the same place in every frame shares one), and each head's Q/K projection reads mostly one of
them: a "spatial" head then attends within nearby frames, a "temporal" head along the same place.
svgen compiles examples/dit_small.yaml (spatial and temporal patterns, temporal in
temporal-major order), `profile` picks each head's pattern from 64 sampled query rows, and the
block-sparse kernel runs all heads in one call. The script prints, per head, the planted kind,
the chosen pattern and the relative error of the sparse output against dense attention.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from svgen import codegen
from svgen.runtime import libtpu_env
from svgen.analysis import analyze
from svgen.spec import load_spec

HERE = pathlib.Path(__file__).resolve().parent
MODEL_DIM = 256


def compile_example(out_dir: pathlib.Path):
    """svgen compile examples/dit_small.yaml into out_dir, and import the module."""
    plan = analyze(load_spec(HERE / "dit_small.yaml"))
    for name, data in codegen.render(plan, "examples/dit_small.yaml").items():
        (out_dir / name).write_bytes(data)
    spec = importlib.util.spec_from_file_location("dit_small", out_dir / "dit_small.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return plan, module


def tokens(plan, rng) -> np.ndarray:
    """[seq, MODEL_DIM] activations: frame code + place code + noise (text: noise)."""
    lay = plan.layout
    s = lay.tokens_per_frame
    index = np.arange(lay.seq_len) - lay.video_start
    is_text = (index < 0) | (index >= lay.video_tokens)
    frame_code = rng.standard_normal((lay.frames, MODEL_DIM // 2))
    place_code = rng.standard_normal((s, MODEL_DIM // 2))
    x = np.concatenate(
        [frame_code[np.where(is_text, 0, index // s)], place_code[np.where(is_text, 0, index % s)]],
        axis=1,
    )
    x[is_text] = 0.0
    return (x + 0.5 * rng.standard_normal(x.shape)).astype(np.float32)


def layer_weights(kinds, head_dim, rng):
    """Q/K read the frame half (spatial head) or the place half (temporal head) of the input."""
    heads = len(kinds)
    wq = 0.05 * rng.standard_normal((heads, MODEL_DIM, head_dim))
    for h, kind in enumerate(kinds):
        half = slice(0, MODEL_DIM // 2) if kind == "spatial" else slice(MODEL_DIM // 2, None)
        wq[h, half] += 0.07 * rng.standard_normal((MODEL_DIM // 2, head_dim))
    wv = rng.standard_normal((heads, MODEL_DIM, head_dim)) / np.sqrt(MODEL_DIM)
    wo = rng.standard_normal((heads, head_dim, MODEL_DIM)) / np.sqrt(heads * head_dim)
    return tuple(jnp.asarray(w, jnp.float32) for w in (wq, wq, wv, wo))  # K shares Q's weights


def dense_attention(q, k, v):
    scores = jnp.einsum("hqd,hkd->hqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), v)


def run(seed: int = 0, verbose: bool = True):
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        plan, module = compile_example(pathlib.Path(tmp))
        heads, head_dim = plan.spec.attention.heads, plan.spec.attention.head_dim
        kinds = [("spatial", "temporal")[i] for i in rng.integers(0, 2, heads)]
        wq, wk, wv, wo = layer_weights(kinds, head_dim, rng)
        x = jnp.asarray(tokens(plan, rng))
        h = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-6)  # LayerNorm
        q, k, v = (jnp.einsum("sm,hmd->hsd", h, w) for w in (wq, wk, wv))

        chosen = jax.jit(module.profile)(q, k, v, key=jax.random.PRNGKey(seed))
        sparse = module.attention(q, k, v, head_pattern=chosen, interpret=True)
        dense = dense_attention(q, k, v)
        y = x + jnp.einsum("hsd,hdm->sm", sparse, wo)  # residual + output projection
        errors = jnp.linalg.norm(sparse - dense, axis=(1, 2)) / jnp.linalg.norm(dense, axis=(1, 2))
    rows = [(h, kinds[h], module.PATTERNS[int(chosen[h])], float(errors[h])) for h in range(heads)]
    if verbose:
        print(
            f"{plan.spec.name}: {plan.layout.seq_len} tokens, {heads} heads; patterns "
            f"{', '.join(f'{p.name} ({p.layout.order}, density {p.density:.3f})' for p in plan.patterns)}"
        )
        print("head  planted   chosen    rel. error vs dense")
        for h, kind, name, err in rows:
            print(f"{h:4d}  {kind:8s}  {name:8s}  {err:.4f}")
        print(f"layer output: {tuple(y.shape)}, finite: {bool(jnp.all(jnp.isfinite(y)))}")
    return rows


def main(argv=None) -> int:
    # Before JAX starts its backends: JAX loads libtpu even for CPU work when it is installed,
    # and on a machine without a TPU libtpu would print warnings that look like a crash.
    libtpu_env.prepare()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run(args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
