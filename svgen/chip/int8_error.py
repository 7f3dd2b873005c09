"""The error of int8 QK^T (the spec's `attention.qk: int8`, svgen.runtime.quantize) against a
float32 reference: what `svgen bench` reports for an int8 spec, and what
tests/test_int8_qk.py holds in interpret mode.

Two kinds of inputs, q, k, v [heads, seq, head_dim] in the module's dtype:

* "normal": q, k, v standard normal;
* "key_outliers": q and v normal, k normal plus an offset shared by every key: KEY_OFFSET on
  every channel and KEY_OUTLIER more on every OUTLIER_STRIDE-th channel, the keys' channel
  outliers SageAttention measured in video models. The offset moves every score of a row by
  the same amount (the softmax does not see it), but without the smoothing it sets k's int8
  scale, and the keys' own variation is left a few levels of it.

Per kind, on the sampled rows of every head (svgen.chip.chip_bench.sampled_rows, the same
float32 reference `svgen bench` checks against: chip_bench.reference_rows): the cosine
similarity of the output with the reference, and the relative L1 error, sum |o - ref| /
sum |ref|, over all of those rows and heads. Bounds (issue 61): cosine >= COSINE_MIN and
relative L1 <= REL_L1_MAX on both kinds.
"""

from __future__ import annotations

import numpy as np

INPUT_KINDS = ("normal", "key_outliers")
COSINE_MIN = 0.9995
REL_L1_MAX = 0.02
KEY_OFFSET = 2.0
KEY_OUTLIER = 20.0
OUTLIER_STRIDE = 16


def error_inputs(shape: tuple[int, int, int], dtype, seed: int, kind: str):
    """q, k, v of `shape` [heads, seq, head_dim] in `dtype`, of the input kind `kind`."""
    import jax
    import jax.numpy as jnp

    if kind not in INPUT_KINDS:
        raise ValueError(f"input kind {kind!r}: one of {', '.join(INPUT_KINDS)}")
    keys = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32) for key in keys)
    if kind == "key_outliers":
        channel = jnp.arange(shape[-1])
        k = k + KEY_OFFSET + KEY_OUTLIER * (channel % OUTLIER_STRIDE == 0)
    return tuple(x.astype(dtype) for x in (q, k, v))


def output_error(got, reference) -> dict:
    """{"cosine", "rel_l1"} of `got` against `reference` (arrays of one shape), in float64."""
    a = np.asarray(got, np.float64).ravel()
    b = np.asarray(reference, np.float64).ravel()
    if not np.all(np.isfinite(a)):
        return {"cosine": float("nan"), "rel_l1": float("inf")}
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    cosine = float(a @ b / norms) if norms > 0 else float(np.array_equal(a, b))
    rel_l1 = float(np.sum(np.abs(a - b)) / max(np.sum(np.abs(b)), np.finfo(float).tiny))
    return {"cosine": cosine, "rel_l1": rel_l1}


def within_bounds(error: dict) -> bool:
    """The issue's bounds on one kind's error (NaN fails)."""
    return bool(error["cosine"] >= COSINE_MIN and error["rel_l1"] <= REL_L1_MAX)


def int8_errors(forward, reference, shape, dtype, rows: np.ndarray, seed: int) -> dict:
    """{kind: {"cosine", "rel_l1", "ok"}} of `forward` (q, k, v [heads, seq, head_dim] of
    `shape` and `dtype`, in kernel order -> o, as `svgen bench` times it) against
    `reference` (q, k, v -> float32 [heads, len(rows), head_dim]: chip_bench.reference_rows)
    on the sampled `rows`, for every input kind; "ok": within COSINE_MIN and REL_L1_MAX."""
    import jax.numpy as jnp

    out = {}
    for kind in INPUT_KINDS:
        q, k, v = error_inputs(shape, dtype, seed, kind)
        expected = reference(q, k, v)
        got = jnp.asarray(forward(q, k, v))[:, rows].astype(jnp.float32)
        error = output_error(got, expected)
        out[kind] = {**error, "ok": within_bounds(error)}
    return out


def error_words(errors: dict) -> str:
    """One line of the table: per kind, cosine and relative L1, FAIL past a bound."""
    return "; ".join(
        f"{kind} cos {e['cosine']:.5f} L1 {e['rel_l1']:.4f}{'' if e['ok'] else ' FAIL'}"
        for kind, e in errors.items()
    )
