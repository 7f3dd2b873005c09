"""Dense masked attention in float64: the numerical reference for every kernel test."""

from __future__ import annotations

import numpy as np


def masked_attention_reference(q, k, v, keep, sm_scale=None) -> np.ndarray:
    """softmax(q k^T * scale, masked by keep[q, k]) v over the last two axes; rows with no
    allowed key are 0. q, k, v: [..., seq, head_dim]; keep: bool [seq, seq]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if sm_scale is None:
        sm_scale = 1.0 / np.sqrt(q.shape[-1])
    scores = np.einsum("...qd,...kd->...qk", q, k) * sm_scale
    scores = np.where(keep, scores, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    probs = np.where(keep, np.exp(scores - row_max), 0.0)
    denom = probs.sum(axis=-1, keepdims=True)
    probs = probs / np.where(denom > 0, denom, 1.0)
    return np.einsum("...qk,...kd->...qd", probs, v)
