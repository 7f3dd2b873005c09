"""Recognizing built-ins in user predicates: a conjunction of coordinate windows is a
temporal_stride / spatial_window, a frame relation a union of frame built-ins, whose tiles
the analysis classifies exactly (and whose kernels test no coordinates on FULL tiles)."""

from __future__ import annotations

import math

import numpy as np
import sympy

from svgen.spec.expr import SYMBOLS, FloorMod
from svgen.core.layout import Coordinates

from svgen.ir.evaluate import evaluate_sympy
from svgen.ir.nodes import (
    AllOf,
    Always,
    AnyOf,
    BlockCausal,
    CausalFrames,
    FirstFrame,
    Node,
    Not,
    SpatialWindow,
    TemporalStride,
    Text,
)

_S = SYMBOLS


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
    if not video and not AllOf(tuple(children)).excludes_text():
        children.append(SpatialWindow(geometry.frames - 1, None, None))  # video pairs only
    if not children:  # guards alone, and every pair is a video pair
        return Always(True)
    return AllOf(tuple(children)) if len(children) > 1 else children[0]


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
