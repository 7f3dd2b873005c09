"""The mask algebra's nodes: what every spec desugars to (see svgen.ir), and `simplify`."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pathlib
from typing import Protocol

import numpy as np
import sympy

from svgen.spec.expr import SYMBOLS, FloorDiv, FloorMod
from svgen.spec.quoting import safe_text
from svgen.core.layout import Coordinates

from svgen.ir.evaluate import evaluate_sympy

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


class NodeFacts:
    """What the analysis may assume of a mask node, declared with its semantics instead of
    in isinstance chains across the compiler. Every built-in node inherits this; a primitive
    overrides the facts that hold for it. The defaults are the safe answers: a node that
    declares nothing is analyzed the general way (row sets, no per-axis form), is taken to
    depend on the query's frame and on the segment's start, attends no anchor frames and may
    keep pairs with text tokens."""

    def anchor_frames(self) -> int:
        """The most leading frames a first_frame in the node attends (0: none); a
        temporal-major layout keeps that many frames first."""
        return 0

    def frame_invariant(self) -> bool:
        """For video queries, the allowed keys never depend on the query's frame."""
        return False

    def shift_invariant(self) -> bool:
        """The node means the same at every segment start under per-video frame numbering
        (svgen.analysis.video_frames): it reads frames only as f_q - f_k of two video tokens,
        or none at all."""
        return False

    def excludes_text(self) -> bool:
        """The node keeps no pair with a text token."""
        return False

    def axis_term(self) -> tuple[str, frozenset] | None:
        """The node as one conjunction of per-axis constraints (svgen.analysis.axis_terms):
        (its token classes: "video_pair", "any_query_video_key" or "text_involved", its
        constraints as (axis, kind, parameter) triples), or None when it is not of that
        kind."""
        return None

    def transposed(self) -> "Node":
        """The node over the transposed frame (rows and columns exchanged): what a kernel
        whose layout walks a frame column by column runs (svgen.core.layout, `transposed`).
        By default the node itself where it reads no row or column, else NotTransposable: a
        node that reads them says how they exchange."""
        if _reads_rows_or_cols(self.predicate()):
            raise NotTransposable(self.describe())
        return self


class NotTransposable(ValueError):
    """A mask node with no form over a transposed frame (its words in the message)."""


# The row and column symbols of both sides, each with the one it exchanges with.
_ROW_COL_SWAP = {"h_q": "w_q", "w_q": "h_q", "h_k": "w_k", "w_k": "h_k"}


def _reads_rows_or_cols(expr) -> bool:
    return any(s.name in _ROW_COL_SWAP for s in expr.free_symbols)


def _swap_rows_cols(expr):
    return expr.xreplace({_S[a]: _S[b] for a, b in _ROW_COL_SWAP.items()})


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


class BlockBit(sympy.logic.boolalg.BooleanFunction):
    """keep(q, k) of a block mask given as data, as the predicate algebra sees it: an opaque
    boolean of (i_q, i_k, block, tag), tag naming the array (its digest's first 48 bits); i
    stands for the kernel position here, which the predicate language cannot name. Nothing
    simplifies through it; svgen.analysis reads BlockData nodes, not this."""

    nargs = 4

    @classmethod
    def eval(cls, *args):
        return None


@dataclasses.dataclass(frozen=True)
class BlockData(NodeFacts):
    """A block mask given as data (the `blocks` primitive): keep(q, k) = bits[p_q // block,
    p_k // block], p the token's position in the head's kernel order (the order its layout
    runs it in, `token_order="kernel"`: the user's order for frame_major), bits read from
    `file` (checked by svgen.spec.block_data; equal nodes have equal files by digest)."""

    file: str
    block: int
    head: int | None
    array: str | None
    digest: str
    bits: np.ndarray = dataclasses.field(compare=False, hash=False, repr=False)

    @classmethod
    def from_term(cls, term, spec) -> "BlockData":
        """The node of a spec's `blocks` term: its file read and checked now, a SpecError at
        the term's location when the file is wrong."""
        from svgen.spec.block_data import BlockDataError, load
        from svgen.spec.errors import SpecError

        file, block = term.param("file"), term.param("block")
        head, array = term.param("head"), term.param("array")
        where = term.where
        try:
            data = load(
                file, block, head, array, spec.geometry.seq_len, where.file if where else None
            )
        except BlockDataError as exc:
            location = (
                {}
                if where is None
                else {
                    "file": where.file,
                    "line": where.line,
                    "column": where.column,
                    "key": where.key,
                }
            )
            raise SpecError(str(exc), **location) from None
        return cls(file, block, head, array, data.digest, data.bits)

    @property
    def tag(self) -> str:
        """The table's short name in generated code: the file's digest's first 12 hex
        digits, the block size, and which head's array (and which .npz member) it is."""
        tag = f"{self.digest[:12]}_{self.block}"
        if self.head is not None:
            tag += f"_h{self.head}"
        if self.array is not None:
            tag += "_a" + hashlib.sha256(self.array.encode()).hexdigest()[:6]
        return tag

    def evaluate(self, q, k):
        return self.bits[q.position // self.block, k.position // self.block]

    def predicate(self):
        return BlockBit(
            _S["i_q"],
            _S["i_k"],
            sympy.Integer(self.block),
            sympy.Integer(int(self.digest[:12], 16)),
        )

    @property
    def shown_file(self) -> str:
        """How generated modules and reports name the file: as the spec gave it when
        relative, by its name alone when absolute (a module must not depend on where it was
        compiled; its sha256 names the content), through safe_text (a file name is never
        code)."""
        path = pathlib.PurePath(self.file)
        return safe_text(path.name if path.is_absolute() else self.file)

    def describe(self):
        which = "" if self.head is None else f", head {self.head}"
        name = "" if self.array is None else f", array {safe_text(self.array)}"
        return (
            f"blocks of {self.block} tokens from {self.shown_file}{name}{which} "
            f"(sha256 {self.digest[:12]}), {int(self.bits.sum()):,} of {self.bits.size:,} kept"
        )


@dataclasses.dataclass(frozen=True)
class Predicate(NodeFacts):
    """A user `expr`, parsed by svgen.spec.expr into sympy; `source` is the user's text."""

    source: str
    expr: sympy.Basic = dataclasses.field(compare=False, hash=False, repr=False)

    def evaluate(self, q, k):
        return np.broadcast_to(
            evaluate_sympy(self.expr, q, k), np.broadcast_shapes(q.index.shape, k.index.shape)
        )

    def predicate(self):
        return self.expr

    def describe(self):
        return f"expr: {self.source}"

    def shift_invariant(self) -> bool:
        """Shift every video frame the predicate reads by a fresh s: in each case of a pair
        (video-video, text query, text key; a text token's frame stays 0) s must cancel.
        Sound: if s survives sympy's automatic simplification the term counts as anchored,
        never the other way round."""
        f_q, f_k = _S["f_q"], _S["f_k"]
        if not ({f_q, f_k} & self.expr.free_symbols):
            return True
        s = sympy.Symbol("per_video_shift", integer=True, nonnegative=True)
        text_q, text_k = _S["is_text_q"], _S["is_text_k"]
        cases = (
            {text_q: 0, text_k: 0, f_q: f_q + s, f_k: f_k + s},
            {text_q: 1, text_k: 0, f_q: 0, f_k: f_k + s},
            {text_q: 0, text_k: 1, f_q: f_q + s, f_k: 0},
        )
        return all(s not in self.expr.subs(case, simultaneous=True).free_symbols for case in cases)

    def transposed(self):
        if not _reads_rows_or_cols(self.expr):
            return self
        # A new source: predicates are equal by their source, and this is another mask.
        source = f"{self.source} [over the transposed frame: h and w exchanged]"
        return dataclasses.replace(self, source=source, expr=_swap_rows_cols(self.expr))


@dataclasses.dataclass(frozen=True)
class _LoweredPredicate(Predicate):
    """A built-in lowered to its predicate (analyzed and printed as an `expr`), whose
    `source` says it in words."""

    def describe(self):
        return self.source


@dataclasses.dataclass(frozen=True)
class Neighborhood(_LoweredPredicate):
    """NATTEN's neighborhood attention (Hassani et al., 2023) between video tokens: on each
    axis of size n, a window of `kernel` positions that stays inside the video (near an edge
    it shifts inward instead of shrinking: it starts at clamp(x - kernel // 2, 0, n - kernel)),
    over the positions of the query's residue modulo the axis's dilation (its own sub-grid);
    with `causal` the frame window ends at the query's frame (the kernel - 1 frames before it,
    cut at frame 0). Lowered to its predicate: analyzed per axis, exactly, like an `expr`."""

    @classmethod
    def from_params(cls, values: dict, geometry) -> "Neighborhood":
        axes = (("f", "frames", geometry.frames), ("h", "rows", geometry.height))
        axes += (("w", "cols", geometry.width),)
        parts = [sympy.Eq(SYMBOLS["is_text_q"], 0), sympy.Eq(SYMBOLS["is_text_k"], 0)]
        words = []
        for axis, name, size in axes:
            kernel = values[name]
            dilation = values[f"{name[:-1]}_dilation"]
            causal = bool(values["causal"]) and axis == "f"
            if kernel is None or (kernel >= size and dilation == 1 and not causal):
                words.append(f"every {name[:-1]}")
                continue
            parts.append(_window_predicate(axis, size, kernel, dilation, causal))
            dilated = f" dilated by {dilation}" if dilation > 1 else ""
            words.append(f"{kernel} {name}{dilated}" + (" up to the query's" if causal else ""))
        expr = sympy.And(*parts)
        return cls("neighborhood (clamped inside the video): " + ", ".join(words), expr)


def _window_predicate(axis: str, size: int, kernel: int, dilation: int, causal: bool):
    """x_k in the query's window on one axis (see Neighborhood), as a sympy predicate."""
    xq, xk = SYMBOLS[f"{axis}_q"], SYMBOLS[f"{axis}_k"]
    d = dilation
    # Positions of residue x % d: (size - 1 - x % d) // d + 1 of them; x is the (x // d)-th.
    index_q, index_k = (xq, xk) if d == 1 else (FloorDiv(xq, d), FloorDiv(xk, d))
    if causal:
        start = sympy.Max(0, index_q - (kernel - 1))
        window = sympy.And(start <= index_k, index_k <= index_q)
    else:
        count = size if d == 1 else FloorDiv(size - 1 - FloorMod(xq, d), d) + 1
        start = sympy.Max(0, sympy.Min(index_q - kernel // 2, count - kernel))
        window = sympy.And(start <= index_k, index_k <= start + (kernel - 1))
    if d == 1:
        return window
    return sympy.And(sympy.Eq(FloorMod(xq - xk, d), 0), window)


@dataclasses.dataclass(frozen=True)
class Radial(_LoweredPredicate):
    """Radial Attention's mask (Li et al., 2025) between video tokens: frames at distance d
    fall in band r = floor(log2(max(d, 1))), and a key is kept when its place in the frame
    (h * width + w) is less than `width` / 2^r from the query's, so the window halves each
    time the frame distance doubles (`width` defaults to the frame's places: whole frames at
    d <= 1). Where the window is below one place only the same place is kept (the paper then
    also keeps only every ceil(2^r / width)-th frame; svgen keeps every frame). Lowered to its
    predicate: analyzed exactly over places, like an `expr`."""

    @classmethod
    def from_params(cls, values: dict, geometry) -> "Radial":
        places = geometry.height * geometry.width
        width = values["width"] if values["width"] is not None else places
        fq, fk = SYMBOLS["f_q"], SYMBOLS["f_k"]
        distance = sympy.Abs(fq - fk)
        place = geometry.width * (SYMBOLS["h_q"] - SYMBOLS["h_k"]) + SYMBOLS["w_q"] - SYMBOLS["w_k"]
        bands = []
        band = 0
        while (1 << band) <= max(geometry.frames - 1, 1):
            low = 0 if band == 0 else 1 << band
            high = 1 if band == 0 else (2 << band) - 1
            near = sympy.And(low <= distance, distance <= high) if low else distance <= high
            if (width - 1) >> band >= places - 1:  # every place pair of the frames
                bands.append(near)
            else:  # |place difference| * 2^r < width, i.e. <= (width - 1) >> r
                bands.append(sympy.And(near, sympy.Abs(place) <= (width - 1) >> band))
            band += 1
        video = [sympy.Eq(SYMBOLS["is_text_q"], 0), sympy.Eq(SYMBOLS["is_text_k"], 0)]
        expr = sympy.And(*video, sympy.Or(*bands))
        words = f"radial (window of {width:,} places halving as the frame distance doubles)"
        return cls(words, expr)

    def transposed(self):
        # Its analysis reads places row by row (h * width + w); over a transposed frame that
        # is another form, which no exact analysis here covers.
        raise NotTransposable(self.describe() + ": it numbers a frame's places row by row")


class _Combination(NodeFacts):
    """any_of / all_of: facts that hold when they hold for every child."""

    children: tuple

    def anchor_frames(self) -> int:
        return max(c.anchor_frames() for c in self.children)

    def frame_invariant(self) -> bool:
        return all(c.frame_invariant() for c in self.children)

    def shift_invariant(self) -> bool:
        return all(c.shift_invariant() for c in self.children)


@dataclasses.dataclass(frozen=True)
class AnyOf(_Combination):
    children: tuple["Node", ...]

    def evaluate(self, q, k):
        return np.logical_or.reduce([c.evaluate(q, k) for c in self.children])

    def predicate(self):
        return sympy.Or(*(c.predicate() for c in self.children))

    def describe(self):
        return "any of: " + "; ".join(c.describe() for c in self.children)

    def transposed(self):
        return AnyOf(tuple(c.transposed() for c in self.children))

    def excludes_text(self) -> bool:
        return all(c.excludes_text() for c in self.children)


@dataclasses.dataclass(frozen=True)
class AllOf(_Combination):
    children: tuple["Node", ...]

    def evaluate(self, q, k):
        return np.logical_and.reduce([c.evaluate(q, k) for c in self.children])

    def predicate(self):
        return sympy.And(*(c.predicate() for c in self.children))

    def describe(self):
        return "all of: " + "; ".join(c.describe() for c in self.children)

    def transposed(self):
        return AllOf(tuple(c.transposed() for c in self.children))

    def excludes_text(self) -> bool:
        return any(c.excludes_text() for c in self.children)


@dataclasses.dataclass(frozen=True)
class Not(NodeFacts):
    child: "Node"

    def evaluate(self, q, k):
        return ~self.child.evaluate(q, k)

    def predicate(self):
        return sympy.Not(self.child.predicate())

    def describe(self):
        return f"not ({self.child.describe()})"

    def transposed(self):
        return Not(self.child.transposed())

    def anchor_frames(self) -> int:
        return self.child.anchor_frames()

    def frame_invariant(self) -> bool:
        return self.child.frame_invariant()

    def shift_invariant(self) -> bool:
        return self.child.shift_invariant()


class Node(Protocol):
    """What every mask node provides; `svgen.spec.primitives` lists the node of each spec key
    (`Always` is the only node no spec writes: simplification's constants)."""

    def evaluate(self, q: Coordinates, k: Coordinates) -> np.ndarray: ...

    def predicate(self) -> sympy.Basic: ...

    def describe(self) -> str: ...


# ---------------------------------------------------------------------------------------------
# Simplification: flatten nested unions/intersections, drop duplicates and constants.


def simplify(node: Node) -> Node:
    if isinstance(node, Not):
        child = simplify(node.child)
        if isinstance(child, Not):
            return child.child
        if isinstance(child, Always):
            return Always(not child.value)
        return Not(child)
    if isinstance(node, (AnyOf, AllOf)):
        kind = type(node)
        absorbing = isinstance(node, AnyOf)  # True absorbs a union, False an intersection
        flat: list[Node] = []
        for child in map(simplify, node.children):
            parts = child.children if isinstance(child, kind) else (child,)
            for part in parts:
                if isinstance(part, Always):
                    if part.value == absorbing:
                        return Always(absorbing)
                    continue
                if part not in flat:
                    flat.append(part)
        if not flat:
            return Always(not absorbing)
        return flat[0] if len(flat) == 1 else kind(tuple(flat))
    if isinstance(node, Predicate) and node.expr in (sympy.true, sympy.false):
        return Always(bool(node.expr))
    return node
