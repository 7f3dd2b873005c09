"""The built-in mask nodes over token coordinates: constants, the first frame, spatial and
temporal windows, bands, prefixes, text, causal frames and blocks, cube windows (see svgen.ir)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import sympy

from svgen.spec.expr import SYMBOLS, FloorDiv, FloorMod
from svgen.core.layout import Coordinates

from svgen.ir.facts import NodeFacts

_S = SYMBOLS


def band_width_from_density(density: float, video_tokens: int) -> int:
    """w = 128 * ceil(N * (1 - sqrt(1 - d)) / 128): the TPU port's rule (N = video tokens)."""
    return 128 * math.ceil(video_tokens * (1.0 - math.sqrt(1.0 - density)) / 128)


def _video_pair():
    return sympy.And(sympy.Eq(_S["is_text_q"], 0), sympy.Eq(_S["is_text_k"], 0))


def _within(a, b, bound):
    """|a - b| <= bound, or True when unbounded."""
    if bound is None:
        return sympy.true
    return sympy.Eq(a, b) if bound == 0 else sympy.Le(sympy.Abs(a - b), bound)


def _both_video(q: Coordinates, k: Coordinates) -> np.ndarray:
    return ~q.is_text & ~k.is_text


def _near(a: np.ndarray, b: np.ndarray, bound: int | None) -> np.ndarray:
    return (
        np.ones(np.broadcast_shapes(a.shape, b.shape), bool)
        if bound is None
        else (np.abs(a - b) <= bound)
    )


def _near_axes(**radii) -> set:
    """(axis, "near", radius) for each bounded axis radius."""
    return {(axis, "near", r) for axis, r in radii.items() if r is not None}


@dataclasses.dataclass(frozen=True)
class Always(NodeFacts):
    """Every pair (value=True) or none (value=False)."""

    value: bool

    def evaluate(self, q, k):
        return np.full(np.broadcast_shapes(q.index.shape, k.index.shape), self.value)

    def predicate(self):
        return sympy.true if self.value else sympy.false

    def describe(self):
        return "every pair" if self.value else "no pair"

    def frame_invariant(self) -> bool:
        return True

    def shift_invariant(self) -> bool:
        return True

    def excludes_text(self) -> bool:
        return not self.value


@dataclasses.dataclass(frozen=True)
class FirstFrame(NodeFacts):
    """k is a video token of the first `frames` frames (any query, text queries included)."""

    frames: int

    def evaluate(self, q, k):
        return np.broadcast_to(
            ~k.is_text & (k.frame < self.frames), np.broadcast_shapes(q.index.shape, k.index.shape)
        )

    def predicate(self):
        return sympy.And(sympy.Eq(_S["is_text_k"], 0), sympy.Lt(_S["f_k"], self.frames))

    def describe(self):
        return f"every query attends the first {self.frames} frame(s)"

    def anchor_frames(self) -> int:
        return self.frames

    def frame_invariant(self) -> bool:
        return True

    def axis_term(self):
        return "any_query_video_key", frozenset({("f", "below", self.frames)})


@dataclasses.dataclass(frozen=True)
class SpatialWindow(NodeFacts):
    """Both video, |df| <= frames, |dh| <= rows, |dw| <= cols (None = unbounded)."""

    frames: int | None
    rows: int | None
    cols: int | None

    def evaluate(self, q, k):
        return (
            _both_video(q, k)
            & _near(q.frame, k.frame, self.frames)
            & _near(q.row, k.row, self.rows)
            & _near(q.col, k.col, self.cols)
        )

    def predicate(self):
        return sympy.And(
            _video_pair(),
            _within(_S["f_q"], _S["f_k"], self.frames),
            _within(_S["h_q"], _S["h_k"], self.rows),
            _within(_S["w_q"], _S["w_k"], self.cols),
        )

    def describe(self):
        if self.frames is None:
            parts = ["any frame difference"]
        else:  # the words of committed modules' comments: unchanged
            parts = [f"|frame difference| <= {self.frames}"]
        if self.rows is not None:
            parts.append(f"|row difference| <= {self.rows}")
        if self.cols is not None:
            parts.append(f"|column difference| <= {self.cols}")
        return "spatial window: video pairs with " + ", ".join(parts)

    def shift_invariant(self) -> bool:
        return True

    def excludes_text(self) -> bool:
        return True

    def axis_term(self):
        return "video_pair", frozenset(_near_axes(f=self.frames, h=self.rows, w=self.cols))

    def transposed(self):
        return dataclasses.replace(self, rows=self.cols, cols=self.rows)


@dataclasses.dataclass(frozen=True)
class TemporalStride(NodeFacts):
    """Both video, |dh| <= rows, |dw| <= cols, df = 0 mod stride, |df| <= frames."""

    rows: int
    cols: int
    stride: int
    frames: int | None

    def evaluate(self, q, k):
        df = q.frame - k.frame
        return (
            _both_video(q, k)
            & _near(q.row, k.row, self.rows)
            & _near(q.col, k.col, self.cols)
            & (df % self.stride == 0)
            & _near(q.frame, k.frame, self.frames)
        )

    def predicate(self):
        df = _S["f_q"] - _S["f_k"]
        on_stride = sympy.true if self.stride == 1 else sympy.Eq(FloorMod(df, self.stride), 0)
        return sympy.And(
            _video_pair(),
            _within(_S["h_q"], _S["h_k"], self.rows),
            _within(_S["w_q"], _S["w_k"], self.cols),
            on_stride,
            _within(_S["f_q"], _S["f_k"], self.frames),
        )

    def describe(self):
        where = (
            "the same position"
            if self.rows == 0 and self.cols == 0
            else f"positions within {self.rows} row(s) and {self.cols} column(s)"
        )
        frames = "every frame" if self.frames is None else f"frames within {self.frames}"
        stride = "" if self.stride == 1 else f", frame difference divisible by {self.stride}"
        return f"temporal: video pairs at {where}, {frames}{stride}"

    def frame_invariant(self) -> bool:
        return self.frames is None and self.stride == 1

    def shift_invariant(self) -> bool:
        return True

    def excludes_text(self) -> bool:
        return True

    def axis_term(self):
        parts = _near_axes(h=self.rows, w=self.cols, f=self.frames)
        if self.stride > 1:
            parts.add(("f", "stride", self.stride))
        return "video_pair", frozenset(parts)

    def transposed(self):
        return dataclasses.replace(self, rows=self.cols, cols=self.rows)


@dataclasses.dataclass(frozen=True)
class Band(NodeFacts):
    """|i_q - i_k| <= width, i = position in the layout's order (text included)."""

    width: int

    @classmethod
    def from_params(cls, values: dict, geometry) -> "Band":
        """The spec gives a width or a density (the kept fraction of video pairs)."""
        width = values["width"]
        if width is None:
            width = band_width_from_density(float(values["density"]), geometry.video_tokens)
        return cls(width)

    def evaluate(self, q, k):
        return np.abs(q.index - k.index) <= self.width

    def predicate(self):
        return sympy.Le(sympy.Abs(_S["i_q"] - _S["i_k"]), self.width)

    def describe(self):
        return f"band: |position difference| <= {self.width}"

    def shift_invariant(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class Prefix(NodeFacts):
    """The key's position in the layout's order is < tokens."""

    tokens: int

    def evaluate(self, q, k):
        return np.broadcast_to(
            k.index < self.tokens, np.broadcast_shapes(q.index.shape, k.index.shape)
        )

    def predicate(self):
        return sympy.Lt(_S["i_k"], self.tokens)

    def describe(self):
        return f"every query attends the first {self.tokens} positions"

    def frame_invariant(self) -> bool:
        return True

    def shift_invariant(self) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class Text(NodeFacts):
    """q or k is a text token."""

    def evaluate(self, q, k):
        return q.is_text | k.is_text

    def predicate(self):
        return sympy.Or(sympy.Eq(_S["is_text_q"], 1), sympy.Eq(_S["is_text_k"], 1))

    def describe(self):
        return "text tokens attend and are attended globally"

    def frame_invariant(self) -> bool:
        return True

    def shift_invariant(self) -> bool:
        return True

    def axis_term(self):
        return "text_involved", frozenset()


@dataclasses.dataclass(frozen=True)
class CausalFrames(NodeFacts):
    """Both video and f_k <= f_q."""

    def evaluate(self, q, k):
        return _both_video(q, k) & (k.frame <= q.frame)

    def predicate(self):
        return sympy.And(_video_pair(), sympy.Le(_S["f_k"], _S["f_q"]))

    def describe(self):
        return "causal over frames: video keys of the same or earlier frames"

    def shift_invariant(self) -> bool:
        return True

    def excludes_text(self) -> bool:
        return True

    def axis_term(self):
        return "video_pair", frozenset({("f", "causal", 0)})


@dataclasses.dataclass(frozen=True)
class BlockCausal(NodeFacts):
    """Both video and f_k // frames <= f_q // frames: causal over chunks of `frames` frames,
    every frame of a chunk attending the whole chunk (CausVid, Self-Forcing). Text tokens
    are not involved; `any_of` with `text: {}` gives them global attention."""

    frames: int

    def evaluate(self, q, k):
        return _both_video(q, k) & (k.frame // self.frames <= q.frame // self.frames)

    def predicate(self):
        """Written as f_k < n * (f_q // n) + n: one division, on the query side only (the
        generated mask reads query coordinates once per q tile, keys on every block)."""
        f_q, f_k, n = _S["f_q"], _S["f_k"], self.frames
        if n == 1:
            return sympy.And(_video_pair(), sympy.Le(f_k, f_q))
        return sympy.And(_video_pair(), sympy.Lt(f_k, n * FloorDiv(f_q, n) + n))

    def describe(self):
        return (
            f"block-causal over chunks of {self.frames} frame(s): video keys of the same "
            f"or earlier chunks"
        )

    def shift_invariant(self) -> bool:
        return self.frames == 1  # chunks of one frame: f_k <= f_q, a difference

    def excludes_text(self) -> bool:
        return True

    def axis_term(self):
        return "video_pair", frozenset({("f", "block", self.frames)})


@dataclasses.dataclass(frozen=True)
class CubeWindow(NodeFacts):
    """Both video, and the keys' cube within `frames` x `rows` x `cols` cubes of the query's:
    tokens grouped into cubes of cube_frames x cube_rows x cube_cols (aligned to frame, row
    and column 0), |f_q // a - f_k // a| <= frames and likewise for rows and columns. The
    window of Sliding Tile Attention, whose tiles are such cubes."""

    cube_frames: int
    cube_rows: int
    cube_cols: int
    frames: int
    rows: int
    cols: int

    def _axes(self):
        return (
            ("f", "frame", self.cube_frames, self.frames),
            ("h", "row", self.cube_rows, self.rows),
            ("w", "col", self.cube_cols, self.cols),
        )

    def evaluate(self, q, k):
        keep = _both_video(q, k)
        for _, name, size, radius in self._axes():
            keep = keep & _near(getattr(q, name) // size, getattr(k, name) // size, radius)
        return keep

    def predicate(self):
        parts = [_video_pair()]
        for symbol, _, size, radius in self._axes():
            a, b = _S[f"{symbol}_q"], _S[f"{symbol}_k"]
            if size > 1:
                a, b = FloorDiv(a, size), FloorDiv(b, size)
            parts.append(_within(a, b, radius))
        return sympy.And(*parts)

    def describe(self):
        return (
            f"cube window: video pairs whose {self.cube_frames}x{self.cube_rows}x"
            f"{self.cube_cols} cubes are within {self.frames} / {self.rows} / {self.cols} "
            f"cubes (frames / rows / columns)"
        )

    def shift_invariant(self) -> bool:
        return self.cube_frames == 1  # deeper cubes are aligned to frame 0

    def axis_term(self):
        return "video_pair", frozenset(
            {
                ("f", "cube", (self.cube_frames, self.frames)),
                ("h", "cube", (self.cube_rows, self.rows)),
                ("w", "cube", (self.cube_cols, self.cols)),
            }
        )

    def transposed(self):
        return dataclasses.replace(
            self,
            cube_rows=self.cube_cols,
            cube_cols=self.cube_rows,
            rows=self.cols,
            cols=self.rows,
        )
