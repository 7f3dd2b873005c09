"""Exact value ranges of predicate sub-expressions, and the device's integer type.

The kernels (TPU and GPU) evaluate a BOUNDARY block's predicate in int32, while the analysis
evaluates it exactly (Python or int64 integers). A predicate whose sub-expression leaves
int32 over the geometry would be analyzed right and computed wrong, silently: a product
wraps negative and flips a comparison. So every integer sub-expression of a user predicate
is bounded here with Python integers (no overflow, however large the literals) over the
whole geometry and refused when it does not fit, before the analysis starts.

Checking every sub-expression is stricter than needed: int32 +, - and * wrap modulo 2^32, so
a sum whose own value fits is right even if a partial sum wrapped. Only the operands of
`//`, `%`, comparisons, `abs`, `min` and `max` must be exact; but a user reads "this
sub-expression does not fit" more easily than a rule about which ones must, and no
realistic predicate comes near 2^31. The printed forms svgen adds itself are checked
too: the non-negative shift of a floor division's dividend (svgen.analysis.mask_code).
"""

from __future__ import annotations

import sympy

from svgen.spec.expr import FloorDiv, FloorMod

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

Range = tuple[int, int]


def coordinate_domain(frames: int, height: int, width: int, seq_len: int) -> dict[str, Range]:
    """The range of every predicate symbol over a geometry (text tokens read 0 for f, h, w)."""
    per_coord = {
        "f": (0, frames - 1),
        "h": (0, height - 1),
        "w": (0, width - 1),
        "i": (0, seq_len - 1),
        "is_text": (0, 1),
    }
    return {f"{c}_{side}": r for c, r in per_coord.items() for side in ("q", "k")}


def value_range(e, domain: dict[str, Range]) -> Range:
    """(lo, hi) of an integer expression over `domain`, in exact integers (interval
    arithmetic: the true range lies inside, the bounds may be loose)."""
    if isinstance(e, sympy.Symbol):
        return domain[e.name]
    if isinstance(e, sympy.Integer):
        return int(e), int(e)
    args = [value_range(a, domain) for a in e.args]
    if isinstance(e, sympy.Add):
        return sum(lo for lo, _ in args), sum(hi for _, hi in args)
    if isinstance(e, sympy.Mul):
        product = args[0]
        for other in args[1:]:
            corners = [a * b for a in product for b in other]
            product = (min(corners), max(corners))
        return product
    if isinstance(e, sympy.Abs):
        (lo, hi) = args[0]
        return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if isinstance(e, (sympy.Min, sympy.Max)):
        pick = min if isinstance(e, sympy.Min) else max
        return pick(lo for lo, _ in args), pick(hi for _, hi in args)
    if isinstance(e, FloorDiv):
        (lo, hi), (d, _) = args
        return lo // d, hi // d  # monotone in the dividend for a positive divisor
    if isinstance(e, FloorMod):
        (lo, hi), (d, _) = args
        return (lo % d, hi % d) if lo // d == hi // d else (0, d - 1)
    raise TypeError(f"not an integer expression: {type(e).__name__}: {e}")


def non_negative_shift(dividend, divisor: int, domain: dict[str, Range]) -> int:
    """The multiple of `divisor` that makes `dividend` non-negative over `domain` (0 when it
    is already): floor(x / d) = lax.div(x + s, d) - s / d, which lax.div needs since it
    truncates toward zero."""
    lo, _ = value_range(dividend, domain)
    return -(lo // divisor) * divisor if lo < 0 else 0


def int32_overflow(predicate, domain: dict[str, Range]) -> tuple[str, Range] | None:
    """(the first sub-expression, printed as sympy writes it, and its range) whose value may
    leave int32 over `domain`, counting the shifted dividends of `//` and `%`; None if all
    fit."""
    for sub in sympy.preorder_traversal(predicate):
        if not _is_integer_valued(sub):
            continue
        lo, hi = value_range(sub, domain)
        if lo < INT32_MIN or hi > INT32_MAX:
            return str(sub), (lo, hi)
        if isinstance(sub, (FloorDiv, FloorMod)):
            dividend, divisor = sub.args
            shift = non_negative_shift(dividend, int(divisor), domain)
            lo, hi = value_range(dividend, domain)
            if hi + shift > INT32_MAX:
                return f"{dividend} + {shift}", (lo + shift, hi + shift)
    return None


def _is_integer_valued(e) -> bool:
    return isinstance(
        e,
        (sympy.Symbol, sympy.Integer, sympy.Add, sympy.Mul, sympy.Abs, sympy.Min, sympy.Max),
    ) or isinstance(e, (FloorDiv, FloorMod))
