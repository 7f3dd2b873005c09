"""A rolling KV cache's slot map (kv_cache: {sink_frames, window_frames}), in plain integer
arithmetic: the compiler's analysis (NumPy, no JAX: svgen.analysis.chunks) and the kernels'
per-call scalars (traced under jit: svgen.runtime.chunks) use this one definition."""

from __future__ import annotations

import numpy as np


def ring_shifts(position, chunk: int, sink: int, window: int, frame_tokens: int, xp=np):
    """(wrap, before, after) of a rolling cache at a chunk position, in tokens; position an
    int (xp = numpy) or a traced int32 (xp = jax.numpy).

    The convention (README, "Rolling cache"): frame a < sink lives in slot a; frame a >=
    sink in ring slot sink + (a - sink) mod window, written there when it is generated, so
    after the chunk at frame f = position * chunk is written, ring slot sink + j holds the
    latest frame sink + j + window * m that is at most f + chunk - 1. With L = f + chunk - 1
    - sink (the newest frame's ring index, clamped at 0 while the chunk is still in the
    sink), m is K = L // window for j <= L mod window and K - 1 after: slots [sink, wrap)
    shift by window * K frames, slots [wrap, sink + window) by window * (K - 1). While the
    ring has not filled up (K = 0), the slots past the newest frame hold no frame yet: they
    read as frames after the chunk, which block-causality never attends (the shift is 0, not
    negative)."""
    newest = xp.maximum(position * chunk + chunk - 1 - sink, 0)
    if xp is np:
        laps, slot = newest // window, newest % window
    else:  # lax.div / lax.rem of a non-negative value: what lowers for TPU from any host
        from jax import lax

        laps, slot = lax.div(newest, np.int32(window)), lax.rem(newest, np.int32(window))
    wrap = (sink + slot + 1) * frame_tokens
    before = window * laps * frame_tokens
    after = window * xp.maximum(laps - 1, 0) * frame_tokens
    return wrap, before, after
