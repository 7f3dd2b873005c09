"""The mask algebra: a few hashable nodes that every spec desugars to.

Each node knows three things about itself:
  * `evaluate(q, k)`: the brute-force oracle, keep(q, k) on NumPy coordinate arrays, written
    straight from the documented semantics (tests check everything else against it);
  * `predicate()`: the same predicate as a sympy boolean over the coordinate symbols of
    `svgen.spec.expr`; code generation prints it as the boundary-tile mask;
  * `describe()`: the pattern in words, for the generated docstring.
Tile classification of nodes lives in `svgen.analysis`, which finds each node's row sets
through the primitive registry, `svgen.spec.primitives`.

`lower(spec)` resolves named patterns (a networkx dependency graph: unknown names and cycles
are errors naming the chain), desugars spec terms to nodes and simplifies the result. Which
spec key becomes which node, with which parameters, is declared in that registry.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np
import sympy

from svgen.spec import primitives
from svgen.spec import int_range
from svgen.spec.errors import SpecError
from svgen.spec.expr import SYMBOLS, FloorDiv, FloorMod, parse_predicate
from svgen.runtime.layout import Coordinates
from svgen.spec import MaskTerm, Spec, dependency_order, pattern_graph

_S = SYMBOLS


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


@dataclasses.dataclass(frozen=True)
class Always:
    """Every pair (value=True) or none (value=False)."""

    value: bool

    def evaluate(self, q, k):
        return np.full(np.broadcast_shapes(q.index.shape, k.index.shape), self.value)

    def predicate(self):
        return sympy.true if self.value else sympy.false

    def describe(self):
        return "every pair" if self.value else "no pair"


@dataclasses.dataclass(frozen=True)
class FirstFrame:
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


@dataclasses.dataclass(frozen=True)
class SpatialWindow:
    """Both video, |df| <= frames, |dh| <= rows, |dw| <= cols (None = unbounded)."""

    frames: int
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
        parts = [f"|frame difference| <= {self.frames}"]
        if self.rows is not None:
            parts.append(f"|row difference| <= {self.rows}")
        if self.cols is not None:
            parts.append(f"|column difference| <= {self.cols}")
        return "spatial window: video pairs with " + ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class TemporalStride:
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


@dataclasses.dataclass(frozen=True)
class Band:
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


@dataclasses.dataclass(frozen=True)
class Prefix:
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


@dataclasses.dataclass(frozen=True)
class Text:
    """q or k is a text token."""

    def evaluate(self, q, k):
        return q.is_text | k.is_text

    def predicate(self):
        return sympy.Or(sympy.Eq(_S["is_text_q"], 1), sympy.Eq(_S["is_text_k"], 1))

    def describe(self):
        return "text tokens attend and are attended globally"


@dataclasses.dataclass(frozen=True)
class CausalFrames:
    """Both video and f_k <= f_q."""

    def evaluate(self, q, k):
        return _both_video(q, k) & (k.frame <= q.frame)

    def predicate(self):
        return sympy.And(_video_pair(), sympy.Le(_S["f_k"], _S["f_q"]))

    def describe(self):
        return "causal over frames: video keys of the same or earlier frames"


@dataclasses.dataclass(frozen=True)
class BlockCausal:
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


@dataclasses.dataclass(frozen=True)
class CubeWindow:
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


@dataclasses.dataclass(frozen=True)
class Predicate:
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


@dataclasses.dataclass(frozen=True)
class AnyOf:
    children: tuple["Node", ...]

    def evaluate(self, q, k):
        return np.logical_or.reduce([c.evaluate(q, k) for c in self.children])

    def predicate(self):
        return sympy.Or(*(c.predicate() for c in self.children))

    def describe(self):
        return "any of: " + "; ".join(c.describe() for c in self.children)


@dataclasses.dataclass(frozen=True)
class AllOf:
    children: tuple["Node", ...]

    def evaluate(self, q, k):
        return np.logical_and.reduce([c.evaluate(q, k) for c in self.children])

    def predicate(self):
        return sympy.And(*(c.predicate() for c in self.children))

    def describe(self):
        return "all of: " + "; ".join(c.describe() for c in self.children)


@dataclasses.dataclass(frozen=True)
class Not:
    child: "Node"

    def evaluate(self, q, k):
        return ~self.child.evaluate(q, k)

    def predicate(self):
        return sympy.Not(self.child.predicate())

    def describe(self):
        return f"not ({self.child.describe()})"


class Node(Protocol):
    """What every mask node provides; `svgen.spec.primitives` lists the node of each spec key
    (`Always` is the only node no spec writes: simplification's constants)."""

    def evaluate(self, q: Coordinates, k: Coordinates) -> np.ndarray: ...

    def predicate(self) -> sympy.Basic: ...

    def describe(self) -> str: ...


# ---------------------------------------------------------------------------------------------
# The oracle for user predicates: sympy -> NumPy, Python integer semantics.

_COORD_OF_SYMBOL = {
    "f": "frame",
    "h": "row",
    "w": "col",
    "i": "index",
}


def _symbol_value(name: str, q: Coordinates, k: Coordinates):
    if name.startswith("is_text_"):
        side = q if name.endswith("_q") else k
        return side.is_text.astype(np.int64)
    coord, side = name.split("_")
    return getattr(q if side == "q" else k, _COORD_OF_SYMBOL[coord])


def evaluate_sympy(expr: sympy.Basic, q: Coordinates, k: Coordinates):
    """Evaluate a predicate or integer expression of svgen.spec.expr on coordinate arrays."""
    return _evaluate(expr, q, k)


def _evaluate(e, q: Coordinates, k: Coordinates):
    """One node of evaluate_sympy. A module-level function, not a closure: a recursive
    closure refers to itself, a reference cycle that would keep q and k (GBs over the
    analysis's batches of pairs) until the garbage collector runs."""
    if e is sympy.true or e is sympy.false:
        return np.bool_(bool(e))
    if isinstance(e, sympy.Symbol):
        return _symbol_value(e.name, q, k)
    if isinstance(e, sympy.Integer):
        return np.int64(int(e))
    args = [_evaluate(a, q, k) for a in e.args]
    if isinstance(e, sympy.Add):
        return sum(args[1:], args[0])
    if isinstance(e, sympy.Mul):
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if isinstance(e, sympy.Abs):
        return np.abs(args[0])
    if isinstance(e, sympy.Min):
        return np.minimum.reduce(np.broadcast_arrays(*args))
    if isinstance(e, sympy.Max):
        return np.maximum.reduce(np.broadcast_arrays(*args))
    if isinstance(e, FloorDiv):
        return args[0] // args[1]
    if isinstance(e, FloorMod):
        return args[0] % args[1]
    relations = {
        sympy.Eq: np.equal,
        sympy.Ne: np.not_equal,
        sympy.Lt: np.less,
        sympy.Le: np.less_equal,
        sympy.Gt: np.greater,
        sympy.Ge: np.greater_equal,
    }
    for cls, fn in relations.items():
        if isinstance(e, cls):
            return fn(args[0], args[1])
    if isinstance(e, sympy.And):
        return np.logical_and.reduce(np.broadcast_arrays(*args))
    if isinstance(e, sympy.Or):
        return np.logical_or.reduce(np.broadcast_arrays(*args))
    if isinstance(e, sympy.Not):
        return np.logical_not(args[0])
    raise TypeError(f"unsupported expression node {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------
# Lowering: spec terms -> nodes.


def band_width_from_density(density: float, video_tokens: int) -> int:
    """w = 128 * ceil(N * (1 - sqrt(1 - d)) / 128): the TPU port's rule (N = video tokens)."""
    return 128 * math.ceil(video_tokens * (1.0 - math.sqrt(1.0 - density)) / 128)


def _where(term: MaskTerm) -> dict:
    w = term.where
    return {} if w is None else {"file": w.file, "line": w.line, "column": w.column, "key": w.key}


def lower(spec: Spec, term: MaskTerm | None = None) -> Node:
    """A mask term of the spec (default: its `mask`) as a simplified node, refs resolved."""
    term = spec.mask if term is None else term
    patterns = dict(spec.patterns)
    order = _pattern_order(term, patterns)
    lowered: dict[str, Node] = {}
    for name in order:
        lowered[name] = _lower_term(patterns[name], spec, lowered)
    node = _lower_term(term, spec, lowered)
    if spec.runtime.kv_cache:
        # Chunked generation: a chunk sees only the frames generated before it and itself,
        # whatever the mask says of later ones (they are not in the cache yet).
        node = AllOf((node, BlockCausal(spec.runtime.chunk_frames)))
    return simplify(node)


def anchor_frames(node: Node) -> int:
    """The most leading frames any first_frame in `node` attends (0 if none)."""
    if isinstance(node, FirstFrame):
        return node.frames
    if isinstance(node, (AnyOf, AllOf)):
        return max(map(anchor_frames, node.children))
    if isinstance(node, Not):
        return anchor_frames(node.child)
    return 0


def _pattern_order(term: MaskTerm, patterns: dict[str, MaskTerm]) -> list[str]:
    """Patterns in dependency order (svgen.spec.dependency_order); unknown names and cycles
    are SpecErrors."""
    known = ", ".join(sorted(patterns)) or "none defined"
    for root in [term] + [t for _, t in sorted(patterns.items())]:
        for ref in root.references():
            if ref.param("name") not in patterns:
                raise SpecError(
                    f"unknown pattern {ref.param('name')!r} (patterns: {known})", **_where(ref)
                )
    if not patterns:  # the common case: nothing to order
        return []
    import networkx as nx

    graph = pattern_graph(patterns)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        chain = " -> ".join([a for a, _ in cycle] + [cycle[0][0]])
        first = patterns[cycle[0][0]]
        raise SpecError(f"patterns refer to each other in a cycle: {chain}", **_where(first))
    return dependency_order(graph)


def _lower_term(term: MaskTerm, spec: Spec, patterns: dict[str, Node]) -> Node:
    primitive = primitives.get(term.op)
    form = primitive.form
    if form == primitives.PATTERN:
        return patterns[term.param("name")]
    if form == primitives.PARAMS:
        return primitive.lower(dict(term.params), spec.geometry)
    if form == primitives.PREDICATE:
        source = term.param("source")
        expr = parse_predicate(source)
        _check_device_range(expr, spec.geometry, term)
        return recognize_builtins(expr, spec.geometry) or primitive.node_class(source, expr)
    children = tuple(_lower_term(c, spec, patterns) for c in term.children)
    if form == primitives.MASKS:
        return primitive.node_class(children)
    assert form == primitives.MASK, form
    return primitive.node_class(children[0])


def _check_device_range(expr, geometry, term: MaskTerm) -> None:
    """Refuse a predicate that int32 cannot evaluate over this geometry (svgen.spec.int_range):
    the analysis would count its pairs exactly and the kernel compute others."""
    domain = int_range.coordinate_domain(
        geometry.frames, geometry.height, geometry.width, geometry.seq_len
    )
    overflow = int_range.int32_overflow(expr, domain)
    if overflow is not None:
        sub, (lo, hi) = overflow
        raise SpecError(
            f"{sub} takes values {lo:,} .. {hi:,} on this geometry, outside the kernel's "
            f"int32 ({int_range.INT32_MIN:,} .. {int_range.INT32_MAX:,}); rewrite the "
            "predicate with smaller factors or offsets",
            **_where(term),
        )


# ---------------------------------------------------------------------------------------------
# Recognizing built-ins in user predicates: a conjunction of coordinate windows is a
# temporal_stride / spatial_window, whose tiles the analysis classifies exactly.


def _difference_of(e, name: str) -> bool:
    """e is +-(name_q - name_k)."""
    q, k = _S[f"{name}_q"], _S[f"{name}_k"]
    return sympy.expand(e - (q - k)) == 0 or sympy.expand(e + (q - k)) == 0


def _window_bound(atom):
    """(coordinate, bound) for |x_q - x_k| <= b (or < b, x_q == x_k); else None."""
    if isinstance(atom, sympy.Eq):
        a, b = atom.args
        for name in ("f", "h", "w"):
            if {a, b} == {_S[f"{name}_q"], _S[f"{name}_k"]}:
                return name, 0
        return None
    if isinstance(atom, (sympy.Ge, sympy.Gt)):  # b >= |d|  ->  |d| <= b
        atom = (sympy.Le if isinstance(atom, sympy.Ge) else sympy.Lt)(atom.args[1], atom.args[0])
    if not isinstance(atom, (sympy.Le, sympy.Lt)):
        return None
    lhs, rhs = atom.args
    if not (isinstance(lhs, sympy.Abs) and isinstance(rhs, sympy.Integer)):
        return None
    bound = int(rhs) - (1 if isinstance(atom, sympy.Lt) else 0)
    for name in ("f", "h", "w"):
        if _difference_of(lhs.args[0], name) and bound >= 0:
            return name, bound
    return None


def _stride_of(atom):
    """s for (f_q - f_k) % s == 0; else None."""
    if isinstance(atom, sympy.Eq) and atom.args[1] == 0 and isinstance(atom.args[0], FloorMod):
        numerator, divisor = atom.args[0].args
        if _difference_of(numerator, "f"):
            return int(divisor)
    return None


def recognize_window(expr, geometry) -> Node | None:
    """The built-in equal to `expr` when it is a conjunction of windows on f, h, w (and an
    optional frame stride), else None. Text tokens (f = h = w = 0) would satisfy such windows,
    so this applies only without text tokens or when the predicate excludes them."""
    atoms = sympy.And.make_args(expr)
    excluded = {a.args[0].name for a in atoms if _text_guard(a) == "video"}
    if geometry.text_tokens and excluded != {"is_text_q", "is_text_k"}:
        return None
    return _window_node([a for a in atoms if _text_guard(a) != "video"], geometry)


def _window_node(atoms, geometry) -> Node | None:
    """The spatial_window / temporal_stride equal, on video pairs, to the conjunction of
    `atoms` (windows |x_q - x_k| <= b on f, h, w and frame strides), else None."""
    bounds: dict[str, int] = {}
    stride = 1
    for atom in atoms:
        window = _window_bound(atom)
        if window is not None:
            bounds[window[0]] = min(bounds.get(window[0], window[1]), window[1])
            continue
        step = _stride_of(atom)
        if step is None:
            return None
        stride = math.lcm(stride, step)
    if not bounds and stride == 1:
        return None
    frames, rows, cols = bounds.get("f"), bounds.get("h"), bounds.get("w")
    if stride == 1:
        return SpatialWindow(geometry.frames - 1 if frames is None else frames, rows, cols)
    return TemporalStride(
        geometry.height - 1 if rows is None else rows,
        geometry.width - 1 if cols is None else cols,
        stride,
        frames,
    )


def _text_guard(atom) -> str | None:
    """'video' / 'text' when the atom says that one token (is_text_q or is_text_k) is a
    video / a text token, else None."""
    if not isinstance(atom, (sympy.Eq, sympy.Ne)):
        return None
    lhs, rhs = atom.args
    if not (lhs.is_Symbol and lhs.name.startswith("is_text_") and rhs in (0, 1)):
        return None
    return "video" if (rhs == 0) == isinstance(atom, sympy.Eq) else "text"


# Recognizing combinations of built-ins: block-causal and causal predicates, frame windows,
# and their and / or / not with windows and text, so that the analysis counts them exactly.

_FRAME_SYMBOLS = frozenset({_S["f_q"], _S["f_k"]})
# Predicates over (f_q, f_k) are compared with built-ins on every pair of frames up to this.
MAX_TABULATED_FRAMES = 1024


def recognize_builtins(expr, geometry) -> Node | None:
    """A combination of built-ins equal to `expr` on every pair of tokens of `geometry`,
    else None: the conjunctions of windows of `recognize_window` (tried first), and any
    and / or / not of them, of relations between the query's and the key's frame equal to
    a `block_causal`, `causal_frames`, frame window or `first_frame` on this geometry's
    frames (`f_k // 3 <= f_q // 3`), and of text terms (`is_text_q or is_text_k` is `text`;
    `not is_text_q and not is_text_k` restricts the rest to video pairs)."""
    return recognize_window(expr, geometry) or _recognize(expr, geometry, not geometry.text_tokens)


def _recognize(e, geometry, video: bool) -> Node | None:
    """A node equal to `e` on every pair (video=False) or on video pairs (video=True)."""
    if e is sympy.true or e is sympy.false:
        return Always(bool(e))
    if video and e.free_symbols <= _FRAME_SYMBOLS:
        node = _frame_relation(e, geometry.frames)
        if node is not None:
            return node
    if isinstance(e, sympy.Not):
        child = _recognize(e.args[0], geometry, video)
        return None if child is None else Not(child)
    if isinstance(e, sympy.Or):
        return _recognize_or(sympy.Or.make_args(e), geometry, video)
    if isinstance(e, sympy.And):
        return _recognize_and(sympy.And.make_args(e), geometry, video)
    return _window_node([e], geometry) if video else None


def _recognize_or(terms, geometry, video: bool) -> Node | None:
    """`is_text_q or is_text_k` among the terms is `text`, which holds on every pair with a
    text token: the other terms then only need to agree on video pairs."""
    text = {t.args[0].name for t in terms if _text_guard(t) == "text"}
    if text == {"is_text_q", "is_text_k"}:
        rest = [_recognize(t, geometry, True) for t in terms if _text_guard(t) != "text"]
        return None if None in rest else AnyOf((*rest, Text()))
    children = [_recognize(t, geometry, video) for t in terms]
    return None if None in children else AnyOf(tuple(children))


def _recognize_and(terms, geometry, video: bool) -> Node | None:
    """Guards `not is_text_q and not is_text_k` make the rest a question on video pairs
    (and the result must then keep no text pair); windows merge into one built-in."""
    guards = {t.args[0].name for t in terms if _text_guard(t) == "video"}
    guarded = guards == {"is_text_q", "is_text_k"}
    if not (video or guarded):
        return None
    rest = [t for t in terms if _text_guard(t) != "video"]
    windows = [t for t in rest if _window_bound(t) is not None or _stride_of(t) is not None]
    children = [_recognize(t, geometry, True) for t in rest if t not in windows]
    if windows:
        children.append(_window_node(windows, geometry))
    if None in children:
        return None
    if not video and not _excludes_text(AllOf(tuple(children))):
        children.append(SpatialWindow(geometry.frames - 1, None, None))  # video pairs only
    if not children:  # guards alone, and every pair is a video pair
        return Always(True)
    return AllOf(tuple(children)) if len(children) > 1 else children[0]


def _excludes_text(node: Node) -> bool:
    """True when the node keeps no pair with a text token."""
    if isinstance(node, (SpatialWindow, TemporalStride, CausalFrames, BlockCausal)):
        return True
    if isinstance(node, AllOf):
        return any(map(_excludes_text, node.children))
    if isinstance(node, AnyOf):
        return all(map(_excludes_text, node.children))
    return isinstance(node, Always) and not node.value


def _frame_relation(e, frames: int) -> Node | None:
    """The built-in (or its complement) equal to a relation between f_q and f_k on every
    pair of video frames: compared on the whole frames x frames table."""
    if frames > MAX_TABULATED_FRAMES:
        return None
    f = np.arange(frames, dtype=np.int64)
    zero = np.zeros(frames, np.int64)
    q = Coordinates(f[:, None], zero[:, None], zero[:, None], zero[:, None], zero[:, None] > 0)
    k = Coordinates(f[None, :], zero[None, :], zero[None, :], zero[None, :], zero[None, :] > 0)
    table = np.broadcast_to(evaluate_sympy(e, q, k), (frames, frames))
    for wanted, wrap in ((table, lambda n: n), (~table, Not)):
        for node in _frame_candidates(wanted):
            if np.array_equal(node.evaluate(q, k), wanted):
                return wrap(node)
    return None


def _frame_candidates(table: np.ndarray):
    """Built-ins a frames x frames table could be, their parameter read off its first row
    (the keys frame 0 attends: f_k < n for block_causal and first_frame, f_k <= a for a
    frame window)."""
    n = int(table[0].sum())
    if n == 0:
        return []
    return [
        CausalFrames() if n == 1 else BlockCausal(n),
        SpatialWindow(n - 1, None, None),
        FirstFrame(n),
    ]


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
