"""Parentheses in the printer's own output: the mask printer (mask_code) drops a pair that
encloses a whole operand, and codegen's line breaker (svgen.codegen.pyformat) splits inside
one. Both know the shape of what they print (binary operators with spaces around them, unary
minus without); nothing here reads code back to learn what it means."""

from __future__ import annotations


def is_group(s: str) -> bool:
    """Whether printed code `s` is one parenthesized group, (...)."""
    if not (s.startswith("(") and s.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def strip_group(s: str) -> str:
    """Drop one pair of enclosing parentheses when they enclose the whole string."""
    return s[1:-1] if is_group(s) else s


def is_sum(s: str) -> bool:
    """Whether a printed expression has a binary + or - outside all parentheses."""
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and s.startswith((" + ", " - "), i):
            return True
    return False
