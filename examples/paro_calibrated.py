"""PAROAttention's pattern as an svgen spec: per head, the axis order that gathers its attention
into blocks, and the blocks a calibration keeps, given as data (CPU, interpret mode).

    python examples/paro_calibrated.py [--seed N] [--density D]

PAROAttention (Zhao et al., 2025) reorders each head's tokens into one of the six orders of
(frame, row, column), so that its attention falls into few blocks, and keeps per head the
blocks an offline calibration found important. This script does both on a small video whose
heads are planted (each head's queries and keys read mostly one of the frame, row or column
codes of the tokens, so that it attends along that axis):

1. calibration, per head, from its sampled attention map: in each order, the map averaged
   over blocks of BLOCK x BLOCK tokens; the order whose top `density` of blocks hold the most
   attention wins (ties: the first of ORDERS);
2. the head's block mask: in its order, the top `density` of blocks by attention, and the
   diagonal block of every block row (a query is never left without keys);
3. paro_masks.npz ([heads, n, n]) and a spec with one pattern per head, `blocks: {file, block,
   head}`, each head in its order (`layout: {order: [...]}`);
4. svgen compiles the spec and runs the kernel (interpret mode), which is compared with
   attention under the mask built here from the order and the blocks alone, in the user's
   token order, in float64.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
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
BLOCK = 32  # tokens per block side: 16 x 16 blocks
HEAD_DIM = 128
AXES = {"f": FRAMES, "h": HEIGHT, "w": WIDTH}
ORDERS = [list(p) for p in itertools.permutations("fhw")]  # slowest axis first
PLANTED = ["f", "h", "w", "f"]  # what each head's queries and keys read


def kernel_positions(order: list[str]) -> np.ndarray:
    """int [seq]: each user token's (frame-major) position in `order`, the slowest axis
    first: written here from the definition, not from svgen's layouts."""
    f, h, w = np.meshgrid(np.arange(FRAMES), np.arange(HEIGHT), np.arange(WIDTH), indexing="ij")
    coord = {"f": f.ravel(), "h": h.ravel(), "w": w.ravel()}
    a, b, c = order
    return (coord[a] * AXES[b] + coord[b]) * AXES[c] + coord[c]


def planted_inputs(seed: int):
    """q, k, v float32 [heads, seq, d] in the user's order; head j reads PLANTED[j]'s codes."""
    rng = np.random.default_rng(seed)
    f, h, w = (x.ravel() for x in np.meshgrid(*map(np.arange, AXES.values()), indexing="ij"))
    index = {"f": f, "h": h, "w": w}
    shape = (len(PLANTED), FRAMES * HEIGHT * WIDTH, HEAD_DIM)
    q, k = np.empty(shape, np.float32), np.empty(shape, np.float32)
    for head, axis in enumerate(PLANTED):
        code = rng.standard_normal((AXES[axis], HEAD_DIM)) / np.sqrt(HEAD_DIM) * 4.0
        q[head] = code[index[axis]] + 0.3 * rng.standard_normal(shape[1:]) / np.sqrt(HEAD_DIM)
        k[head] = code[index[axis]] + 0.3 * rng.standard_normal(shape[1:]) / np.sqrt(HEAD_DIM)
    v = rng.standard_normal(shape).astype(np.float32)
    return q, k, v


def attention_map(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def block_means(p_user: np.ndarray, order: list[str]) -> np.ndarray:
    """The attention map in `order`, averaged over BLOCK x BLOCK blocks."""
    permuted = np.empty_like(p_user)
    pos = kernel_positions(order)
    permuted[np.ix_(pos, pos)] = p_user
    n = permuted.shape[0] // BLOCK
    return permuted.reshape(n, BLOCK, n, BLOCK).mean(axis=(1, 3))


def top_blocks(means: np.ndarray, density: float) -> np.ndarray:
    """bool [n, n]: the top `density` of blocks by mean attention, with the diagonal."""
    keep = np.zeros(means.size, bool)
    keep[np.argsort(-means.ravel(), kind="stable")[: max(1, round(density * means.size))]] = True
    keep = keep.reshape(means.shape)
    np.fill_diagonal(keep, True)
    return keep


def calibrate(q: np.ndarray, k: np.ndarray, density: float):
    """Per head: (its order, its block mask, the attention its kept blocks hold)."""
    chosen = []
    for head in range(q.shape[0]):
        p = attention_map(q[head], k[head])
        best = None
        for order in ORDERS:
            means = block_means(p, order)
            mass = float(np.sort(means.ravel())[::-1][: round(density * means.size)].sum())
            if best is None or mass > best[0] + 1e-12:
                best = (mass, order, means)
        _, order, means = best
        keep = top_blocks(means, density)
        chosen.append((order, keep, float((means * keep).sum() / means.sum())))
    return chosen


def spec_text(chosen, masks_file: str) -> str:
    patterns = "\n".join(
        f"  head{j}: {{blocks: {{file: {masks_file}, block: {BLOCK}, head: {j}}}}}"
        for j in range(len(chosen))
    )
    candidates = "\n".join(
        f"    - {{pattern: head{j}, layout: {{order: [{', '.join(order)}]}}}}"
        for j, (order, _, _) in enumerate(chosen)
    )
    names = ", ".join(f"head{j}" for j in range(len(chosen)))
    return f"""svgen: 1
name: paro_calibrated
geometry: {{frames: {FRAMES}, height: {HEIGHT}, width: {WIDTH}}}
attention: {{heads: {len(chosen)}, head_dim: {HEAD_DIM}, dtype: float32}}
patterns:
{patterns}
heads:
  candidates:
{candidates}
  assign: [{names}]
tiling: {{block_q: 128, block_kv: 128}}
"""


def reference(q, k, v, order, keep) -> np.ndarray:
    """float64 attention of one head under its block mask, in the user's order."""
    pos = kernel_positions(order)
    mask = keep[pos[:, None] // BLOCK, pos[None, :] // BLOCK]
    s = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


def run(seed: int = 0, density: float = 0.2, verbose: bool = True) -> dict:
    libtpu_env.prepare()
    q, k, v = planted_inputs(seed)
    chosen = calibrate(q, k, density)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        np.savez(folder / "paro_masks.npz", masks=np.stack([keep for _, keep, _ in chosen]))
        text = spec_text(chosen, "paro_masks.npz")
        (folder / "paro_calibrated.yaml").write_text(text)
        plan = analyze(parse_spec(text, source=str(folder / "paro_calibrated.yaml")))
        for name, data in codegen.render(plan, "paro_calibrated.yaml").items():
            (folder / name).write_bytes(data)
        spec = importlib.util.spec_from_file_location(
            "paro_calibrated", folder / "paro_calibrated.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = np.asarray(
            module.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), interpret=True)
        )
    rows = []
    for head, (order, keep, captured) in enumerate(chosen):
        want = reference(q[head], k[head], v[head], order, keep)
        error = float(np.max(np.abs(out[head] - want)) / np.max(np.abs(want)))
        rows.append(
            {
                "head": head,
                "planted": PLANTED[head],
                "order": "".join(order),
                "kept_blocks": float(keep.mean()),
                "attention_kept": captured,
                "error": error,
            }
        )
        if verbose:
            print(
                f"head {head}: planted {PLANTED[head]}, order [{', '.join(order)}], "
                f"{keep.mean():.1%} of blocks hold {captured:.1%} of its attention, "
                f"kernel vs float64 {error:.1e}"
            )
    return {"rows": rows, "spec": text}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--density", type=float, default=0.2)
    args = parser.parse_args(argv)
    run(args.seed, args.density)
    return 0


if __name__ == "__main__":
    sys.exit(main())
