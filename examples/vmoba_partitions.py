"""VMoBA's three key partitions as svgen specs, one per layer kind: blocks of whole frames
(1-D), of a patch across every frame (2-D) and of cubes (3-D); each query block keeps its own
block and adds the best others until their share of the scores reaches p (CPU, interpret
mode).

    python examples/vmoba_partitions.py [--seed N] [--p P]

VMoBA (Wu et al., 2025, arXiv 2506.23858) cycles the partition by layer: layer l uses the
1-D, 2-D or 3-D one as l mod 3. Each query scores the key blocks by their mean key, always
keeps its own block, and adds blocks by a threshold on the scores. In svgen a partition is a
layout whose blocks are contiguous runs of keys (`layout: {tiled: ...}` cubes, frame-major
frames), its own block is a `cube_window` (or `spatial_window`) of width 0, and the threshold
is `select: {top_p: ...}`, the fewest best blocks whose softmax mass reaches p. On this
geometry (4 frames of 8 x 16) every block holds 128 tokens, one compute block, so svgen's
blocks are VMoBA's; svgen scores a block of queries by its mean query where VMoBA scores each
query token (docs/runtime.md, "The grain", says how close that comes at real sizes).

For each layer kind the kernel's output is compared with attention under the mask built here
from the partition's definition alone (block ids from frame, row and column), in the user's
token order, in float64.
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

FRAMES, HEIGHT, WIDTH = 4, 8, 16  # 512 tokens
HEADS, HEAD_DIM = 2, 128
# (name, block sizes in frames x rows x columns, the svgen layout and own-block mask).
PARTITIONS = (
    ("1d", (1, HEIGHT, WIDTH), "frame_major", "spatial_window: {frames: 0}"),
    (
        "2d",
        (FRAMES, 4, 8),
        "{tiled: {frames: 4, rows: 4, cols: 8}}",
        "cube_window: {cube_frames: 4, cube_rows: 4, cube_cols: 8, frames: 0, rows: 0, cols: 0}",
    ),
    (
        "3d",
        (2, 8, 8),
        "{tiled: {frames: 2, rows: 8, cols: 8}}",
        "cube_window: {cube_frames: 2, cube_rows: 8, cube_cols: 8, frames: 0, rows: 0, cols: 0}",
    ),
)


def spec_text(name: str, layout: str, own: str, p: float) -> str:
    return f"""svgen: 1
name: vmoba_{name}
geometry: {{frames: {FRAMES}, height: {HEIGHT}, width: {WIDTH}}}
attention: {{heads: {HEADS}, head_dim: {HEAD_DIM}, dtype: float32}}
layout: {layout}
mask: {{{own}}}
select:
  candidate: {{spatial_window: {{}}}}
  top_p: {{p: {p}}}
tiling: {{block_q: 128, block_kv: 128}}
"""


def block_ids(sizes) -> np.ndarray:
    """int [seq]: each user-order token's block under a partition of blocks of `sizes`
    frames x rows x columns: written from the definition, not from svgen's layouts."""
    a, b, c = sizes
    f, h, w = (
        x.ravel() for x in np.meshgrid(*map(np.arange, (FRAMES, HEIGHT, WIDTH)), indexing="ij")
    )
    return ((f // a) * (HEIGHT // b) + h // b) * (WIDTH // c) + w // c


def chosen_blocks(q, k, ids, p: float) -> np.ndarray:
    """bool [blocks, blocks]: per query block, its own block and the fewest best other
    blocks (by mean query . mean key / sqrt(d)) whose softmax mass over the others reaches p."""
    n = ids.max() + 1
    means_q = np.stack([q[ids == b].mean(axis=0) for b in range(n)])
    means_k = np.stack([k[ids == b].mean(axis=0) for b in range(n)])
    scores = means_q @ means_k.T / np.sqrt(q.shape[-1])
    chosen = np.eye(n, dtype=bool)
    for b in range(n):
        others = np.array([c for c in range(n) if c != b])
        s = scores[b, others]
        order = np.argsort(-s, kind="stable")
        mass = np.exp(s[order] - s.max())
        mass /= mass.sum()
        before = np.cumsum(mass) - mass
        chosen[b, others[order[before < p]]] = True
    return chosen


def reference(q, k, v, ids, chosen) -> np.ndarray:
    keep = chosen[ids[:, None], ids[None, :]]
    s = np.where(
        keep, q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(q.shape[-1]), -np.inf
    )
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def compile_module(folder: pathlib.Path, name: str, text: str):
    (folder / f"vmoba_{name}.yaml").write_text(text)
    plan = analyze(parse_spec(text, source=str(folder / f"vmoba_{name}.yaml")))
    for file, data in codegen.render(plan, f"vmoba_{name}.yaml").items():
        (folder / file).write_bytes(data)
    spec = importlib.util.spec_from_file_location(f"vmoba_{name}", folder / f"vmoba_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(seed: int = 0, p: float = 0.6, verbose: bool = True) -> dict:
    libtpu_env.prepare()
    rng = np.random.default_rng(seed)
    seq = FRAMES * HEIGHT * WIDTH
    q, k, v = (rng.standard_normal((HEADS, seq, HEAD_DIM)).astype(np.float32) for _ in range(3))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layer, (name, sizes, layout, own) in enumerate(PARTITIONS):
            module = compile_module(pathlib.Path(tmp), name, spec_text(name, layout, own, p))
            out = np.asarray(
                module.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), interpret=True)
            )
            ids = block_ids(sizes)
            for head in range(HEADS):
                chosen = chosen_blocks(q[head], k[head], ids, p)
                want = reference(q[head], k[head], v[head], ids, chosen)
                error = float(np.max(np.abs(out[head] - want)) / np.max(np.abs(want)))
                rows.append(
                    {
                        "layer": layer,
                        "partition": name,
                        "head": head,
                        "kept_blocks": float(chosen.mean()),
                        "error": error,
                    }
                )
                if verbose:
                    print(
                        f"layer {layer} ({name} blocks of {sizes[0]}x{sizes[1]}x{sizes[2]}), "
                        f"head {head}: {chosen.mean():.1%} of block pairs kept, kernel vs "
                        f"float64 {error:.1e}"
                    )
    return {"rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--p", type=float, default=0.6)
    args = parser.parse_args(argv)
    run(args.seed, args.p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
