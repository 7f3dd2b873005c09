"""Token layouts: where each token sits in the kernel's sequence. The one layout type of svgen:
the spec's geometry, the compiler's analysis, the generated modules and the kernel all use it.

NumPy only, and no import of the compiler: reading a spec loads this module and nothing of JAX;
the permutations take the array module (`xp`) they run in.

Users pass tokens in the *original* order: video frame-major (f*S + h*W + w, S = H*W), text
before (`text_position: first`) or after (`last`) the video. `order` fixes the order the
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

The field names are the spec's keys (`geometry:` and `layout:`), so a layout reads the same in
a spec, in a generated module and in a test.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

FRAME_MAJOR = "frame_major"
TEMPORAL_MAJOR = "temporal_major"
ORDERS = (FRAME_MAJOR, TEMPORAL_MAJOR)
TEXT_POSITIONS = ("first", "last")


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    frames: int
    height: int
    width: int
    text_tokens: int = 0
    text_position: str = "last"  # one of TEXT_POSITIONS
    order: str = FRAME_MAJOR  # one of ORDERS
    anchor_frames: int = 0  # temporal_major only: frames kept first, in frame-major order

    def with_order(self, order: str, anchor_frames: int = 0) -> "TokenLayout":
        """The same tokens in another kernel order (anchor frames only for temporal_major)."""
        anchors = anchor_frames if order == TEMPORAL_MAJOR else 0
        return dataclasses.replace(self, order=order, anchor_frames=anchors)

    # -- sizes -----------------------------------------------------------------------------

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
    def text_first(self) -> bool:
        return self.text_position == "first"

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

    # -- coordinates of kernel positions (host side) ---------------------------------------

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
        return Coordinates(
            frame=frame,
            row=place // self.width,
            col=place % self.width,
            index=nominal,
            is_text=is_text,
        )

    def original_index(self, positions: np.ndarray) -> np.ndarray:
        """The user's token index of each kernel position (the permutation into kernel order)."""
        pos = np.asarray(positions, dtype=np.int64)
        video = pos - self.video_start
        is_text = (video < 0) | (video >= self.video_tokens)
        frame, place = self.video_frame_place(np.where(is_text, 0, video))
        return np.where(is_text, pos, self.video_start + frame * self.tokens_per_frame + place)

    @functools.cached_property
    def kernel_position(self) -> np.ndarray:
        """int32 [seq_len]: the kernel position of each user token index."""
        out = np.empty(self.seq_len, np.int32)
        out[self.original_index(np.arange(self.seq_len))] = np.arange(self.seq_len, dtype=np.int32)
        return out

    # -- permutations of [..., seq_len, d] arrays (the wrapper's HBM cost) -----------------

    @property
    def is_identity(self) -> bool:
        """Kernel order equals the user's order (no permutation)."""
        return not self.is_temporal_major or self.main_frames <= 1

    def to_kernel(self, x, xp=np):
        """x [..., seq_len, d] in the user's order -> kernel order (reshape + transpose)."""
        if self.is_identity:
            return x
        text, video = self._split(x)
        lead, d = video.shape[:-2], video.shape[-1]
        frames = video.reshape(lead + (self.frames, self.tokens_per_frame, d))
        anchor = frames[..., : self.anchor_frames, :, :].reshape(lead + (-1, d))
        main = xp.swapaxes(frames[..., self.anchor_frames :, :, :], -3, -2).reshape(lead + (-1, d))
        return self._join(text, xp.concatenate([anchor, main], axis=-2), xp)

    def from_kernel(self, y, xp=np):
        """The inverse of to_kernel."""
        if self.is_identity:
            return y
        text, video = self._split(y)
        lead, d = video.shape[:-2], video.shape[-1]
        split = self.anchor_frames * self.tokens_per_frame
        anchor = video[..., :split, :].reshape(
            lead + (self.anchor_frames, self.tokens_per_frame, d)
        )
        main = xp.swapaxes(
            video[..., split:, :].reshape(lead + (self.tokens_per_frame, self.main_frames, d)),
            -3,
            -2,
        )
        frames = xp.concatenate([anchor, main], axis=-3).reshape(lead + (-1, d))
        return self._join(text, frames, xp)

    def _split(self, x):
        v0, n = self.video_start, self.video_tokens
        text = x[..., :v0, :] if self.text_first else x[..., n:, :]
        return text, x[..., v0 : v0 + n, :]

    def _join(self, text, video, xp):
        if self.text_tokens == 0:
            return video
        parts = [text, video] if self.text_first else [video, text]
        return xp.concatenate(parts, axis=-2)


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
