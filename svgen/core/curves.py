"""Space-filling curves over a frame: the order of a curve layout's places (`layout: {curve:
hilbert}`, svgen.core.layout). NumPy only.

A curve layout keeps the frames in order and walks each frame's places along a curve, so that
a run of consecutive kernel positions (a compute block, a selection's block) covers a compact
patch of the frame instead of a strip of whole rows: the setting of Jenga's block carving,
where the blocks a query selects by pooled scores should be regions, not bands.

  hilbert   places sorted by their index along the Hilbert curve of the smallest power-of-two
            square holding the frame (x = column, y = row). On a square frame whose side is a
            power of two, consecutive places are always neighbours (one row or one column
            apart); on any other frame the order skips the square's cells outside it, so it
            jumps where the curve leaves the frame and comes back.
  morton    places sorted by their Z-order code: the bits of row and column interleaved, the
            column's in the even positions (the lowest). Cheaper to state, with larger jumps
            than Hilbert's at every power-of-two boundary.

Over the whole video (`layout: {curve: hilbert, over: video}`) the same curves run in three
dimensions, (column, row, frame), on the smallest power-of-two cube holding the video: a run of
positions is then a small box of places and frames, and a frame is no longer one run.

All are pure functions of the curve and the sizes (one n-dimensional construction of each,
frames or not): the generated module names its layout's curve and the digest of the resulting
order (TokenLayout.curve_digest), which its import checks.
"""

from __future__ import annotations

import functools

import numpy as np

HILBERT = "hilbert"
MORTON = "morton"
CURVES = (HILBERT, MORTON)
# What a curve orders: each frame's places (frames in order), or the whole video.
FRAME, VIDEO = "frame", "video"
CURVE_SCOPES = (FRAME, VIDEO)


@functools.cache
def curve_places(kind: str, height: int, width: int) -> np.ndarray:
    """int64 [height * width], read-only: the place (row * width + column) at each position of
    the frame's curve order."""
    rows, cols = np.divmod(np.arange(height * width, dtype=np.int64), width)
    return _sorted_along(kind, (cols, rows), max(height, width))


@functools.cache
def video_curve_order(kind: str, frames: int, height: int, width: int) -> np.ndarray:
    """int64 [frames * height * width], read-only: the video index (f * H * W + h * W + w) at
    each position of the whole video's curve order (a curve over the frames too: neighbours in
    time are as near as neighbours in space)."""
    index = np.arange(frames * height * width, dtype=np.int64)
    f, place = np.divmod(index, height * width)
    h, w = np.divmod(place, width)
    return _sorted_along(kind, (w, h, f), max(frames, height, width))


def _sorted_along(kind: str, axes, longest: int) -> np.ndarray:
    """The indices of the points (axes: coordinate arrays, the column first) in the order of
    the `kind` curve over the smallest power-of-two square or cube holding `longest` per
    side. Every key is distinct (each curve is a bijection of that cube): the sort is exact."""
    if kind not in CURVES:
        raise ValueError(f"unknown curve {kind!r}; known: {', '.join(CURVES)}")
    bits = max(int(longest - 1).bit_length(), 1)
    key = hilbert_index(axes, bits) if kind == HILBERT else morton_code(axes, bits)
    order = np.argsort(key, kind="stable")
    order.flags.writeable = False
    return order


def hilbert_index(axes, bits: int) -> np.ndarray:
    """The index of each point along the n-dimensional Hilbert curve over a cube of side
    2**bits (axes: n coordinate arrays, the first the fastest-varying at the finest level).
    The coordinates are turned, level by level from the coarsest, into the curve's own frame
    (a reflection of the lower bits where a bit is set, else an exchange of the lower bits
    with the first axis), then Gray-decoded; the index is their bits interleaved, coarsest
    first (J. Skilling's construction, AIP Conf. Proc. 707, 2004)."""
    x = [np.array(a, np.int64) for a in axes]
    n = len(x)
    top = 1 << (bits - 1)
    q = top
    while q > 1:
        low = q - 1
        for i in range(n):
            set_here = (x[i] & q) != 0
            swap = (x[0] ^ x[i]) & low
            x[0] = np.where(set_here, x[0] ^ low, x[0] ^ swap)
            if i:
                x[i] = np.where(set_here, x[i], x[i] ^ swap)
        q >>= 1
    for i in range(1, n):  # Gray code
        x[i] = x[i] ^ x[i - 1]
    flip = np.zeros_like(x[0])
    q = top
    while q > 1:
        flip = np.where((x[n - 1] & q) != 0, flip ^ (q - 1), flip)
        q >>= 1
    x = [a ^ flip for a in x]
    index = np.zeros_like(x[0])
    for bit in range(bits - 1, -1, -1):
        for i in range(n):
            index = (index << 1) | ((x[i] >> bit) & 1)
    return index


def morton_code(axes, bits: int) -> np.ndarray:
    """Z-order codes of n axes: bit b of axis i at bit n * b + i (the first axis lowest)."""
    x = [np.asarray(a, np.int64) for a in axes]
    code = np.zeros(np.broadcast(*x).shape, np.int64)
    for bit in range(bits):
        for i, a in enumerate(x):
            code |= ((a >> bit) & 1) << (len(x) * bit + i)
    return code
