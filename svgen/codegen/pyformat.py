"""Generated Python laid out the way `ruff format` lays it out (line length 100), so that the
checked-in modules pass the same formatter check as the hand-written code.

Codegen emits few shapes of statement: assignments of boolean chains (mask lines), tuples of
names or numbers, and calls whose arguments are one per line with a trailing comma (which the
formatter keeps exploded). Only those are handled here; tests/test_code_lint.py runs the real
formatter over rendered modules of random masks to keep this honest.
"""

from __future__ import annotations

from svgen.analysis.code_text import is_group

LINE_LENGTH = 100
INDENT = "    "
_OPERATORS = ("|", "^", "&")  # lowest precedence first: the formatter splits there first


def string(value: str) -> str:
    """A double-quoted string literal (names and dtypes: no quotes or backslashes inside)."""
    if '"' in value or "\\" in value:
        raise ValueError(f"not a plain literal: {value!r}")
    return f'"{value}"'


def literal_tuple(items: list[str]) -> str:
    """(a, b) / (a,) / () on one line."""
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def assignment(target: str, value: str, depth: int) -> list[str]:
    """`target = value` at `depth` indents: one line when it fits, else the value in
    parentheses, split before its lowest-precedence operators (recursively)."""
    indent = INDENT * depth
    line = f"{indent}{target} = {value}"
    if len(line) <= LINE_LENGTH:
        return [line]
    if _is_tuple(value):
        return [f"{indent}{target} = ("] + _tuple_items(value, depth + 1) + [f"{indent})"]
    call = _call_parts(value)
    if call is not None and not any(len(_split_top(value, op)) > 1 for op in _OPERATORS):
        # One call: the formatter opens the call's own parentheses (arguments on one line,
        # else one per line with a trailing comma), not a new pair around it.
        function, arguments = call
        inner_indent = INDENT * (depth + 1)
        if len(inner_indent + arguments) <= LINE_LENGTH:
            body = [inner_indent + arguments]
        else:
            body = _tuple_items(f"({arguments})", depth + 1)
        return [f"{indent}{target} = {function}("] + body + [f"{indent})"]
    inner = _unwrap(value)
    return [f"{indent}{target} = ("] + _chain(inner, depth + 1) + [f"{indent})"]


def _chain(expr: str, depth: int) -> list[str]:
    """expr on one line at this depth when it fits, else split at its top-level operator, one
    operand per line (operator first)."""
    indent = INDENT * depth
    if len(indent + expr) <= LINE_LENGTH:
        return [indent + expr]
    for op in _OPERATORS:
        operands = _split_top(expr, op)
        if len(operands) > 1:
            break
    else:
        return [indent + expr]  # atomic: left as it is (the formatter would split a call)
    lines = []
    for i, operand in enumerate(operands):
        prefix = "" if i == 0 else f"{op} "
        if len(indent + prefix + operand) <= LINE_LENGTH or not is_group(operand):
            lines.append(indent + prefix + operand)
        else:  # a parenthesized group that does not fit: open it
            lines.append(indent + prefix + "(")
            lines += _chain(operand[1:-1], depth + 1)
            lines.append(indent + ")")
    return lines


def _split_top(expr: str, op: str) -> list[str]:
    """The operands of `op` at parenthesis depth 0 (operators written ` op `)."""
    return _split_outside_brackets(expr, f" {op} ")


def _split_outside_brackets(expr: str, token: str) -> list[str]:
    """expr split at each `token` that no bracket encloses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(expr):
        ch = expr[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and expr.startswith(token, i):
            parts.append(expr[start:i])
            i += len(token)
            start = i
            continue
        i += 1
    parts.append(expr[start:])
    return parts


def _call_parts(expr: str) -> tuple[str, str] | None:
    """(function, arguments) of `function(arguments)`, or None."""
    open_at = expr.find("(")
    if open_at <= 0 or not expr[:open_at].replace(".", "").replace("_", "").isalnum():
        return None
    if not is_group(expr[open_at:]):
        return None
    return expr[:open_at], expr[open_at + 1 : -1]


def _unwrap(expr: str) -> str:
    return expr[1:-1] if is_group(expr) else expr


def _is_tuple(value: str) -> bool:
    return is_group(value) and len(_split_outside_brackets(value[1:-1], ",")) > 1


def _tuple_items(value: str, depth: int) -> list[str]:
    items = [item.strip() for item in _split_outside_brackets(value[1:-1], ",") if item.strip()]
    return [f"{INDENT * depth}{item}," for item in items]
