"""A whitelist parser for user mask predicates, producing sympy expressions.

The user's text is never handed to ``eval``, ``sympify``, ``parse_expr`` or Python's
``ast``: a small tokenizer and a recursive-descent parser accept only the grammar below
and build the sympy tree directly.

Grammar (Python-like precedence, lowest first)::

    or_expr    := and_expr ('or' and_expr)*
    and_expr   := not_expr ('and' not_expr)*
    not_expr   := 'not' not_expr | comparison
    comparison := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)*   # chained like Python
    sum        := term (('+' | '-') term)*
    term       := unary (('*' | '//' | '%') unary)*
    unary      := ('-' | '+') unary | atom
    atom       := INT | NAME | 'true' | 'false' | ('abs' | 'min' | 'max') '(' args ')' | '(' or_expr ')'

Names: ``f h w`` are a video token's frame, row and column (0 for text tokens); ``i`` is its
position in the head's layout order (the nominal order of :mod:`svgen.core.layout`), so
``i_q`` / ``i_k`` change meaning with the spec's ``layout:``; ``is_text`` is 1 for a text token.

Every sub-expression is an integer or a boolean; mixing them is a syntax error, except
that a bare ``is_text_q`` / ``is_text_k`` where a boolean is needed means ``== 1``.
``<``, ``<=``, ``>``, ``>=`` compare integers; ``==`` and ``!=`` compare two integers or two
booleans: ``(f_q < 2) == (f_k < 2)`` (both in the first two frames or both after them: a
segment mask) is built as ``(a and b) or (not a and not b)``, ``!=`` as
``(a and not b) or (not a and b)``, so the rest of svgen sees only and / or / not. Without
the parentheses, ``f_q < 2 == f_k < 2`` is Python's chain ``f_q < 2 and 2 == f_k and f_k < 2``.

``//`` and ``%`` are Python's floor division and modulo, also on negative operands:
``a // b`` rounds toward minus infinity (``-7 // 2 == -4``, not -3) and ``a % b`` takes the
sign of the divisor (``-7 % 2 == 1``), so ``a == b * (a // b) + a % b`` always holds. The
divisor must be a positive integer literal, so ``a % b`` is always in ``0 .. b - 1``. Powers
(``**``) are not supported: write the product out.

The text's length, its number of tokens, its nesting and its integer literals are bounded
(:mod:`svgen.spec.limits`) before sympy sees anything, so no predicate can make parsing slow or
overflow Python's stack.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import sympy

from svgen.spec.limits import (
    MAX_EXPR_CHARS,
    MAX_EXPR_DEPTH,
    MAX_EXPR_LITERAL,
    MAX_EXPR_NODES,
    MAX_EXPR_TOKENS,
)

__all__ = [
    "SYMBOLS",
    "FloorDiv",
    "FloorMod",
    "ExprSyntaxError",
    "parse_predicate",
    "predicate_tokens",
    "free_symbol_names",
]

_SYMBOL_NAMES = ("f_q", "h_q", "w_q", "f_k", "h_k", "w_k", "i_q", "i_k", "is_text_q", "is_text_k")

#: The only names a predicate may use. f/h/w: frame/row/column of a video token;
#: i: position in the layout order; is_text: 1 for a text token, else 0.
SYMBOLS: dict[str, sympy.Symbol] = {
    name: sympy.Symbol(name, integer=True, nonnegative=True) for name in _SYMBOL_NAMES
}


_BOOL_COERCIBLE = frozenset({"is_text_q", "is_text_k"})
_FUNCTIONS = ("abs", "min", "max")
_KEYWORDS = frozenset({"and", "or", "not", "true", "false"})


class FloorDiv(sympy.Function):
    """``a // b`` with Python (floor) semantics; folds only for two integer literals."""

    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer) and b != 0:
            return sympy.Integer(int(a) // int(b))
        return None

    def _eval_is_integer(self):
        return True


class FloorMod(sympy.Function):
    """``a % b`` with Python (floor) semantics; folds only for two integer literals."""

    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if isinstance(a, sympy.Integer) and isinstance(b, sympy.Integer) and b != 0:
            return sympy.Integer(int(a) % int(b))
        return None

    def _eval_is_integer(self):
        return True

    def _eval_is_nonnegative(self):
        if self.args[1].is_positive:
            return True
        return None


class ExprSyntaxError(ValueError):
    """A predicate that does not parse or type-check.

    ``offset`` is the 0-based character offset into the text where the problem is.
    """

    def __init__(self, message: str, offset: int):
        self.message = message
        self.offset = offset
        super().__init__(f"{message} (at offset {offset})")


# ----------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class _Tok:
    kind: str  # "int", "name", "op", "end"
    text: str
    offset: int


_TWO_CHAR_OPS = ("<=", ">=", "==", "!=", "//")
_ONE_CHAR_OPS = "<>+-*%(),"


def _describe_tok(tok: _Tok) -> str:
    if tok.kind == "end":
        return "the end of the expression"
    return f"'{tok.text}'"


def _check_length(text: str) -> None:
    if len(text) > MAX_EXPR_CHARS:
        raise ExprSyntaxError(
            f"the predicate is longer than {MAX_EXPR_CHARS} characters "
            f"(MAX_EXPR_CHARS), got {len(text)}",
            MAX_EXPR_CHARS,
        )


def _literal(text: str, offset: int) -> _Tok:
    """An integer literal, refused past the kernel's int32 before Python converts it (a
    string of thousands of digits would otherwise be slow, or refused by ``int`` itself)."""
    if len(text) > len(str(MAX_EXPR_LITERAL)) or int(text) > MAX_EXPR_LITERAL:
        shown = text if len(text) <= 20 else f"{text[:12]}... ({len(text)} digits)"
        raise ExprSyntaxError(
            f"integer literal {shown} is larger than {MAX_EXPR_LITERAL} "
            f"(MAX_EXPR_LITERAL: the kernel computes predicates in int32)",
            offset,
        )
    return _Tok("int", text, offset)


def _tokenize(text: str) -> list[_Tok]:
    _check_length(text)
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if len(toks) == MAX_EXPR_TOKENS:  # a token starts here, one past the limit
            raise ExprSyntaxError(
                f"the predicate has more than {MAX_EXPR_TOKENS} tokens (MAX_EXPR_TOKENS)", i
            )
        if c.isdigit() and c.isascii():
            j = i
            while j < n and text[j].isascii() and text[j].isdigit():
                j += 1
            if j < n and (text[j].isalpha() or text[j] == "_" or text[j] == "."):
                raise ExprSyntaxError(
                    f"invalid number '{text[i : j + 1]}': only non-negative integer literals are allowed",
                    i,
                )
            if j - i > 1 and text[i] == "0":
                raise ExprSyntaxError(
                    f"invalid number '{text[i:j]}': leading zeros are not allowed", i
                )
            toks.append(_literal(text[i:j], i))
            i = j
            continue
        if (c.isascii() and c.isalpha()) or c == "_":
            j = i
            while j < n and text[j].isascii() and (text[j].isalnum() or text[j] == "_"):
                j += 1
            toks.append(_Tok("name", text[i:j], i))
            i = j
            continue
        two = text[i : i + 2]
        if two in _TWO_CHAR_OPS:
            toks.append(_Tok("op", two, i))
            i += 2
            continue
        if two == "**":
            raise ExprSyntaxError(
                "'**' is not supported: predicates have no powers; write the product out "
                "(f_q * f_q)",
                i,
            )
        if two in ("&&", "||"):
            word = "and" if two == "&&" else "or"
            raise ExprSyntaxError(f"unexpected '{two}'; use '{word}'", i)
        if c in _ONE_CHAR_OPS:
            toks.append(_Tok("op", c, i))
            i += 1
            continue
        if c == "/":
            raise ExprSyntaxError("'/' is not supported; use '//' for floor division", i)
        if c == "=":
            raise ExprSyntaxError("unexpected '='; use '==' to compare", i)
        if c == "!":
            raise ExprSyntaxError("unexpected '!'; use 'not' or '!='", i)
        if c == "&":
            raise ExprSyntaxError("unexpected '&'; use 'and'", i)
        if c == "|":
            raise ExprSyntaxError("unexpected '|'; use 'or'", i)
        raise ExprSyntaxError(f"unexpected character {c!r}", i)
    toks.append(_Tok("end", "", n))
    return toks


# ----------------------------------------------------------------------------- parser


@dataclass(frozen=True)
class _Val:
    expr: sympy.Basic
    is_bool: bool
    offset: int
    text_flag: bool = False  # a bare is_text_q / is_text_k (may be read as a boolean)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokenize(text)
        self.pos = 0
        self.depth = 0

    @contextlib.contextmanager
    def _nested(self, offset: int):
        """One more level of recursion (a parenthesis, call, 'not' or sign), bounded so that
        no predicate overflows Python's stack."""
        self.depth += 1
        if self.depth > MAX_EXPR_DEPTH:
            raise ExprSyntaxError(
                f"the predicate is nested more than {MAX_EXPR_DEPTH} deep (MAX_EXPR_DEPTH)", offset
            )
        try:
            yield
        finally:
            self.depth -= 1

    # -- helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.pos]

    def _at_op(self, *ops: str) -> bool:
        t = self.tok
        return t.kind == "op" and t.text in ops

    def _at_kw(self, kw: str) -> bool:
        t = self.tok
        return t.kind == "name" and t.text == kw

    def _advance(self) -> _Tok:
        t = self.tok
        self.pos += 1
        return t

    @staticmethod
    def _as_bool(v: _Val, message: str) -> sympy.Basic:
        if v.is_bool:
            return v.expr
        if v.text_flag:
            return sympy.Eq(v.expr, 1)
        raise ExprSyntaxError(message, v.offset)

    @staticmethod
    def _as_int(v: _Val, message: str) -> sympy.Basic:
        if v.is_bool:
            raise ExprSyntaxError(message, v.offset)
        return v.expr

    # -- grammar
    def parse(self) -> sympy.Basic:
        if self.tok.kind == "end":
            raise ExprSyntaxError("empty predicate: expected a boolean expression", 0)
        v = self._or()
        t = self.tok
        if t.kind != "end":
            if t.kind == "op" and t.text == ")":
                raise ExprSyntaxError("unbalanced ')': no matching '('", t.offset)
            raise ExprSyntaxError(
                f"unexpected {_describe_tok(t)} after a complete expression", t.offset
            )
        if not v.is_bool and not v.text_flag:
            raise ExprSyntaxError(
                "the predicate must be a boolean expression, got an integer expression", v.offset
            )
        return self._as_bool(v, "")

    def _or(self) -> _Val:
        first = self._and()
        if not self._at_kw("or"):
            return first
        parts = [self._as_bool(first, "'or' needs boolean operands")]
        while self._at_kw("or"):
            self._advance()
            parts.append(self._as_bool(self._and(), "'or' needs boolean operands"))
        return _Val(sympy.Or(*parts), True, first.offset)

    def _and(self) -> _Val:
        first = self._not()
        if not self._at_kw("and"):
            return first
        parts = [self._as_bool(first, "'and' needs boolean operands")]
        while self._at_kw("and"):
            self._advance()
            parts.append(self._as_bool(self._not(), "'and' needs boolean operands"))
        return _Val(sympy.And(*parts), True, first.offset)

    def _not(self) -> _Val:
        if self._at_kw("not"):
            t = self._advance()
            with self._nested(t.offset):
                inner = self._not()
            return _Val(
                sympy.Not(self._as_bool(inner, "'not' needs a boolean operand")), True, t.offset
            )
        return self._comparison()

    _REL = {
        "<": sympy.Lt,
        "<=": sympy.Le,
        ">": sympy.Gt,
        ">=": sympy.Ge,
        "==": sympy.Eq,
        "!=": sympy.Ne,
    }

    def _comparison(self) -> _Val:
        first = self._sum()
        if not self._at_op(*self._REL):
            return first
        left, parts = first, []
        while self._at_op(*self._REL):
            op = self._advance()
            right = self._sum()
            parts.append(self._compare(left, op, right))
            left = right
        return _Val(sympy.And(*parts) if len(parts) > 1 else parts[0], True, first.offset)

    def _compare(self, left: _Val, op: _Tok, right: _Val) -> sympy.Basic:
        """One link of a comparison chain: two integers, or (== and != only) two booleans."""
        if not (left.is_bool or right.is_bool):
            return self._REL[op.text](left.expr, right.expr)
        boolean = left if left.is_bool else right
        if op.text not in ("==", "!="):
            raise ExprSyntaxError(
                f"'{op.text}' needs integer operands; only '==' and '!=' compare booleans",
                boolean.offset,
            )
        if not self._both_bool(left, right):
            raise ExprSyntaxError(
                f"'{op.text}' compares an integer with a boolean; compare two integers, or "
                "two comparisons in parentheses: (f_q < 2) == (f_k < 2)",
                boolean.offset,
            )
        a, b = self._as_bool(left, ""), self._as_bool(right, "")
        # Each side appears twice in the result, so nested equalities double the tree at every
        # level (every pass over it, evaluation and printing included, walks the tree).
        if 2 * (_tree_size(a) + _tree_size(b)) + 5 > MAX_EXPR_NODES:
            raise ExprSyntaxError(
                f"boolean '{op.text}' repeats both sides ((a and b) or (not a and not b)): "
                f"here the predicate would grow past {MAX_EXPR_NODES} nodes (MAX_EXPR_NODES); "
                "nest fewer boolean comparisons",
                op.offset,
            )
        return _equal(a, b) if op.text == "==" else _differ(a, b)

    @staticmethod
    def _both_bool(left: _Val, right: _Val) -> bool:
        """Whether both sides are booleans, a bare is_text_q / is_text_k (0 or 1) counting as
        one beside a boolean, as wherever a boolean is needed."""
        return (left.is_bool or left.text_flag) and (right.is_bool or right.text_flag)

    def _sum(self) -> _Val:
        acc = self._term()
        while self._at_op("+", "-"):
            op = self._advance().text
            msg = f"'{op}' needs integer operands"
            left = self._as_int(acc, msg)
            right = self._as_int(self._term(), msg)
            expr = left + right if op == "+" else left - right
            acc = _Val(expr, False, acc.offset)
        return acc

    def _term(self) -> _Val:
        acc = self._unary()
        while self._at_op("*", "//", "%"):
            op = self._advance().text
            msg = f"'{op}' needs integer operands"
            left = self._as_int(acc, msg)
            right_v = self._unary()
            right = self._as_int(right_v, msg)
            if op == "*":
                expr = left * right
            else:
                if not (isinstance(right, sympy.Integer) and right > 0):
                    raise ExprSyntaxError(
                        f"divisor of '{op}' must be a positive integer literal", right_v.offset
                    )
                expr = FloorDiv(left, right) if op == "//" else FloorMod(left, right)
            acc = _Val(expr, False, acc.offset)
        return acc

    def _unary(self) -> _Val:
        if self._at_op("-", "+"):
            t = self._advance()
            with self._nested(t.offset):
                inner = self._unary()
            e = self._as_int(inner, f"unary '{t.text}' needs an integer operand")
            return _Val(-e if t.text == "-" else e, False, t.offset)
        return self._atom()

    def _atom(self) -> _Val:
        t = self.tok
        if t.kind == "int":
            self._advance()
            return _Val(sympy.Integer(int(t.text)), False, t.offset)
        if t.kind == "op" and t.text == "(":
            self._advance()
            with self._nested(t.offset):
                inner = self._or()
            if not self._at_op(")"):
                if self.tok.kind == "end":
                    raise ExprSyntaxError("unbalanced '(': missing ')'", t.offset)
                raise ExprSyntaxError(
                    f"expected ')' but got {_describe_tok(self.tok)}", self.tok.offset
                )
            self._advance()
            return _Val(inner.expr, inner.is_bool, t.offset, inner.text_flag)
        if t.kind == "name":
            name = t.text
            if name == "true" or name == "false":
                self._advance()
                return _Val(sympy.true if name == "true" else sympy.false, True, t.offset)
            if name in _FUNCTIONS:
                return self._call()
            if name in SYMBOLS:
                self._advance()
                return _Val(SYMBOLS[name], False, t.offset, name in _BOOL_COERCIBLE)
            if name in _KEYWORDS:
                raise ExprSyntaxError(f"expected an operand but got '{name}'", t.offset)
            nxt = self.toks[self.pos + 1]
            if nxt.kind == "op" and nxt.text == "(":
                raise ExprSyntaxError(
                    f"unknown function '{name}'; allowed functions: {', '.join(_FUNCTIONS)}",
                    t.offset,
                )
            raise ExprSyntaxError(
                f"unknown name '{name}'; allowed names: {', '.join(_SYMBOL_NAMES)}", t.offset
            )
        if t.kind == "end":
            raise ExprSyntaxError("unexpected end of expression: expected an operand", t.offset)
        if t.kind == "op" and t.text == ")":
            raise ExprSyntaxError("unexpected ')': expected an operand", t.offset)
        raise ExprSyntaxError(f"unexpected '{t.text}': expected an operand", t.offset)

    def _call(self) -> _Val:
        name_tok = self._advance()
        name = name_tok.text
        if not self._at_op("("):
            raise ExprSyntaxError(
                f"'{name}' is a function; call it as {name}(...)", name_tok.offset
            )
        open_tok = self._advance()
        args: list[_Val] = []
        if self._at_op(")"):
            self._advance()
        else:
            while True:
                with self._nested(name_tok.offset):
                    args.append(self._or())
                if self._at_op(","):
                    self._advance()
                    continue
                if self._at_op(")"):
                    self._advance()
                    break
                if self.tok.kind == "end":
                    raise ExprSyntaxError("unbalanced '(': missing ')'", open_tok.offset)
                raise ExprSyntaxError(
                    f"expected ',' or ')' in {name}(...) but got {_describe_tok(self.tok)}",
                    self.tok.offset,
                )
        if name == "abs":
            if len(args) != 1:
                raise ExprSyntaxError(
                    f"abs() takes exactly 1 argument, got {len(args)}", name_tok.offset
                )
            e = self._as_int(args[0], "abs() needs an integer argument")
            return _Val(sympy.Abs(e), False, name_tok.offset)
        if len(args) < 2:
            raise ExprSyntaxError(
                f"{name}() needs at least 2 arguments, got {len(args)}", name_tok.offset
            )
        es = [self._as_int(a, f"{name}() needs integer arguments") for a in args]
        fn = sympy.Min if name == "min" else sympy.Max
        return _Val(fn(*es), False, name_tok.offset)


def _tree_size(e: sympy.Basic) -> int:
    """The nodes of ``e`` counted as a tree (a shared sub-expression as often as it is
    used), stopping once past MAX_EXPR_NODES: the count costs no more than the limit."""
    count, todo = 0, [e]
    while todo and count <= MAX_EXPR_NODES:
        node = todo.pop()
        count += 1
        todo.extend(node.args)
    return count


def _equal(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    """a == b for booleans, in and / or / not: what the analysis and codegen understand
    (sympy's Equivalent is not)."""
    return sympy.Or(sympy.And(a, b), sympy.And(sympy.Not(a), sympy.Not(b)))


def _differ(a: sympy.Basic, b: sympy.Basic) -> sympy.Basic:
    """a != b for booleans, in and / or / not (sympy's Xor is not understood downstream)."""
    return sympy.Or(sympy.And(a, sympy.Not(b)), sympy.And(sympy.Not(a), b))


def parse_predicate(text: str) -> sympy.Basic:
    """Parse a user predicate into a sympy Boolean (possibly ``sympy.true``/``false``).

    Raises ``ExprSyntaxError`` (with ``message`` and 0-based ``offset``) on any problem.
    """
    if not isinstance(text, str):
        raise ExprSyntaxError(f"the predicate must be a string, got {type(text).__name__}", 0)
    return _Parser(text).parse()


def predicate_tokens(text: str) -> int:
    """How many tokens ``text`` has: an ``expr``'s share of its mask's size limit.

    Cheap (no sympy); raises ``ExprSyntaxError`` like :func:`parse_predicate` for text that
    is too long or does not tokenize.
    """
    return len(_tokenize(text)) - 1  # without the end marker


def free_symbol_names(expr: sympy.Basic) -> tuple[str, ...]:
    """The names of the free symbols of ``expr``, sorted."""
    return tuple(sorted(s.name for s in expr.free_symbols))


def split_sides(e: sympy.Basic) -> tuple[sympy.Basic, sympy.Basic] | None:
    """(a, b) with e = a - b, a reading only query coordinates (``*_q``, and the constant)
    and b only key ones, both read; None when a term mixes them or one side reads nothing.
    Such a difference is computed on the narrow sides of a block and subtracted once per
    pair (the code printer fuses comparisons of it; the residual analysis counts them so)."""
    query, key = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(e)):
        sides = {s.name[-1] for s in term.free_symbols}
        if sides == {"k"}:
            key -= term
        elif sides <= {"q"}:
            query += term
        else:
            return None
    if not query.free_symbols or not key.free_symbols:
        return None
    return query, key


def simplify_union(args) -> list:
    """The disjuncts `args` of a union, simplified as the code printer and the residual
    analysis read them: bounds of one expression the same way round merged into the loosest
    (x <= a or x <= b is x <= max(a, b)), then every conjunct that is the integer complement
    of another disjunct dropped: A or (not A and B) is A or B, and on integers not |x| <= 1
    is |x| >= 2 (Radial Attention's bands, each bounded below where the band before it
    ends). Only comparisons of an expression with an integer are matched."""
    args = _merge_nested_bounds(list(args))
    alone = {_integer_comparison(a) for a in args} - {None}
    if not alone:
        return args
    out = []
    for a in args:
        if isinstance(a, sympy.And):
            kept = [c for c in a.args if _integer_complement(c) not in alone]
            if len(kept) < len(a.args):
                a = sympy.And(*kept) if kept else sympy.true
        out.append(a)
    return out


def _merge_nested_bounds(args: list) -> list:
    """Disjuncts bounding one expression the same way merged into the loosest: x <= a or
    x <= b is x <= max(a, b) (nested windows |dp| < 900 or |dp| < 450)."""
    loosest: dict = {}
    for a in args:
        found = _integer_comparison(a)
        if found is not None:
            x, lo, hi = found
            key = (x, lo is None)
            bound = hi if lo is None else lo
            best = loosest.get(key)
            if best is None or (bound > best[1] if lo is None else bound < best[1]):
                loosest[key] = (a, bound)
    keep = {id(a) for a, _ in loosest.values()}
    return [a for a in args if _integer_comparison(a) is None or id(a) in keep]


def abs_upper_bound(e) -> tuple | None:
    """(x, c) when e is |x| <= c for an integer c >= 0, or |x| < c + 1, written either way
    round (x integer-valued, as every coordinate and value computed from them is); else
    None: a window 0 <= x + c <= 2c, as the code printer and the residual analysis read it."""
    found = _integer_comparison(e)
    if found is None:
        return None
    x, lo, hi = found
    if lo is not None or not isinstance(x, sympy.Abs) or hi < 0:
        return None
    return x.args[0], hi


def _integer_comparison(e) -> tuple | None:
    """e as (x, lo, hi): lo <= x <= hi with one of them None, for e comparing an expression
    x with an integer either way round (x integer-valued: < c is <= c - 1); else None."""
    if not isinstance(e, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)):
        return None
    lhs, rhs = e.args
    upper = isinstance(e, (sympy.Le, sympy.Lt))  # lhs below rhs
    strict = isinstance(e, (sympy.Lt, sympy.Gt))
    if isinstance(lhs, sympy.Integer) and not isinstance(rhs, sympy.Integer):
        lhs, rhs, upper = rhs, lhs, not upper
    if not isinstance(rhs, sympy.Integer) or isinstance(lhs, sympy.Integer):
        return None
    c = int(rhs)
    return (lhs, None, c - strict) if upper else (lhs, c + strict, None)


def _integer_complement(e) -> tuple | None:
    """The complement of e (_integer_comparison's form): x <= c is not x >= c + 1."""
    found = _integer_comparison(e)
    if found is None:
        return None
    x, lo, hi = found
    return (x, hi + 1, None) if lo is None else (x, None, lo - 1)
