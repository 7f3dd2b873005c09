"""Where each token sits in the kernel's sequence, and its coordinates (NumPy, host side).

Users pass tokens in the *original* order: video frame-major (f*S + h*W + w, S = H*W), text
before (`text_position: first`) or after (`last`) the video. A layout fixes the order the
kernel sees (the *kernel order*) and the *nominal order* that `band`, `prefix` and `i_q/i_k`
refer to:

  frame_major     kernel = nominal = original order.
  temporal_major  nominal video order is p*T + f (p = h*W + w, T = frames): the same place in
                  consecutive frames is adjacent, so a temporal head becomes a narrow band.
                  The kernel order keeps the first `anchor_frames` frames first, in
                  frame-major order, then the other frames temporal-major
                  (p*(T - anchor) + f - anchor): a first-frame anchor is then one contiguous
                  block of keys instead of a stride-T comb across every tile.
Text tokens keep their place (first or last) in all three orders.
"""

from __future__ import annotations

import dataclasses

import numpy as np

FRAME_MAJOR = "frame_major"
TEMPORAL_MAJOR = "temporal_major"


@dataclasses.dataclass(frozen=True)
class SequenceLayout:
    frames: int
    height: int
    width: int
    text_tokens: int
    text_first: bool
    order: str = FRAME_MAJOR
    anchor_frames: int = 0  # temporal_major only: frames kept first, in frame-major order

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
        """First video position, in every order."""
        return self.text_tokens if self.text_first else 0

    @property
    def text_start(self) -> int:
        return 0 if self.text_first else self.video_tokens

    @property
    def is_temporal_major(self) -> bool:
        return self.order == TEMPORAL_MAJOR

    @property
    def main_frames(self) -> int:
        """temporal_major: frames after the anchor block (T')."""
        return self.frames - self.anchor_frames

    @property
    def main_start(self) -> int:
        """temporal_major: first kernel position of the temporal-major block."""
        return self.video_start + self.anchor_frames * self.tokens_per_frame

    # -- video coordinates of kernel positions --------------------------------------------

    def video_frame_place(self, video: np.ndarray):
        """(frame, place p = h*W + w) of kernel video offsets (position - video_start)."""
        s = self.tokens_per_frame
        if not self.is_temporal_major:
            return video // s, video % s
        anchor = video < self.anchor_frames * s
        main = np.maximum(video - self.anchor_frames * s, 0)
        t = max(self.main_frames, 1)
        frame = np.where(anchor, video // s, self.anchor_frames + main % t)
        place = np.where(anchor, video % s, main // t)
        return frame, place

    def coordinates(self, positions: np.ndarray) -> "Coordinates":
        """Coordinates of kernel positions; text tokens have frame = row = col = 0."""
        pos = np.asarray(positions, dtype=np.int64)
        video = pos - self.video_start
        is_text = (video < 0) | (video >= self.video_tokens)
        frame, place = self.video_frame_place(np.where(is_text, 0, video))
        frame, place = np.where(is_text, 0, frame), np.where(is_text, 0, place)
        nominal = pos
        if self.is_temporal_major:
            nominal = np.where(is_text, pos, self.video_start + place * self.frames + frame)
        return Coordinates(frame=frame, row=place // self.width, col=place % self.width,
                           index=nominal, is_text=is_text)

    def original_index(self, positions: np.ndarray) -> np.ndarray:
        """The user's token index of each kernel position (the permutation into kernel order)."""
        pos = np.asarray(positions, dtype=np.int64)
        video = pos - self.video_start
        is_text = (video < 0) | (video >= self.video_tokens)
        frame, place = self.video_frame_place(np.where(is_text, 0, video))
        return np.where(is_text, pos, self.video_start + frame * self.tokens_per_frame + place)


@dataclasses.dataclass(frozen=True)
class Coordinates:
    """Coordinates of a set of positions; text tokens have frame = row = col = 0."""

    frame: np.ndarray
    row: np.ndarray
    col: np.ndarray
    index: np.ndarray  # position in the layout's nominal order
    is_text: np.ndarray

    def reshape(self, *shape: int) -> "Coordinates":
        return Coordinates(
            *(getattr(self, f.name).reshape(shape) for f in dataclasses.fields(self))
        )
