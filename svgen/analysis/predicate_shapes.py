"""The shapes of a conjunction's sympy comparisons that the mask printer (mask_code) fuses
into one call: windows 0 <= x <= c written as two bounds or as |x| <= c, one-sided bounds,
equalities of a query-side and a key-side value, and same residues. Each function reads an
expression and says what shape it has; none prints."""

from __future__ import annotations

import sympy

from svgen.spec.expr import FloorDiv, FloorMod, abs_upper_bound, split_sides


def non_negative(e):
    """x with e <=> x >= 0, for an integer comparison e (None for other conjuncts)."""
    if isinstance(e, sympy.Le):
        return sympy.expand(e.args[1] - e.args[0])
    if isinstance(e, sympy.Ge):
        return sympy.expand(e.args[0] - e.args[1])
    if isinstance(e, sympy.Lt):
        return sympy.expand(e.args[1] - e.args[0] - 1)
    if isinstance(e, sympy.Gt):
        return sympy.expand(e.args[0] - e.args[1] - 1)
    return None


def chain_pairs(args: list, accept) -> list[tuple]:
    """(first, second, x, c) for each pair of conjuncts x >= 0 and x <= c, a window
    a <= y <= a + c written as two comparisons (x = y - a, or its mirror a + c - y): first
    before second in `args`, each conjunct in one pair at most, x accepted by `accept`."""
    lows = [non_negative(a) for a in args]
    pairs, used = [], set()
    for i, x in enumerate(lows):
        if x is None or i in used or not accept(x):
            continue
        for j in range(i + 1, len(lows)):
            if lows[j] is None or j in used:
                continue
            width = sympy.expand(x + lows[j])
            if isinstance(width, sympy.Integer) and int(width) >= 0:
                pairs.append((args[i], args[j], x, int(width)))
                used |= {i, j}
                break
    return pairs


def divides(e) -> bool:
    return bool(e.atoms(FloorDiv, FloorMod))


def key_side_positive(a, b, width: int) -> tuple:
    """(a, b), or the same window as (width - a, -b) (0 <= x <= width exactly when
    0 <= width - x <= width) when b's leading coefficient is negative: `6 * q.frame + 24,
    6 * k.frame` rather than `24 - 6 * q.frame, (-6) * k.frame`."""
    lead = sympy.Add.make_args(sympy.expand(b))[0]
    if lead.as_coeff_Mul()[0].is_negative:
        return sympy.expand(width - a), sympy.expand(-b)
    return a, b


def abs_window(e) -> tuple | None:
    """(a, b, 2c) for |x| <= c with x + c = a - b split by side (split_sides)."""
    found = abs_upper_bound(e)
    if found is None:
        return None
    x, bound = found
    sides = split_sides(x + bound)
    return None if sides is None else (*sides, 2 * bound)


def equality_sides(e) -> tuple | None:
    """(a, b) for an equality a == b between a query-side and a key-side value, or a same
    residue (a - b) % d == 0 as (a % d, b % d); None for any other."""
    return same_residue(e) or split_sides(e.args[0] - e.args[1])


def same_residue(e) -> tuple | None:
    """(a % d, b % d) for (a - b) % d == 0 or != 0, a reading only query and b only key
    coordinates: the same residue (floor modulo of integers) or not, one full-block compare
    of a query-side and a key-side value, where the modulo of the difference is a subtract,
    a modulo (a bitwise and by a power of two) and a compare on every pair (a dilated
    neighborhood's parity, the frame-decay spec's stride)."""
    mod, zero = e.args
    if isinstance(mod, sympy.Integer):
        mod, zero = zero, mod
    if not (isinstance(mod, FloorMod) and zero == 0):
        return None
    sides = split_sides(mod.args[0])
    if sides is None:
        return None
    d = mod.args[1]
    return FloorMod(sides[0], d), FloorMod(sides[1], d)


def mixes_sides(e) -> bool:
    """Reads both a query and a key coordinate: printed, an op on every pair of a block."""
    sides = {s.name[-1] for s in e.free_symbols}
    return sides == {"q", "k"}
