"""Online head profiling: pick each head's pattern from a few sampled query rows.

Sparse VideoGen's rule: sample query rows, compute their exact attention output over all keys
and their output under each candidate pattern's mask, and give each head the pattern with the
least mean squared error. Everything is jnp and jit-compatible (`key` and the inputs may be
traced); the result feeds `attention(..., head_pattern=...)` without recompiling.

Cost per head: num_queries x seq_len scores, once dense and once per pattern (plus the same
for P @ V): at 64 queries and 75,600 keys, 4.8M scores per pattern and head, about 0.1% of the
full attention's 5.7G. Masks are evaluated on the sampled rows only, from coordinates.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from svgen.runtime import coords
from svgen.core.tables import Pattern


def _masked_softmax_output(scores, keep, v):
    """softmax over keys where keep, times v; rows with no allowed key give 0."""
    scores = jnp.where(keep, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    probs = jnp.where(keep, jnp.exp(scores - row_max), 0.0)
    denom = jnp.sum(probs, axis=-1, keepdims=True)
    probs = probs / jnp.where(denom > 0, denom, 1.0)
    return jnp.einsum("...qk,...kd->...qd", probs, v)


def pattern_errors(q, k, v, patterns: Sequence[Pattern], *, key, num_queries: int = 64):
    """Mean squared error of each pattern's output on sampled rows: float32 [patterns, heads]."""
    if not isinstance(num_queries, int) or num_queries < 1:
        raise ValueError(f"num_queries must be a positive integer, got {num_queries!r}")
    seq_len, head_dim = q.shape[-2], q.shape[-1]
    rows = jax.random.randint(key, (num_queries,), 0, seq_len)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    sampled = jnp.take(q32, rows, axis=-2)  # [..., heads, num_queries, d]
    scores = jnp.einsum("...qd,...kd->...qk", sampled, k32) / jnp.sqrt(jnp.float32(head_dim))
    exact = _masked_softmax_output(scores, True, v32)
    errors = []
    for pattern in patterns:
        position = jnp.asarray(pattern.layout.kernel_position)  # user index -> kernel position
        keep = coords.keep(
            pattern.boundary_mask,
            pattern.layout,
            position[rows][:, None],
            position[None, :],
            pattern.block_tables,
        )
        approx = _masked_softmax_output(scores, keep, v32)
        err = jnp.mean((approx - exact) ** 2, axis=(-2, -1))  # [..., heads]
        errors.append(err.reshape((-1,) + err.shape[-1:]).mean(axis=0))  # over the batch
    return jnp.stack(errors)


def profile(q, k, v, patterns: Sequence[Pattern], *, key, num_queries: int = 64):
    """int32 [heads]: for each head, the index of the pattern with the least error."""
    return jnp.argmin(
        pattern_errors(q, k, v, patterns, key=key, num_queries=num_queries), axis=0
    ).astype(jnp.int32)
