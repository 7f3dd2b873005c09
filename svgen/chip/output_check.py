"""What `svgen bench` checks a kernel's output against: a float32 reference of the sampled
query rows, computed on the same device from the IR oracle (svgen.ir), not from the printed
mask code both svgen's and Splash's kernels run; the largest error accepted per dtype; and,
for int8 QK^T, svgen.chip.int8_error's cosine and relative L1 on two input kinds."""

from __future__ import annotations

import numpy as np

from svgen.chip import int8_error

#: Largest |svgen - reference| accepted on a sampled row (outputs are convex combinations of
#: v's rows; bf16 rounding of p and o stays well below this on normal inputs).
TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-4}
#: The same for int8 QK^T (attention.qk: int8), whose error is mostly its scores' rounding;
#: its bounds are svgen.chip.int8_error's, on cosine similarity and relative L1.
INT8_TOLERANCE = 5e-2


def sampled_rows(seq_len: int, count: int, seed: int) -> np.ndarray:
    """`count` distinct query positions, the first and last among them, sorted."""
    rng = np.random.default_rng(seed + 1)
    count = min(count, seq_len)
    inner = rng.choice(np.arange(1, seq_len - 1), size=max(0, count - 2), replace=False)
    return np.unique(np.concatenate([[0, seq_len - 1], inner]).astype(np.int64))


def reference_rows(plan, assignment, q, k, v, rows: np.ndarray):
    """float32 [heads, len(rows), head_dim] on q's device: the masked softmax of the sampled
    rows, each head's mask from the IR oracle in its pattern's kernel order, or for an aligned
    pattern (tiling.align) the rounded mask its compute-block kinds say, the one its kernel
    runs (rows without a kept key are 0, as svgen's kernel makes them)."""
    import jax.numpy as jnp

    seq = q.shape[-2]
    scale = 1.0 / np.sqrt(q.shape[-1])
    keeps = {}
    out = []
    for head, p in enumerate(assignment):
        if p not in keeps:
            keeps[p] = jnp.asarray(_reference_keep(plan.patterns[p], rows, seq))
        keep = keeps[p]
        qh = q[head, rows].astype(jnp.float32)
        s = (qh @ k[head].astype(jnp.float32).T) * scale
        s = jnp.where(keep, s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        e = jnp.where(keep, jnp.exp(s - m), 0.0)
        denom = jnp.sum(e, axis=-1, keepdims=True)
        p_ = e / jnp.where(denom > 0, denom, 1.0)
        out.append(p_ @ v[head].astype(jnp.float32))
    return jnp.stack(out)


def _reference_keep(pattern, rows: np.ndarray, seq: int) -> np.ndarray:
    """bool [len(rows), seq]: the pattern's mask on the sampled rows, kernel order."""
    from svgen.chip import splash_mask

    keys = np.arange(seq)
    if pattern.budget is not None:  # aligned: whole compute blocks kept or dropped
        keep = splash_mask.aligned_keep(pattern)
        return np.asarray(keep(rows.reshape(-1, 1), keys.reshape(1, -1)))
    qc = pattern.layout.coordinates(rows).reshape(-1, 1)
    kc = pattern.layout.coordinates(keys).reshape(1, -1)
    return np.broadcast_to(pattern.mask.evaluate(qc, kc), (len(rows), seq))


def int8_errors(module, plan, assignment, forward, rows: np.ndarray, options) -> dict:
    """svgen.chip.int8_error's cosine and relative L1 of an int8 module's `forward` on both
    input kinds, against this module's float32 reference on the sampled rows (options: its
    seed, chip_bench.Options')."""

    def reference(q, k, v):
        return reference_rows(plan, assignment, q, k, v, rows)

    shape = (int(module.HEADS), int(module.SEQ_LEN), int(module.HEAD_DIM))
    return int8_error.int8_errors(forward, reference, shape, module.DTYPE, rows, options.seed)


def tolerance(module) -> float:
    """The largest max_error accepted of a module's output (its dtype's, or int8 QK^T's)."""
    return INT8_TOLERANCE if module.SHAPE.qk_int8 else TOLERANCE[str(module.DTYPE)]


def max_error(out, reference, rows: np.ndarray) -> float:
    """max |out[:, rows] - reference| (inf when anything is not finite)."""
    import jax.numpy as jnp

    got = jnp.asarray(out)[:, rows].astype(jnp.float32)
    err = jnp.max(jnp.abs(got - reference))
    finite = bool(jnp.all(jnp.isfinite(got)))
    return float(err) if finite else float("inf")
