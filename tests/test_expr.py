"""Tests for svgen.spec.expr: the whitelist predicate parser."""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
import sympy

from svgen import ir
from svgen.analysis import choose_layout
from svgen.spec.errors import SpecError
from svgen.spec.expr import (
    MAX_EXPR_NODES,
    SYMBOLS,
    ExprSyntaxError,
    FloorDiv,
    FloorMod,
    free_symbol_names,
    parse_predicate,
    predicate_tokens,
)
from svgen.spec.limits import MAX_EXPR_CHARS, MAX_EXPR_DEPTH, MAX_EXPR_LITERAL, MAX_EXPR_TOKENS
from svgen.core.layout import TokenLayout
from svgen.spec import parse_spec

from helpers import brute_force_kinds, dense_keep, mask_spec_text
from kernel_helpers import emitted_function, emitted_keep

NAMES = tuple(SYMBOLS)


# ----------------------------------------------------------------------------- a test-only evaluator


def _ev(e, env):
    """Evaluate a parsed predicate with Python integer semantics (independent of sympy folding)."""
    if isinstance(e, sympy.Symbol):
        return env[e.name]
    if isinstance(e, sympy.Integer):
        return int(e)
    if e is sympy.true:
        return True
    if e is sympy.false:
        return False
    if isinstance(e, sympy.Add):
        return sum(_ev(a, env) for a in e.args)
    if isinstance(e, sympy.Mul):
        out = 1
        for a in e.args:
            out *= _ev(a, env)
        return out
    if isinstance(e, sympy.Pow):
        assert e.exp.is_Integer and int(e.exp) >= 0
        return _ev(e.base, env) ** int(e.exp)
    if isinstance(e, sympy.Abs):
        return abs(_ev(e.args[0], env))
    if isinstance(e, sympy.Min):
        return min(_ev(a, env) for a in e.args)
    if isinstance(e, sympy.Max):
        return max(_ev(a, env) for a in e.args)
    if isinstance(e, FloorDiv):
        return _ev(e.args[0], env) // _ev(e.args[1], env)
    if isinstance(e, FloorMod):
        return _ev(e.args[0], env) % _ev(e.args[1], env)
    rel = {
        sympy.Eq: lambda a, b: a == b,
        sympy.Ne: lambda a, b: a != b,
        sympy.Lt: lambda a, b: a < b,
        sympy.Le: lambda a, b: a <= b,
        sympy.Gt: lambda a, b: a > b,
        sympy.Ge: lambda a, b: a >= b,
    }
    for cls, fn in rel.items():
        if isinstance(e, cls):
            return fn(_ev(e.lhs, env), _ev(e.rhs, env))
    if isinstance(e, sympy.And):
        return all(_ev(a, env) for a in e.args)
    if isinstance(e, sympy.Or):
        return any(_ev(a, env) for a in e.args)
    if isinstance(e, sympy.Not):
        return not _ev(e.args[0], env)
    raise AssertionError(f"unexpected node {type(e).__name__}: {e}")


def _envs(n, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        env = {name: rng.randint(0, 12) for name in NAMES}
        env["is_text_q"] = rng.randint(0, 1)
        env["is_text_k"] = rng.randint(0, 1)
        out.append(env)
    return out


ENVS = _envs(200)

# (predicate text, Python reference with Python semantics)
VALID = [
    ("f_q == f_k", lambda e: e["f_q"] == e["f_k"]),
    ("f_q <= f_k", lambda e: e["f_q"] <= e["f_k"]),
    ("abs(f_q - f_k) <= 1", lambda e: abs(e["f_q"] - e["f_k"]) <= 1),
    (
        "abs(h_q - h_k) <= 2 and abs(w_q - w_k) <= 3",
        lambda e: abs(e["h_q"] - e["h_k"]) <= 2 and abs(e["w_q"] - e["w_k"]) <= 3,
    ),
    ("f_q // 4 == f_k // 4", lambda e: e["f_q"] // 4 == e["f_k"] // 4),
    ("(f_q - f_k) // 3 == -1", lambda e: (e["f_q"] - e["f_k"]) // 3 == -1),
    ("(h_q - h_k) % 4 == 3", lambda e: (e["h_q"] - e["h_k"]) % 4 == 3),
    ("(i_q - i_k) % 5 < 2 or f_k == 0", lambda e: (e["i_q"] - e["i_k"]) % 5 < 2 or e["f_k"] == 0),
    ("i_k // (2 * 3) != 1", lambda e: e["i_k"] // 6 != 1),
    ("i_k // (7 - 5) * 3 > h_q", lambda e: (e["i_k"] // 2) * 3 > e["h_q"]),
    ("0 <= f_q - f_k < 3", lambda e: 0 <= e["f_q"] - e["f_k"] < 3),
    ("f_q < f_k <= h_q != w_q", lambda e: e["f_q"] < e["f_k"] <= e["h_q"] != e["w_q"]),
    ("1 + 2 * 3 == f_q", lambda e: 1 + 2 * 3 == e["f_q"]),
    ("(1 + 2) * 3 == f_q", lambda e: (1 + 2) * 3 == e["f_q"]),
    ("f_q - f_k - h_q < 0", lambda e: e["f_q"] - e["f_k"] - e["h_q"] < 0),
    ("-f_q * 2 + 11 > h_k", lambda e: -e["f_q"] * 2 + 11 > e["h_k"]),
    ("- -f_q == +f_q", lambda e: True),
    ("f_q * f_k >= h_q * 3", lambda e: e["f_q"] * e["f_k"] >= e["h_q"] * 3),
    ("f_q * f_q > 30", lambda e: e["f_q"] * e["f_q"] > 30),
    ("-7 // 2 == -4 and -7 % 2 == 1", lambda e: True),
    ("f_q - 20 // 3 < 0", lambda e: e["f_q"] - 20 // 3 < 0),
    ("min(f_q, f_k) == 0", lambda e: min(e["f_q"], e["f_k"]) == 0),
    (
        "max(f_q, f_k, h_q) - min(w_q, w_k) >= 5",
        lambda e: max(e["f_q"], e["f_k"], e["h_q"]) - min(e["w_q"], e["w_k"]) >= 5,
    ),
    ("not f_q == f_k", lambda e: not e["f_q"] == e["f_k"]),
    ("not f_q < 3 and f_k < 3", lambda e: (not e["f_q"] < 3) and e["f_k"] < 3),
    ("not (f_q < 3 and f_k < 3)", lambda e: not (e["f_q"] < 3 and e["f_k"] < 3)),
    ("f_q < 2 or f_k < 2 and h_q < 2", lambda e: e["f_q"] < 2 or (e["f_k"] < 2 and e["h_q"] < 2)),
    ("(f_q < 2 or f_k < 2) and h_q < 2", lambda e: (e["f_q"] < 2 or e["f_k"] < 2) and e["h_q"] < 2),
    ("not not f_q > 6", lambda e: e["f_q"] > 6),
    ("is_text_q", lambda e: e["is_text_q"] == 1),
    ("is_text_q or is_text_k", lambda e: e["is_text_q"] == 1 or e["is_text_k"] == 1),
    ("not is_text_k and (is_text_q)", lambda e: e["is_text_k"] != 1 and e["is_text_q"] == 1),
    ("is_text_q + is_text_k == 1", lambda e: e["is_text_q"] + e["is_text_k"] == 1),
    ("is_text_q == 0 and i_q >= i_k", lambda e: e["is_text_q"] == 0 and e["i_q"] >= e["i_k"]),
    ("true", lambda e: True),
    ("false or f_q == 1", lambda e: e["f_q"] == 1),
    ("true and false", lambda e: False),
    ("f_q >= 0", lambda e: True),
    ("f_q < f_q", lambda e: False),
    ("\n  f_q\t<=\n f_k  ", lambda e: e["f_q"] <= e["f_k"]),
    ("abs(f_q - 12) // 5 % 2 == 1", lambda e: abs(e["f_q"] - 12) // 5 % 2 == 1),
    # booleans compared with == and != (a segment mask), chained like Python
    ("(f_q < 3) == (f_k < 3)", lambda e: (e["f_q"] < 3) == (e["f_k"] < 3)),
    ("(f_q < 3) != (f_k < 3)", lambda e: (e["f_q"] < 3) != (e["f_k"] < 3)),
    ("not (f_q < 3) == (f_k < 3)", lambda e: not (e["f_q"] < 3) == (e["f_k"] < 3)),
    (
        "(i_q % 2 == 0) == (i_k % 2 == 0) == (h_q < 6)",
        lambda e: (e["i_q"] % 2 == 0) == (e["i_k"] % 2 == 0) == (e["h_q"] < 6),
    ),
    (
        "(f_q // 4 == 1) != (f_k // 4 == 1) or w_q == w_k",
        lambda e: (e["f_q"] // 4 == 1) != (e["f_k"] // 4 == 1) or e["w_q"] == e["w_k"],
    ),
    ("is_text_q == (f_k < 5)", lambda e: e["is_text_q"] == (e["f_k"] < 5)),
    ("(h_q > 4) != is_text_k", lambda e: (e["h_q"] > 4) != e["is_text_k"]),
    ("(true == (f_q < 4)) != false", lambda e: e["f_q"] < 4),
]


@pytest.mark.parametrize("text,ref", VALID, ids=[t for t, _ in VALID])
def test_valid_predicates_match_python_semantics(text, ref):
    expr = parse_predicate(text)
    assert isinstance(expr, sympy.logic.boolalg.Boolean)
    for env in ENVS:
        assert bool(_ev(expr, env)) == bool(ref(env)), (text, env)


@pytest.mark.parametrize("text,ref", VALID[:12], ids=[t for t, _ in VALID[:12]])
def test_sympy_substitution_agrees(text, ref):
    # sympy's own folding (FloorDiv/FloorMod.eval on Integers) gives the same answers.
    expr = parse_predicate(text)
    for env in ENVS[:5]:
        value = expr.subs({SYMBOLS[n]: v for n, v in env.items()})
        assert value in (sympy.true, sympy.false)
        assert bool(value) == bool(ref(env))


def test_floor_semantics_on_negative_numerators():
    for a in range(-13, 14):
        for b in (1, 2, 3, 7):
            assert FloorDiv(sympy.Integer(a), sympy.Integer(b)) == a // b
            assert FloorMod(sympy.Integer(a), sympy.Integer(b)) == a % b
    assert FloorDiv(sympy.Integer(-7), sympy.Integer(2)) == -4
    assert FloorMod(sympy.Integer(-7), sympy.Integer(2)) == 1
    x = SYMBOLS["f_q"]
    assert isinstance(FloorDiv(x, 2), FloorDiv)  # stays unevaluated
    assert isinstance(FloorMod(x - 3, 4), FloorMod)
    assert FloorDiv(x, 2).subs(x, 3) == 1


def test_result_structure():
    f_q, f_k, h_q = SYMBOLS["f_q"], SYMBOLS["f_k"], SYMBOLS["h_q"]
    assert parse_predicate("f_q // 2 == f_k") == sympy.Eq(FloorDiv(f_q, 2), f_k)
    assert parse_predicate("f_q % 3 != 0") == sympy.Ne(FloorMod(f_q, 3), 0)
    assert parse_predicate("f_q < f_k <= h_q") == sympy.And(sympy.Lt(f_q, f_k), sympy.Le(f_k, h_q))
    assert parse_predicate("is_text_k") == sympy.Eq(SYMBOLS["is_text_k"], 1)
    assert parse_predicate("f_q >= 0") is sympy.true
    assert parse_predicate("false") is sympy.false
    assert parse_predicate("abs(f_q - f_k) < 2") == sympy.Lt(sympy.Abs(f_q - f_k), 2)
    assert parse_predicate("i_k // (4 - 2) == 0") == sympy.Eq(FloorDiv(SYMBOLS["i_k"], 2), 0)


def test_boolean_equality_is_built_from_and_or_not():
    # The analysis, the IR's evaluation and the printer know And / Or / Not, not
    # sympy's Equivalent / Xor.
    a, b = sympy.Lt(SYMBOLS["f_q"], 2), sympy.Lt(SYMBOLS["f_k"], 2)
    same = sympy.Or(sympy.And(a, b), sympy.And(sympy.Not(a), sympy.Not(b)))
    differ = sympy.Or(sympy.And(a, sympy.Not(b)), sympy.And(sympy.Not(a), b))
    assert parse_predicate("(f_q < 2) == (f_k < 2)") == same
    assert parse_predicate("(f_q < 2) != (f_k < 2)") == differ
    text = sympy.Eq(SYMBOLS["is_text_q"], 1)
    assert parse_predicate("is_text_q == (f_k < 2)") == sympy.Or(
        sympy.And(text, b), sympy.And(sympy.Not(text), sympy.Not(b))
    )
    # Two bare text flags are integers, compared as such.
    assert parse_predicate("is_text_q == is_text_k") == sympy.Eq(
        SYMBOLS["is_text_q"], SYMBOLS["is_text_k"]
    )
    # Without parentheses it is Python's chain, not a boolean equality.
    assert parse_predicate("f_q < 2 == f_k") == sympy.And(
        sympy.Lt(SYMBOLS["f_q"], 2), sympy.Eq(2, SYMBOLS["f_k"])
    )


def test_symbols_and_free_symbol_names():
    for name, sym in SYMBOLS.items():
        assert sym.name == name
        assert sym.is_integer and sym.is_nonnegative
    assert set(SYMBOLS) == {
        "f_q",
        "h_q",
        "w_q",
        "f_k",
        "h_k",
        "w_k",
        "i_q",
        "i_k",
        "is_text_q",
        "is_text_k",
    }
    assert free_symbol_names(parse_predicate("w_k < f_q and is_text_q")) == (
        "f_q",
        "is_text_q",
        "w_k",
    )
    assert free_symbol_names(parse_predicate("true")) == ()


ALLOWED = "f_q, h_q, w_q, f_k, h_k, w_k, i_q, i_k, is_text_q, is_text_k"
MIXED = (
    "compares an integer with a boolean; compare two integers, or two comparisons in "
    "parentheses: (f_q < 2) == (f_k < 2)"
)
POWER = "'**' is not supported: predicates have no powers; write the product out (f_q * f_q)"

# (text, exact message, offset)
INVALID = [
    ("", "empty predicate: expected a boolean expression", 0),
    ("   ", "empty predicate: expected a boolean expression", 0),
    ("f_q", "the predicate must be a boolean expression, got an integer expression", 0),
    ("  f_q + 1", "the predicate must be a boolean expression, got an integer expression", 2),
    ("x < 1", f"unknown name 'x'; allowed names: {ALLOWED}", 0),
    ("f_q < frame", f"unknown name 'frame'; allowed names: {ALLOWED}", 6),
    ("sqrt(f_q) < 1", "unknown function 'sqrt'; allowed functions: abs, min, max", 0),
    ("f_q < 1 $", "unexpected character '$'", 8),
    ("f_q / 2 == 1", "'/' is not supported; use '//' for floor division", 4),
    ("f_q = 1", "unexpected '='; use '==' to compare", 4),
    ("f_q < 1 && f_k < 1", "unexpected '&&'; use 'and'", 8),
    ("!is_text_q", "unexpected '!'; use 'not' or '!='", 0),
    ("(f_q < 1", "unbalanced '(': missing ')'", 0),
    ("f_q < (1 + (2)", "unbalanced '(': missing ')'", 6),
    ("f_q < 1)", "unbalanced ')': no matching '('", 7),
    ("f_q < 1 f_k", "unexpected 'f_k' after a complete expression", 8),
    ("f_q <", "unexpected end of expression: expected an operand", 5),
    ("f_q < * 2", "unexpected '*': expected an operand", 6),
    ("()", "unexpected ')': expected an operand", 1),
    ("f_q // f_k == 0", "divisor of '//' must be a positive integer literal", 7),
    ("f_q % 0 == 0", "divisor of '%' must be a positive integer literal", 6),
    ("f_q // -2 == 0", "divisor of '//' must be a positive integer literal", 7),
    ("f_q // (1 - 3) == 0", "divisor of '//' must be a positive integer literal", 7),
    ("f_q and f_k < 1", "'and' needs boolean operands", 0),
    ("f_q < 1 or 2", "'or' needs boolean operands", 11),
    ("not f_q", "'not' needs a boolean operand", 4),
    ("(f_q < 1) < 2", "'<' needs integer operands; only '==' and '!=' compare booleans", 0),
    ("f_q >= (f_k < 1)", "'>=' needs integer operands; only '==' and '!=' compare booleans", 7),
    ("f_q == true", f"'==' {MIXED}", 7),
    ("(f_q < 1) != f_k", f"'!=' {MIXED}", 0),
    ("f_q < f_k == (h_q < 1)", f"'==' {MIXED}", 13),
    ("f_q ** 2 < 4", POWER, 4),
    ("f_q < 2**3", POWER, 7),
    ("(f_q < 1) + 1 == 2", "'+' needs integer operands", 0),
    ("f_q * (f_k < 1) == 0", "'*' needs integer operands", 6),
    ("-true", "unary '-' needs an integer operand", 1),
    ("abs(f_q, f_k) < 1", "abs() takes exactly 1 argument, got 2", 0),
    ("abs(f_q < 1) < 1", "abs() needs an integer argument", 4),
    ("min(f_q) < 1", "min() needs at least 2 arguments, got 1", 0),
    ("max() < 1", "max() needs at least 2 arguments, got 0", 0),
    ("min(f_q f_k) < 1", "expected ',' or ')' in min(...) but got 'f_k'", 8),
    ("min(f_q, 1 < 1", "unbalanced '(': missing ')'", 3),
    ("abs < 1", "'abs' is a function; call it as abs(...)", 0),
    ("f_q < 1.5", "invalid number '1.': only non-negative integer literals are allowed", 6),
    ("f_q < 007", "invalid number '007': leading zeros are not allowed", 6),
    ("f_q < and", "expected an operand but got 'and'", 6),
    ("is_text_q + 1", "the predicate must be a boolean expression, got an integer expression", 0),
]


def refusal(text: str) -> ExprSyntaxError:
    """The error parse_predicate must raise on ``text``."""
    with pytest.raises(ExprSyntaxError) as info:
        parse_predicate(text)
    return info.value


@pytest.mark.parametrize(
    "text,message,offset", INVALID, ids=[t or "<empty>" for t, _, _ in INVALID]
)
def test_invalid_predicates(text, message, offset):
    error = refusal(text)
    assert error.message == message
    assert error.offset == offset
    assert isinstance(error, ValueError)


def test_parser_never_evaluates_python():
    # Python-looking payloads are plain syntax errors, never executed.
    for text in (
        "__import__('os').system('true')",
        "f_q.__class__ == 1",
        "[f_q] == 1",
        "lambda: 1",
    ):
        with pytest.raises(ExprSyntaxError):
            parse_predicate(text)


# ----------------------------------------------------------------------------- limits


def _sum_with_tokens(n: int) -> str:
    """A valid predicate of exactly n tokens (n odd, >= 3): f_q + f_q + ... < 1."""
    terms = (n - 1) // 2
    return " + ".join(["f_q"] * terms) + " < 1"


def test_token_limit_is_exact():
    text = _sum_with_tokens(MAX_EXPR_TOKENS - 1)
    assert predicate_tokens(text) == MAX_EXPR_TOKENS - 1
    parse_predicate(text + "  \n")  # trailing blanks are not tokens
    message = refusal(_sum_with_tokens(MAX_EXPR_TOKENS + 1)).message
    assert message == f"the predicate has more than {MAX_EXPR_TOKENS} tokens (MAX_EXPR_TOKENS)"


def test_length_is_checked_before_tokenizing():
    text = "f_q < 1" + " " * MAX_EXPR_CHARS
    error = refusal(text)
    assert "MAX_EXPR_CHARS" in error.message and error.offset == MAX_EXPR_CHARS
    with pytest.raises(ExprSyntaxError):
        predicate_tokens(text)
    parse_predicate(("f_q < 1" + " " * MAX_EXPR_CHARS)[:MAX_EXPR_CHARS])


@pytest.mark.parametrize(
    "open_,close", [("(", ")"), ("abs(", ")"), ("not ", ""), ("-", ""), ("min(1, ", ")")]
)
def test_nesting_limit(open_, close):
    def nested(depth):
        inner = "f_q < 1" if open_ == "not " else "f_q"
        text = open_ * depth + inner + close * depth
        return text if open_ == "not " else text + " < 1"

    parse_predicate(nested(MAX_EXPR_DEPTH))
    message = refusal(nested(MAX_EXPR_DEPTH + 1)).message
    assert message == f"the predicate is nested more than {MAX_EXPR_DEPTH} deep (MAX_EXPR_DEPTH)"


def test_very_deep_nesting_is_an_error_not_a_recursion_error():
    for text in (
        "(" * 1000 + "f_q" + ")" * 1000 + " < 1",
        "not " * 1000 + "true",
        "-" * 3000 + "f_q < 1",
    ):
        with pytest.raises(ExprSyntaxError):
            parse_predicate(text)


def _nested_equalities(levels: int) -> str:
    """((((f_q < 1) == (f_k < 0)) == (f_k < 1)) == ...): each level doubles the tree."""
    return "(" * levels + "f_q < 1" + "".join(f") == (f_k < {i})" for i in range(levels))


def test_nested_boolean_equalities_are_bounded():
    """Each boolean == repeats both sides, so nesting doubles the tree per level: 30 levels,
    within the token and nesting limits, would be a billion nodes. Refused by size, where
    the limit is crossed."""
    text = _nested_equalities(30)
    assert predicate_tokens(text) <= MAX_EXPR_TOKENS and text.count("(") <= 2 * MAX_EXPR_DEPTH
    error = refusal(text)
    assert error.message == (
        "boolean '==' repeats both sides ((a and b) or (not a and not b)): here the predicate "
        f"would grow past {MAX_EXPR_NODES} nodes (MAX_EXPR_NODES); nest fewer boolean "
        "comparisons"
    )
    assert text[error.offset : error.offset + 2] == "=="
    assert MAX_EXPR_NODES == 4 * MAX_EXPR_TOKENS
    parse_predicate(_nested_equalities(6))  # a few levels are fine
    # A chain repeats each operand at most four times: linear, never refused for size.
    chain = " == ".join(f"(f_q < {i})" for i in range(MAX_EXPR_TOKENS // 6))
    assert predicate_tokens(chain) <= MAX_EXPR_TOKENS
    parse_predicate(chain)


def test_integer_literals_fit_int32():
    assert parse_predicate(f"f_q < {MAX_EXPR_LITERAL}") == sympy.Lt(
        SYMBOLS["f_q"], MAX_EXPR_LITERAL
    )
    for literal in (str(MAX_EXPR_LITERAL + 1), str(2**63), "9" * 4000):
        error = refusal(f"f_q < {literal}")
        assert "MAX_EXPR_LITERAL" in error.message and error.offset == 6
        assert len(error.message) < 200


# ----------------------------------------------------------------------------- end to end


def _brute_coordinates(lay: TokenLayout) -> dict[str, np.ndarray]:
    """Every token's coordinates by hand, in kernel order, for frame-major and temporal-major
    layouts without anchor frames (where the kernel order is the nominal one): text tokens
    have f = h = w = 0; i is the position in the layout's order."""
    text, video = lay.text_tokens, lay.frames * lay.height * lay.width
    start = text if lay.text_position == "first" else 0
    pos = np.arange(video + text)
    v = pos - start
    is_text = (v < 0) | (v >= video)
    v = np.where(is_text, 0, v)
    if lay.order == "temporal_major":
        frame, place = v % lay.frames, v // lay.frames
    else:
        frame, place = v // (lay.height * lay.width), v % (lay.height * lay.width)
    out = {"f": frame, "h": place // lay.width, "w": place % lay.width, "i": pos}
    out = {name: np.where(is_text, 0, x) if name != "i" else x for name, x in out.items()}
    out["is_text"] = is_text.astype(np.int64)
    return out


def _brute_keep(ref, lay: TokenLayout) -> np.ndarray:
    c = _brute_coordinates(lay)
    q = {name: x[:, None] for name, x in c.items()}
    k = {name: x[None, :] for name, x in c.items()}
    return np.broadcast_to(ref(q, k), (lay.seq_len, lay.seq_len))


# (predicate, the same with NumPy on coordinates q, k)
BOOLEAN_EQUALITIES = [
    ("(i_q < 64) == (i_k < 64)", lambda q, k: (q["i"] < 64) == (k["i"] < 64)),
    ("(f_q < 2) != (f_k < 2)", lambda q, k: (q["f"] < 2) != (k["f"] < 2)),
    (
        "(f_q // 2 == 0) == (f_k // 2 == 0) and not is_text_k",
        lambda q, k: ((q["f"] // 2 == 0) == (k["f"] // 2 == 0)) & (k["is_text"] == 0),
    ),
    (
        "((w_q - 3) // 2 == (w_k - 3) // 2) == (h_q < 2) or (i_q % 5 < 2) != is_text_k",
        lambda q, k: (
            (((q["w"] - 3) // 2 == (k["w"] - 3) // 2) == (q["h"] < 2))
            | ((q["i"] % 5 < 2) != (k["is_text"] == 1))
        ),
    ),
    (
        "not ((h_q == h_k) == (i_q - 40 < i_k))",
        lambda q, k: (q["h"] == k["h"]) != (q["i"] - 40 < k["i"]),
    ),
]

EQUALITY_LAYOUTS = [
    TokenLayout(4, 3, 6, 0, "last"),  # no text: the printer drops the is_text tests
    TokenLayout(4, 3, 6, 9, "last"),
    TokenLayout(4, 3, 6, 9, "first"),
    TokenLayout(4, 3, 6, 5, "first", "temporal_major"),
]


@pytest.mark.parametrize(
    "lay", EQUALITY_LAYOUTS, ids=lambda lay: f"{lay.order}-{lay.text_position}"
)
@pytest.mark.parametrize("text,ref", BOOLEAN_EQUALITIES, ids=[t for t, _ in BOOLEAN_EQUALITIES])
def test_boolean_equalities_through_the_ir_and_the_generated_mask(text, ref, lay):
    """spec -> ir.lower -> the oracle, and the generated boundary_mask, against NumPy."""
    want = _brute_keep(ref, lay)
    assert want.any() and not want.all(), text  # a mask worth testing
    spec = parse_spec(mask_spec_text({"expr": text}, lay), source="test.yaml")
    mask = ir.lower(spec)
    assert choose_layout(spec, spec.layout, mask) == lay  # the order _brute_keep decodes
    np.testing.assert_array_equal(dense_keep(mask, lay), want, err_msg=text)
    fn, source = emitted_function(mask, lay)
    np.testing.assert_array_equal(emitted_keep(fn, lay), want, err_msg=source)


def test_segment_mask_compiles_to_exact_tiles_and_a_working_module(compile_text):
    """The segment mask of the issue as a whole spec: tile kinds and density against brute
    force, and the generated module's boundary_mask."""
    lay = TokenLayout(2, 8, 16, 0, "last")  # 256 tokens, two 128-token tiles a side
    text = "(i_q < 64) == (i_k < 64)"
    plan, module = compile_text(mask_spec_text({"expr": text}, lay))
    want = _brute_keep(BOOLEAN_EQUALITIES[0][1], lay)
    np.testing.assert_array_equal(plan.kinds, brute_force_kinds(want, 128, 128))
    classification = plan.only.classification
    assert classification.density_is_exact
    assert classification.kept_pairs == int(want.sum())
    np.testing.assert_array_equal(emitted_keep(module.boundary_mask, plan.layout), want)


def _expr_spec(expr: str) -> str:
    return (
        "svgen: 1\n"
        "name: literal\n"
        "geometry: {frames: 2, height: 8, width: 16, text_tokens: 0, text_position: last}\n"
        "attention: {heads: 1, head_dim: 128, dtype: float32}\n"
        f'mask: {{expr: "{expr}"}}\n'
        "tiling: {block_q: 128, block_kv: 128}\n"
    )


def test_largest_literal_is_int32_max_end_to_end(compile_text):
    """2**31 - 1 is accepted and runs in the generated mask (int32 on the device); 2**31 is
    refused by the spec reader, where it is written. The values are written out here: a
    limit of 2**31 would let 2147483648 through, and the module then fail when run."""
    with pytest.raises(SpecError) as info:
        parse_spec(_expr_spec("i_q < 2147483648 + i_k"), source="test.yaml")
    assert str(info.value).startswith("test.yaml:5:21: mask.expr: invalid expression: ")
    assert "integer literal 2147483648 is larger than 2147483647 (MAX_EXPR_LITERAL" in str(
        info.value
    )
    text = "min(i_q, 2147483647) < i_k or 2147483647 - i_q < 2147483647 - i_k"
    plan, module = compile_text(_expr_spec(text))
    assert "2147483647" in inspect.getsource(module.boundary_mask)
    positions = np.arange(plan.layout.seq_len)
    want = positions[:, None] != positions[None, :]
    np.testing.assert_array_equal(emitted_keep(module.boundary_mask, plan.layout), want)


@pytest.mark.parametrize(
    "expr,column,message",
    [
        ("f_q ** 2 < 4", 19, POWER),
        ("(f_q < 2) == f_k", 15, f"'==' {MIXED}"),
        ("f_q == (f_k < 2) == (h_q < 1)", 22, f"'==' {MIXED}"),
        (
            "(f_q < 2) <= (f_k < 2)",
            15,
            "'<=' needs integer operands; only '==' and '!=' compare booleans",
        ),
    ],
)
def test_expression_errors_name_the_line_and_column(expr, column, message):
    with pytest.raises(SpecError) as info:
        parse_spec(_expr_spec(expr), source="test.yaml")
    assert str(info.value) == f"test.yaml:5:{column}: mask.expr: invalid expression: {message}"
