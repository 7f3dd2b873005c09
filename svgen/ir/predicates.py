"""Nodes that are predicates: a user `expr`, and the built-ins lowered to theirs
(NATTEN's neighborhood, Radial Attention's mask), analyzed and printed as an `expr` is."""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from svgen.spec.expr import SYMBOLS, FloorDiv, FloorMod

from svgen.ir.evaluate import evaluate_sympy
from svgen.ir.facts import NodeFacts, NotTransposable, reads_rows_or_cols, swap_rows_cols

_S = SYMBOLS


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
        if not reads_rows_or_cols(self.expr):
            return self
        # A new source: predicates are equal by their source, and this is another mask.
        source = f"{self.source} [over the transposed frame: h and w exchanged]"
        return dataclasses.replace(self, source=source, expr=swap_rows_cols(self.expr))


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
