"""Per-video frame numbering of packed segments at run time (`runtime.per_video_frames`).

What a call means: a video segment's tokens see frame f - s, s being the segment's first
frame; text tokens keep frame 0; positions, rows and columns stay the packed sequence's.
A video segment is whole frames of the geometry's height x width, any number of them, in
any frames of the sequence (concrete ids that cut a frame are refused before the call).

Finding s on device (`segment_starts`): per frame, the least and greatest non-negative id of
its video tokens; segment x starts at the first frame whose [least, greatest] holds x (0 when
no frame does: a text-only segment). With whole-frame segments that is exactly x's first
frame. With traced ids that cut frames it is still one start per id and never past any of
x's frames, so frames stay >= 0 and both tokens of a kept pair shift alike: the tables below
stay sound and the kernels evaluate the mask at those frame numbers (tested).

Tables (`VideoKinds`): the compiler gives a pattern's superset (the union of its mask over
every start) and a frame tree of invariant groups and anchored leaves
(svgen.analysis.video_frames). A compute block inside one segment gets the kind of the mask
at that segment's start: groups keep their compile-time kinds, first_frame and block_causal
get closed forms from the block's frame ranges, unions take the greatest kind and
intersections the least (EMPTY < BOUNDARY < FULL), capped by the superset's kind (padding
keys). A BOUNDARY block there runs as SEGMENT_BOUNDARY: its mask needs the shifted frames,
which the kernels read next to the ids (`ShiftedFrames`).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import lax

from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.runtime.refine import StaticVisits
from svgen.core.tables import BITS_PER_BLOCK, KIND_MASK

_INT32_MAX = np.iinfo(np.int32).max
_INT32_MIN = np.iinfo(np.int32).min


@dataclasses.dataclass(frozen=True, eq=False)
class VideoFrames:
    """A pattern's per-video numbering, as a generated module gives it: its superset's runs,
    each invariant group's runs at the same tiles, and the frame tree (("any_of" |
    "all_of", ...), ("group", j), ("first_frame", n), ("block_causal", n))."""

    runs: object
    group_runs: tuple
    tree: tuple


def segment_starts(ids, layout: TokenLayout):
    """(start, shift), int32 [batch, seq] in the user's order, of ids int32 [batch, seq]
    (negative: padding): each token's segment start s (text tokens too: a text query's
    first_frame reads its video's), and the frame shift the kernels subtract (s on video
    tokens, 0 on text and padding). See the module docstring."""
    frames, per_frame = layout.frames, layout.tokens_per_frame
    video = ids[:, layout.video_start : layout.video_start + frames * per_frame]
    video = video.reshape(ids.shape[0], frames, per_frame)
    real = video >= 0
    lo = jnp.min(jnp.where(real, video, _INT32_MAX), axis=-1)[:, None, :]  # [batch, 1, F]
    hi = jnp.max(jnp.where(real, video, _INT32_MIN), axis=-1)[:, None, :]
    x = ids[:, :, None]
    first = jnp.min(
        jnp.where((lo <= x) & (x <= hi), jnp.arange(frames, dtype=jnp.int32), frames), axis=-1
    )
    start = jnp.where((ids >= 0) & (first < frames), first, 0).astype(jnp.int32)
    position = np.arange(layout.seq_len) - layout.video_start
    is_video = jnp.asarray((position >= 0) & (position < layout.video_tokens))
    return start, jnp.where(is_video, start, 0).astype(jnp.int32)


def check_whole_frames(segment_ids, layout: TokenLayout) -> None:
    """Concrete ids: every frame's video tokens of one segment (or padding), else ValueError
    naming the first frame that mixes two."""
    ids = np.asarray(segment_ids).reshape(-1, layout.seq_len)
    video = ids[:, layout.video_start : layout.video_start + layout.video_tokens]
    video = video.reshape(ids.shape[0], layout.frames, layout.tokens_per_frame)
    real = video >= 0
    lo = np.where(real, video, _INT32_MAX).min(-1)
    hi = np.where(real, video, _INT32_MIN).max(-1)
    mixed = np.argwhere(real.any(-1) & (lo != hi))
    if len(mixed):
        b, f = (int(x) for x in mixed[0])
        where = f"batch element {b}, " if ids.shape[0] > 1 else ""
        raise ValueError(
            f"segment_ids: {where}frame {f}'s video tokens belong to segments {lo[b, f]} and "
            f"{hi[b, f]}; with runtime.per_video_frames a video segment is whole frames "
            f"({layout.height} x {layout.width} tokens each)"
        )


@dataclasses.dataclass(frozen=True)
class FrameBlocks:
    """Per compute block of `block` tokens in a layout's kernel order (NumPy): the least and
    greatest frame of its real video tokens, and whether it holds any / only real video."""

    lo: np.ndarray
    hi: np.ndarray
    has_video: np.ndarray
    all_video: np.ndarray

    @classmethod
    def of(cls, layout: TokenLayout, block: int, num_blocks: int) -> "FrameBlocks":
        pos = np.arange(num_blocks * block)
        coords = layout.coordinates(np.minimum(pos, layout.seq_len - 1))
        real = pos < layout.seq_len
        video = (real & ~coords.is_text).reshape(num_blocks, block)
        frame = coords.frame.reshape(num_blocks, block)
        return cls(
            np.where(video, frame, _INT32_MAX).min(1).astype(np.int32),
            np.where(video, frame, -1).max(1).astype(np.int32),
            video.any(1),
            (video | ~real.reshape(num_blocks, block)).all(1) & video.any(1),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class VideoKinds:
    """One pattern's per-video refinement for one walk (forward, or the transposed dk/dv
    walk whose rows are keys): the groups' words aligned with the superset's visits, the
    frame tree and the frame ranges of the walk's block rows and columns."""

    group_words: np.ndarray  # int32 [groups, V]
    tree: tuple
    rows: FrameBlocks
    cols: FrameBlocks
    rows_are_queries: bool

    @classmethod
    def build(cls, visits: StaticVisits, group_runs, tree, rows, cols, rows_are_queries):
        """group_runs: each group's runs in the walk's own orientation."""
        rq, rk = visits.q_blocks_per_tile, visits.kv_blocks_per_tile
        words = [_aligned_words(visits, StaticVisits.from_runs(r, rq, rk)) for r in group_runs]
        stacked = np.stack(words) if words else np.zeros((0, visits.num_visits), np.int32)
        return cls(stacked, tree, rows, cols, rows_are_queries)

    def kinds(self, visits: StaticVisits, start_lo, start_hi) -> jnp.ndarray:
        """int32 [V, rq, rk]: each visited block's kind for segment starts in [start_lo,
        start_hi] (int32, broadcast to [V, rq, rk]): sound for every pair of the block whose
        segment starts there. A block inside one segment has start_lo == start_hi, its
        segment's start, and gets the kind at it; a block across segments gets the range of
        the starts its rows and columns share (only its EMPTY verdict is used)."""
        start = (start_lo, start_hi)
        rq, rk = visits.q_blocks_per_tile, visits.kv_blocks_per_tile
        row_index = visits.q_tile[:, None] * rq + np.arange(rq)
        col_index = visits.kv_tile[:, None] * rk + np.arange(rk)
        shifts = BITS_PER_BLOCK * np.arange(rq * rk).reshape(rq, rk)

        def side(blocks: FrameBlocks, index, axis: int):
            fields = (blocks.lo, blocks.hi, blocks.has_video, blocks.all_video)
            return tuple(_expand(values[index], axis) for values in fields)

        row, col = side(self.rows, row_index, 1), side(self.cols, col_index, 2)
        query, key = (row, col) if self.rows_are_queries else (col, row)

        def group(j: int):
            words = self.group_words[j].view(np.uint32)[:, None, None]
            return jnp.asarray(((words >> shifts) & KIND_MASK).astype(np.int32))

        def leaf(node):
            op = node[0]
            if op == "group":
                return group(node[1])
            if op == "first_frame":
                return _first_frame(node[1], key, start)
            if op == "block_causal":
                return _block_causal(node[1], query, key, start)
            kinds = [leaf(c) for c in node[1:]]
            combine = jnp.maximum if op == "any_of" else jnp.minimum
            out = kinds[0]
            for k in kinds[1:]:
                out = combine(out, k)
            return out

        return jnp.broadcast_to(leaf(self.tree), (visits.num_visits, rq, rk))


def _expand(values: np.ndarray, axis: int):
    """[V, r] per-block values as [V, r, 1] (axis 1: block rows) or [V, 1, r] (columns)."""
    values = jnp.asarray(values)
    return values[:, :, None] if axis == 1 else values[:, None, :]


def _kind(full, empty):
    return jnp.where(full, TileKind.FULL, jnp.where(empty, TileKind.EMPTY, TileKind.BOUNDARY))


def _first_frame(n: int, key, start):
    """Video keys of frames < s + n (any query), for every s in start = (lo, hi)."""
    lo, hi, has_video, all_video = key
    s_lo, s_hi = start
    full = all_video & (hi - s_lo < n)
    return _kind(full, ~has_video | (lo - s_hi >= n)).astype(jnp.int32)


def _block_causal(n: int, query, key, start):
    """Video pairs with (f_k - s) // n <= (f_q - s) // n, for every s in start = (lo, hi):
    at one start in closed form (a pair's frames are >= its segment's start, so clamping
    another segment's frames at s only widens the ranges), over several only the sure
    EMPTY of keys n or more frames after every query."""
    q_lo, q_hi, q_has, q_all = query
    k_lo, k_hi, k_has, k_all = key
    s_lo, s_hi = start
    one = s_lo == s_hi

    def chunk(frame):
        return lax.div(jnp.maximum(frame - s_lo, 0), jnp.int32(n))

    full = one & q_all & k_all & (chunk(k_hi) <= chunk(q_lo))
    empty = ~q_has | ~k_has | (one & (chunk(k_lo) > chunk(q_hi))) | (k_lo - q_hi >= n)
    return _kind(full, empty).astype(jnp.int32)


def _aligned_words(visits: StaticVisits, group: StaticVisits) -> np.ndarray:
    """The group's word at each of `visits`' tiles (0, every block EMPTY, where the group
    visits nothing)."""
    width = int(max(visits.kv_tile.max(initial=0), group.kv_tile.max(initial=0))) + 1
    want = visits.q_tile.astype(np.int64) * width + visits.kv_tile
    have = group.q_tile.astype(np.int64) * width + group.kv_tile
    at = np.minimum(np.searchsorted(have, want), max(len(have) - 1, 0))
    found = (have[at] == want) if len(have) else np.zeros(len(want), bool)
    words = group.word[at] if len(have) else np.zeros(len(want), np.int32)
    return np.where(found, words, 0).astype(np.int32)


class ShiftedFrames:
    """Coordinates whose `frame` is shifted back by a segment's start (broadcast against
    it); every other attribute is the wrapped coordinates'."""

    def __init__(self, coords, shift):
        self._coords, self._shift = coords, shift

    def __getattr__(self, name: str):
        value = getattr(self._coords, name)
        return value - self._shift if name == "frame" else value

    def once(self, function):
        """function(self), computed here: a value the wrapped coordinates computed once per
        q tile would have read unshifted frames."""
        return function(self)
