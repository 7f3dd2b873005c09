"""Token layouts at run time: coordinates inside a kernel, and the permutations into and out of
kernel order (see svgen/layout.py for the orders themselves).

A boundary tile decides keep(q, k) from coordinates: the generated predicate reads
`q.frame`, `k.row`, ... and only what it reads is computed (cached properties are traced
lazily), so a band mask never pays for frame/row/column decoding.

Integer division uses `lax.div` / `lax.rem` on values made non-negative first: jnp's `//` and
`%` lower through `sign`, whose Mosaic rule asks the default device for its chip and fails when
compiling for TPU from a CPU host.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class KernelLayout:
    frames: int
    height: int
    width: int
    text_tokens: int
    text_first: bool
    temporal_major: bool = False
    anchor_frames: int = 0  # temporal_major: frames kept first, frame-major

    @property
    def tokens_per_frame(self) -> int:
        return self.height * self.width

    @property
    def video_tokens(self) -> int:
        return self.frames * self.tokens_per_frame

    @property
    def seq_len(self) -> int:
        return self.video_tokens + self.text_tokens

    @property
    def video_start(self) -> int:
        return self.text_tokens if self.text_first else 0

    @property
    def main_frames(self) -> int:
        return self.frames - self.anchor_frames

    # -- permutations (the HBM cost: one read and one write of the tensor each way) --------

    @property
    def is_identity(self) -> bool:
        return not self.temporal_major or self.main_frames <= 1

    def to_kernel(self, x, xp=jnp):
        """x [..., seq_len, d] in the user's order -> kernel order (reshape + transpose)."""
        if self.is_identity:
            return x
        text, video = self._split(x)
        lead, d = video.shape[:-2], video.shape[-1]
        frames = video.reshape(lead + (self.frames, self.tokens_per_frame, d))
        anchor = frames[..., : self.anchor_frames, :, :].reshape(lead + (-1, d))
        main = xp.swapaxes(frames[..., self.anchor_frames:, :, :], -3, -2).reshape(lead + (-1, d))
        return self._join(text, xp.concatenate([anchor, main], axis=-2), xp)

    def from_kernel(self, y, xp=jnp):
        """The inverse of to_kernel."""
        if self.is_identity:
            return y
        text, video = self._split(y)
        lead, d = video.shape[:-2], video.shape[-1]
        split = self.anchor_frames * self.tokens_per_frame
        anchor = video[..., :split, :].reshape(
            lead + (self.anchor_frames, self.tokens_per_frame, d))
        main = xp.swapaxes(video[..., split:, :].reshape(
            lead + (self.tokens_per_frame, self.main_frames, d)), -3, -2)
        frames = xp.concatenate([anchor, main], axis=-3).reshape(lead + (-1, d))
        return self._join(text, frames, xp)

    def _split(self, x):
        v0, n = self.video_start, self.video_tokens
        text = x[..., :v0, :] if self.text_first else x[..., n:, :]
        return text, x[..., v0:v0 + n, :]

    def _join(self, text, video, xp):
        if self.text_tokens == 0:
            return video
        parts = [text, video] if self.text_first else [video, text]
        return xp.concatenate(parts, axis=-2)

    @functools.cached_property
    def kernel_position(self) -> np.ndarray:
        """int32 [seq_len]: the kernel position of each user token index."""
        original = self.to_kernel(np.arange(self.seq_len)[:, None], xp=np)[:, 0]
        out = np.empty(self.seq_len, np.int32)
        out[original] = np.arange(self.seq_len, dtype=np.int32)
        return out


class TokenCoords:
    """Coordinates of kernel positions `pos` (an int32 array) under `layout`.

    Text tokens have frame = row = col = place = 0 (the documented `expr` semantics); built-in
    primitives always test `is_text` first. `index` is the position in the nominal order
    (temporal_major: p*T + f for video); `place` = row * width + col.
    """

    def __init__(self, pos, layout: KernelLayout):
        self._pos = pos
        self.layout = layout

    def _out(self, value):
        """How a coordinate leaves this object (QueryCoords turns rows into columns)."""
        return value

    @property
    def pos(self):
        """The kernel positions themselves (in this object's output orientation)."""
        return self._out(self._pos)

    # -- public coordinates ---------------------------------------------------------------
    @functools.cached_property
    def is_text(self):
        return self._out_bool(self._is_text)

    @functools.cached_property
    def is_text_int(self):
        return self._out(self._is_text.astype(jnp.int32))

    @functools.cached_property
    def frame(self):
        return self._out(self._zero_for_text(self._frame_place[0]))

    @functools.cached_property
    def row(self):
        return self._out(self._zero_for_text(lax.div(self._frame_place[1], self.layout.width)))

    @functools.cached_property
    def col(self):
        return self._out(self._zero_for_text(lax.rem(self._frame_place[1], self.layout.width)))

    @functools.cached_property
    def place(self):
        return self._out(self._zero_for_text(self._frame_place[1]))

    @functools.cached_property
    def index(self):
        """Position in the layout's nominal order."""
        lay = self.layout
        if not lay.temporal_major:
            return self._out(self._pos)
        frame, place = self._frame_place
        nominal = lay.video_start + place * lay.frames + frame
        return self._out(nominal if lay.text_tokens == 0
                         else jnp.where(self._is_text, self._pos, nominal))

    def _out_bool(self, value):
        return self._out(value)

    # -- decoding, in the orientation `pos` came in ------------------------------------------
    @functools.cached_property
    def _is_text(self):
        lay = self.layout
        if lay.text_tokens == 0:
            return jnp.zeros_like(self._pos, dtype=jnp.bool_)
        start = lay.video_start
        return (self._pos < start) | (self._pos >= start + lay.video_tokens)

    @functools.cached_property
    def _video_offset(self):
        lay = self.layout
        # Clamped so that text positions decode to a valid (if meaningless) video offset and
        # lax.div/rem only ever see non-negative operands.
        return jnp.clip(self._pos - lay.video_start, 0, lay.video_tokens - 1)

    @functools.cached_property
    def _frame_place(self):
        """(frame, place p = h*W + w) of the video offset, in this layout's kernel order."""
        lay = self.layout
        s, v = lay.tokens_per_frame, self._video_offset
        if not lay.temporal_major or lay.main_frames == 0:
            return lax.div(v, s), lax.rem(v, s)
        t = lay.main_frames
        main = jnp.maximum(v - lay.anchor_frames * s, 0)
        frame = lay.anchor_frames + lax.rem(main, t)
        place = lax.div(main, t)
        if lay.anchor_frames:
            in_anchor = v < lay.anchor_frames * s
            frame = jnp.where(in_anchor, lax.div(v, s), frame)
            place = jnp.where(in_anchor, lax.rem(v, s), place)
        return frame, place

    def _zero_for_text(self, value):
        if self.layout.text_tokens == 0:
            return value
        return jnp.where(self._is_text, 0, value)


class QueryCoords(TokenCoords):
    """Query coordinates decoded in row form: positions arrive lane-major, [1, n], and every
    coordinate leaves as a column, [n, 1].

    Why: a [n, 1] int32 array occupies n/8 vregs (one lane of each used), a [1, n] one n/128,
    so the decoding (divisions by constants, clamps, selects) costs 16x fewer VALU ops in row
    form; one transpose per coordinate brings it back (libtpu's v6e schedule: 868 bundles of a
    temporal-major decode of 1024 rows in column form, 151 in row form with the transpose).
    Positions given as a column are used as they are.
    """

    def _out(self, value):
        if value.ndim == 2 and value.shape[0] == 1 and value.shape[1] > 1:
            return jnp.transpose(value)
        return value

    def _out_bool(self, value):
        # Transpose as int32 (the layout Mosaic transposes natively), compare back to bool.
        return self._out(value.astype(jnp.int32)) != 0


def keep(mask, layout: KernelLayout, q_pos, k_pos):
    """A generated `boundary_mask(q, k)` evaluated on positions: q_pos [n, 1], k_pos [1, m]
    (the reference and profiling path; the kernel passes precomputed query coordinates)."""
    return mask(TokenCoords(q_pos, layout), TokenCoords(k_pos, layout))


def within(shifted, width: int, unless=None):
    """0 <= shifted <= width, i.e. |x| <= width / 2 for shifted = x + width / 2: one unsigned
    compare (a negative value wraps above any width), two VALU ops per vreg less than
    abs and a signed compare.

    unless: a bool [1, keys] of keys kept whatever shifted is; it clears their bits before
    the compare (0 <= width), one AND per vreg instead of broadcasting the bools and an OR.
    """
    bits = lax.bitcast_convert_type(shifted, jnp.uint32)
    if unless is not None:
        bits = bits & jnp.where(unless, jnp.uint32(0), jnp.uint32(0xFFFFFFFF))
    return bits <= jnp.uint32(width)
