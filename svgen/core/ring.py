"""A rolling KV cache (kv_cache: {chunk_frames, sink_frames, window_frames}) and its slot map,
in plain integer arithmetic: the compiler's analysis (NumPy, no JAX: svgen.analysis.chunks)
and the kernels' per-call scalars and masked blocks (traced: svgen.runtime.chunks) use this
one definition.

The convention (docs/runtime.md, "Rolling cache"): frame a < sink lives in slot a; frame a >= sink in
ring slot sink + (a - sink) mod window, written there when it is generated. After the chunk
at frame f = position * chunk is written, ring slot sink + j holds the latest frame
sink + j + window * m that is at most f + chunk - 1. With L = f + chunk - 1 - sink (the
newest frame's ring index, clamped at 0 while the chunk is still in the sink), m is
K = L // window for j <= L mod window and K - 1 after: slots [sink, wrap) hold their frame
shifted by window * K, slots [wrap, sink + window) by window * (K - 1). While the ring has
not filled up (K = 0), the slots past the newest frame hold no frame yet: they read as
frames after the chunk, which block-causality never attends (the shift is 0, not negative).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RingCache:
    chunk_frames: int
    sink_frames: int
    window_frames: int

    @property
    def cache_frames(self) -> int:
        return self.sink_frames + self.window_frames

    def shifts(self, position, frame_tokens: int, xp=np, divmod_=None):
        """(wrap, before, after) in tokens at a chunk position (an int with xp = numpy, or a
        traced int32 with xp = jax.numpy and divmod_ the kernel's division: (a, b) ->
        (lax.div, lax.rem), what lowers for TPU from any host): cache token p holds video
        token p below the sink's end, p + before below wrap, p + after from there
        (`slot_to_video`)."""
        chunk, sink, window = self.chunk_frames, self.sink_frames, self.window_frames
        newest = xp.maximum(position * chunk + chunk - 1 - sink, 0)
        if divmod_ is None:
            laps, slot = newest // window, newest % window
        else:  # of a non-negative value
            laps, slot = divmod_(newest, np.int32(window))
        wrap = (sink + slot + 1) * frame_tokens
        before = window * laps * frame_tokens
        after = window * xp.maximum(laps - 1, 0) * frame_tokens
        return wrap, before, after

    def key_runs(self, position: int, frame_tokens: int) -> list[tuple[int, int, int]]:
        """(first, end, shift): the cache's key runs at a chunk position, each holding video
        keys first + shift .. end + shift (the sink, the ring up to its wrap, the rest)."""
        wrap, before, after = (int(x) for x in self.shifts(position, frame_tokens))
        sink, end = self.sink_frames * frame_tokens, self.cache_frames * frame_tokens
        runs = [(0, sink, 0), (sink, wrap, before), (wrap, end, after)]
        return [r for r in runs if r[1] > r[0]]


def slot_to_video(pos, sink: int, wrap, before, after, xp=np):
    """Video positions of cache positions `pos` (any int array; the sink's end in the same
    unit, and `RingCache.shifts`'s scalars)."""
    return pos + xp.where(pos < sink, 0, xp.where(pos < wrap, before, after))
