"""Where each token sits in the kernel's sequence, and its coordinates (NumPy, host side).

The kernel sequence has `seq_len = video_tokens + text_tokens` positions. In the frame-major
layout the kernel order is the user's order: video token (f, h, w) at
`video_start + f*S + h*W + w` (S = H*W), text tokens before (`text_position: first`) or after
(`last`) the video. The analysis works on positions in this order; the oracle uses
`coordinates()` to evaluate masks densely on small cases.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from svgen.errors import SpecError
from svgen.spec import Spec


@dataclasses.dataclass(frozen=True)
class SequenceLayout:
    frames: int
    height: int
    width: int
    text_tokens: int
    text_first: bool

    @classmethod
    def of(cls, spec: Spec) -> "SequenceLayout":
        if spec.layout != "frame_major":
            raise SpecError(f"layout {spec.layout!r} is not supported yet (only frame_major)",
                            file=spec.source, key="layout")
        g = spec.geometry
        return cls(g.frames, g.height, g.width, g.text_tokens, g.text_position == "first")

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
    def text_start(self) -> int:
        return 0 if self.text_first else self.video_tokens

    def coordinates(self, positions: np.ndarray) -> "Coordinates":
        pos = np.asarray(positions, dtype=np.int64)
        video = pos - self.video_start
        is_text = (video < 0) | (video >= self.video_tokens)
        video = np.where(is_text, 0, video)
        s = self.tokens_per_frame
        return Coordinates(
            frame=video // s,
            row=(video % s) // self.width,
            col=video % self.width,
            index=pos,
            is_text=is_text,
        )


@dataclasses.dataclass(frozen=True)
class Coordinates:
    """Coordinates of a set of positions; text tokens have frame = row = col = 0."""

    frame: np.ndarray
    row: np.ndarray
    col: np.ndarray
    index: np.ndarray
    is_text: np.ndarray

    def reshape(self, *shape: int) -> "Coordinates":
        return Coordinates(
            *(getattr(self, f.name).reshape(shape) for f in dataclasses.fields(self))
        )
