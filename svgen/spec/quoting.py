"""Strings from outside svgen (a data mask's file name, an .npz member's name, the spec's
path, the output folder) as svgen writes them into a generated module, a message or a
report: one function, `safe_text`, so that no name can become code.

A spec is data: a generated module's docstring and comments may name a file, but a file
name holding `\"\"\"` or a line break must not close the docstring or end the comment and
run what follows when the module is imported. A name that is plain (printable, with no
backslash and no double quote: every name svgen ships) is written as it is; any other is
written as a Python string literal in double quotes, escaped down to printable ASCII.
"""

from __future__ import annotations

import ast

_QUOTE = '"'


def is_plain(value: str) -> bool:
    """Whether `value` may stand as it is in a docstring, a comment or a message: printable
    (no line break, NUL, other control character or lone surrogate) and free of the
    backslash and double quote that could escape or close a docstring."""
    return value.isprintable() and "\\" not in value and _QUOTE not in value


def safe_text(value: str) -> str:
    """`value` itself when it is plain (is_plain), else its Python literal in double quotes
    with every backslash, double quote and character that is not printable ASCII escaped.
    The escaped form is printable ASCII: it cannot end a comment's line, close a docstring
    or hold a NUL, and `unquoted` (ast.literal_eval) gives the string back."""
    if is_plain(value):
        return value
    body = value.encode("unicode_escape").decode("ascii")
    return _QUOTE + body.replace(_QUOTE, "\\" + _QUOTE) + _QUOTE


def unquoted(text: str) -> str:
    """The string `safe_text` wrote as `text` (a plain one is itself: it never starts with a
    double quote)."""
    if not text.startswith(_QUOTE):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text


def control_character(value: str) -> str | None:
    """The first character of `value` that is not printable (a line break, NUL, tab or
    other control character), as an escape (`'\\n'`), or None: for the errors that refuse
    such names where svgen can say where they came from."""
    for char in value:
        if not char.isprintable():
            return repr(char)
    return None
