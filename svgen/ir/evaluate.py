"""The oracle for user predicates: a sympy expression of svgen.spec.expr evaluated on NumPy
coordinate arrays, with Python's integer semantics (floor division and modulo)."""

from __future__ import annotations


import numpy as np
import sympy

from svgen.spec.expr import FloorDiv, FloorMod
from svgen.core.layout import Coordinates


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
