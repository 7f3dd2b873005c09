"""Token coordinates inside a kernel, from kernel positions (jnp, lowered by Mosaic).

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
from jax import lax


@dataclasses.dataclass(frozen=True)
class FrameMajorLayout:
    """Kernel order = user order: video frame-major (f*S + h*W + w), text before or after it."""

    frames: int
    height: int
    width: int
    text_tokens: int
    text_first: bool

    @property
    def video_tokens(self) -> int:
        return self.frames * self.height * self.width

    @property
    def video_start(self) -> int:
        return self.text_tokens if self.text_first else 0


class TokenCoords:
    """Coordinates of kernel positions `pos` (an int32 array) under `layout`.

    Text tokens have frame = row = col = 0 (the documented `expr` semantics); built-in
    primitives always test `is_text` first.
    """

    def __init__(self, pos, layout: FrameMajorLayout):
        self.pos = pos
        self.layout = layout

    @functools.cached_property
    def index(self):
        """Position in the layout's nominal order (frame-major: the kernel position)."""
        return self.pos

    @functools.cached_property
    def is_text(self):
        lay = self.layout
        if lay.text_tokens == 0:
            return jnp.zeros_like(self.pos, dtype=jnp.bool_)
        start = lay.video_start
        return (self.pos < start) | (self.pos >= start + lay.video_tokens)

    @functools.cached_property
    def is_text_int(self):
        return self.is_text.astype(jnp.int32)

    @functools.cached_property
    def _video_index(self):
        lay = self.layout
        # Clamped so that text positions decode to a valid (if meaningless) video index and
        # lax.div/rem only ever see non-negative operands.
        return jnp.clip(self.pos - lay.video_start, 0, lay.video_tokens - 1)

    @functools.cached_property
    def _within_frame(self):
        return lax.rem(self._video_index, self.layout.height * self.layout.width)

    def _zero_for_text(self, value):
        if self.layout.text_tokens == 0:
            return value
        return jnp.where(self.is_text, 0, value)

    @functools.cached_property
    def frame(self):
        lay = self.layout
        return self._zero_for_text(lax.div(self._video_index, lay.height * lay.width))

    @functools.cached_property
    def row(self):
        return self._zero_for_text(lax.div(self._within_frame, self.layout.width))

    @functools.cached_property
    def col(self):
        return self._zero_for_text(lax.rem(self._within_frame, self.layout.width))
