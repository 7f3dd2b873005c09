"""The mask IR as Python source for a BOUNDARY tile: one named line per primitive.

It lives in the analysis because what it prints decides what the kernel keeps in VMEM: the
query values each pattern decodes once per q tile (svgen.analysis.mask_source), which the
analysis counts before it checks the tiling's VMEM once. Each mask is printed once, by the
analysis (svgen.analysis.mask_functions); codegen places that source in the module. What the
source reads of q and whether it calls coords are noted as it is printed, never read back.

Leaves print their sympy predicate over `q.<coord>` / `k.<coord>` (runtime.coords.TokenCoords);
combinators combine the names, so the generated function reads like the spec. Floor division
and modulo are printed with `lax.div` / `lax.rem` on operands shifted to be non-negative
(shift from interval bounds over the whole geometry), because jnp `//` and `%` do not lower
for TPU from a CPU host; by a power of two, as an arithmetic shift and a bitwise and.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import sympy

from svgen import ir
from svgen.analysis.mask_source import MaskSource, QueryFunction
from svgen.analysis.residuals import FIELDS_OPS
from svgen.analysis.code_text import is_sum, strip_group
from svgen.analysis.predicate_shapes import (
    abs_window,
    chain_pairs,
    divides,
    equality_sides,
    key_side_positive,
    mixes_sides,
    non_negative,
    same_residue,
)
from svgen.spec import int_range, primitives
from svgen.spec.expr import (
    SYMBOLS,
    FloorDiv,
    FloorMod,
    abs_upper_bound,
    simplify_union,
    split_sides,
)
from svgen.core.layout import TokenLayout

_COORD = {"f": "frame", "h": "row", "w": "col", "i": "index"}
# The largest common width coords.windows scales a conjunction's windows to (a bound on the
# search; the scaled sides are checked against int32 as well).
MAX_COMMON_WIDTH = 4096


def _code_name(node_class: type) -> str:
    """The base name of a node's line: declared with its primitive (svgen.spec.primitives);
    `always` for simplification's constants, which no spec writes."""
    if node_class is ir.Always:
        return "always"
    primitive = primitives.by_node(node_class)
    if primitive is None or primitive.code_name is None:
        raise TypeError(f"no generated-code name for {node_class.__name__}")
    return primitive.code_name


def emit_mask(
    mask: ir.Node, layout: TokenLayout, owner: str = "boundary_mask", shared: dict | None = None
) -> MaskSource:
    """The statements of the mask function `owner`, its query functions named after it.
    shared: the query functions already written for other masks of the module, by value
    (updated): a mask whose packing is one of them reads it instead of a copy (a residual
    mask is often a part of the whole mask)."""
    emitter = _Emitter(layout, owner, {} if shared is None else shared)
    result = emitter.node(mask)
    return MaskSource(
        tuple(emitter.lines),
        result,
        tuple(sorted(emitter.reads)),
        tuple(emitter.query_functions),
        emitter.calls_coords,
    )


class _Emitter:
    def __init__(self, layout: TokenLayout, owner: str, shared: dict):
        self.layout = layout
        self.owner = owner
        self.shared = shared
        self.lines: list[str] = []
        self.query_functions: list[QueryFunction] = []
        self.taken: dict[str, int] = {}
        self.domain = int_range.coordinate_domain(
            layout.frames, layout.height, layout.width, layout.seq_len
        )
        # What the printed statements read of q and whether they call coords, noted as they
        # are printed (nothing printed is thrown away): the kernel decodes each coordinate
        # read once per q tile, and the module imports coords for its calls.
        self.reads: set[str] = set()
        self.calls_coords = False

    def read(self, side: str, attribute: str) -> str:
        """`side.attribute` printed, noted when it is a coordinate of the queries."""
        if side == "q":
            self.reads.add(attribute)
        return f"{side}.{attribute}"

    def coords_call(self, function: str, arguments: str) -> str:
        """A call of svgen.runtime.coords printed (the module then imports coords)."""
        self.calls_coords = True
        return f"coords.{function}({arguments})"

    @contextlib.contextmanager
    def query_side(self):
        """Printing a query function's value: what it reads of q is its own (a function
        computed once per q tile), not the statements'; yields the set that collects it."""
        statements, self.reads = self.reads, set()
        try:
            yield self.reads
        finally:
            self.reads = statements

    def fresh(self, base: str) -> str:
        n = self.taken.get(base, 0)
        self.taken[base] = n + 1
        return base if n == 0 else f"{base}_{n + 1}"

    def node(self, node) -> str:
        if isinstance(node, ir.AnyOf):
            fused = self._within_unless(node)
            if fused is not None:
                return fused
        name = self.fresh(_code_name(type(node)))
        if isinstance(node, (ir.AnyOf, ir.AllOf)):
            parts = [self.node(c) for c in node.children]
            op = " | " if isinstance(node, ir.AnyOf) else " & "
            self.lines.append(f"{name} = {op.join(parts)}")
        elif isinstance(node, ir.Not):
            child = self.node(node.child)
            self.lines.append(f"{name} = ~{child}")
        elif isinstance(node, ir.Always):
            fill = "ones_like" if node.value else "zeros_like"
            self.lines.append(f"{name} = jnp.{fill}(k.pos, dtype=jnp.bool_)")
        elif isinstance(node, ir.BlockData):
            self.lines.append(f"# {node.describe()}")
            bits = self.coords_call(
                "block_bits",
                f'{self.read("q", "pos")}, k.pos, k.tables["{node.tag}"], {node.block}',
            )
            self.lines.append(f"{name} = {bits}")
        else:
            predicate = self._specialize(node.predicate())
            self._check_device_range(predicate, node)
            self.lines.append(f"# {node.describe()}")
            self.lines.append(f"{name} = {strip_group(self.boolean(predicate, top=True))}")
        return name

    def _within_unless(self, node: ir.AnyOf) -> str | None:
        """A window |x| <= c or'ed with terms that read only the key (band | prefix,
        spatial_window | first_frame): the key terms become a [1, keys] bit mask that the
        window's unsigned compare ANDs in (runtime.coords.within), one full-block op instead
        of a broadcast and an or (two)."""
        key_only = [c for c in node.children if self._reads_only(c, "_k")]
        rest = [c for c in node.children if c not in key_only]
        if not key_only or len(rest) != 1:
            return None
        window = self._specialize(rest[0].predicate())
        if isinstance(window, sympy.Eq):  # a == b is |a - b| <= 0
            window = sympy.Le(sympy.Abs(window.args[0] - window.args[1]), 0, evaluate=False)
        parts = self._within_parts(window)
        if parts is None:
            return None
        unless = [self.node(c) for c in key_only]
        name = self.fresh(_code_name(ir.AnyOf))
        self.lines.append(f"# {rest[0].describe()}; or any key kept by {' or '.join(unless)}")
        within = self.coords_call("within", f"{parts[0]}, {parts[1]}, unless={' | '.join(unless)}")
        self.lines.append(f"{name} = {within}")
        return name

    def _check_device_range(self, predicate, node) -> None:
        """Every value the printed line computes fits int32 (user predicates are refused
        earlier, with their location, by ir.lower; built-ins stay far below 2^31)."""
        overflow = int_range.int32_overflow(predicate, self.domain)
        if overflow is not None:
            sub, (lo, hi) = overflow
            raise ValueError(f"{node.describe()}: {sub} takes values {lo} .. {hi}, past int32")

    def _reads_only(self, node, side: str) -> bool:
        symbols = self._specialize(node.predicate()).free_symbols
        return bool(symbols) and all(s.name.endswith(side) for s in symbols)

    def _specialize(self, predicate):
        """Drop the text tests of a geometry without text: each is a full-tile VALU op."""
        if self.layout.text_tokens:
            return predicate
        return predicate.subs({SYMBOLS["is_text_q"]: 0, SYMBOLS["is_text_k"]: 0})

    # -- sympy printing: every returned string is atomic or parenthesized ----------------

    def boolean(self, e, top: bool = False) -> str:
        """e printed; top: e is the whole of its line's value (a fused conjunction's call is
        then written inline, else on a line of its own)."""
        if e is sympy.true or e is sympy.false:
            fill = "ones_like" if e is sympy.true else "zeros_like"
            return f"jnp.{fill}(k.pos, dtype=jnp.bool_)"
        if isinstance(e, (sympy.And, sympy.Or)):
            op = " & " if isinstance(e, sympy.And) else " | "
            args = e.args if isinstance(e, sympy.And) else simplify_union(e.args)
            args = sorted(args, key=_print_order)
            printed = [] if isinstance(e, sympy.Or) else self._same_place(args)
            if isinstance(e, sympy.And):
                printed += self._fields(args, alone=top and not printed)
                printed += self._equalities(args, alone=top and not printed)
                printed += self._windows(args, alone=top and not printed)
                printed += self._chains(args)
            printed += [self.boolean(a) for a in args]
            return printed[0] if len(printed) == 1 else "(" + op.join(printed) + ")"
        if isinstance(e, sympy.Not):
            return "~" + self.boolean(e.args[0])
        if isinstance(e, (sympy.Eq, sympy.Ne)):
            text = self._is_text_test(e)
            if text is not None:
                return text
            residues = same_residue(e)
            if residues is not None and self._fits_int32(*residues):
                a, b = residues
                op = "==" if isinstance(e, sympy.Eq) else "!="
                return f"({strip_group(self.integer(a))} {op} {strip_group(self.integer(b))})"
        within = self._abs_within(e)
        if within is not None:
            return within
        ops = {
            sympy.Eq: "==",
            sympy.Ne: "!=",
            sympy.Lt: "<",
            sympy.Le: "<=",
            sympy.Gt: ">",
            sympy.Ge: ">=",
        }
        for cls, op in ops.items():
            if isinstance(e, cls):
                left, right = (strip_group(self.integer(side)) for side in e.args)
                return f"({left} {op} {right})"
        raise TypeError(f"cannot print boolean {e}")

    def _same_place(self, args: list) -> list[str]:
        """h_q == h_k and w_q == w_k as one compare of place = h * width + w (removed from
        `args`): one full-block VALU op instead of three."""

        def find(coord):
            pair = {SYMBOLS[f"{coord}_q"], SYMBOLS[f"{coord}_k"]}
            return next((a for a in args if isinstance(a, sympy.Eq) and set(a.args) == pair), None)

        rows, cols = find("h"), find("w")
        if rows is None or cols is None:
            return []
        args.remove(rows)
        args.remove(cols)
        return [f"({self.read('q', 'place')} == k.place)"]

    def _chains(self, args: list) -> list[str]:
        """Pairs a <= x and x <= a + c among the conjuncts (removed from `args`), each as one
        unsigned compare 0 <= x - a <= c (runtime.coords.within): two full-block VALU ops
        instead of three, for a clamped window (NATTEN's neighborhood) read on every pair."""

        def printable(x) -> bool:
            return mixes_sides(x) and int_range.int32_overflow(sympy.Ge(x, 0), self.domain) is None

        printed = []
        for first, second, x, width in chain_pairs(args, printable):
            if width > int_range.INT32_MAX:  # a literal past int32: left as two compares
                continue
            args.remove(first)
            args.remove(second)
            printed.append(self.coords_call("within", f"{strip_group(self.integer(x))}, {width}"))
        return printed

    def _fields(self, args: list, alone: bool) -> list[str]:
        """The conjuncts that compare a query-side and a key-side value (windows
        0 <= a - b <= c, one-sided bounds a - b >= 0, equalities a == b and same residues) as
        one runtime.coords.fields (removed from `args`): a subtract, an AND and a compare on
        every pair for all of them, where each window costs a subtract and a compare, a bound
        or an equality a compare, and an AND joins each to the next. Used where that saves an
        op; terms whose fields would not fit 32 bits together are left to the fusions after
        it (the widest left first)."""
        terms = self._field_terms(args)
        while len(terms) >= 2:
            layout = _field_layout([t.lo, t.hi, t.width] for t in terms)
            if layout is not None:
                break
            terms.remove(max(terms, key=lambda t: (_field(t.lo, t.hi, t.width)[2], -t.order)))
        else:
            return []
        if _separate_ops(terms) <= FIELDS_OPS:
            return []
        query, key = [], []
        with self.query_side() as query_reads:
            for term, (scale, shift, bits) in zip(terms, layout):
                for c in term.conjuncts:
                    args.remove(c)
                a, b = sympy.expand(scale * term.a), sympy.expand(scale * term.b)
                query.append(f"({strip_group(self.integer(a))}, {shift})")
                key.append(f"({strip_group(self.integer(b))}, {shift}, {bits})")
        name = self._query_function(f"coords.pack({', '.join(query)})", query_reads)
        call = self.coords_call("fields", f"q.once({name}), {', '.join(key)}")
        return self._call_line("fields", call, alone and not args)

    def _query_function(self, value: str, reads: set, reader: str = "coords.fields") -> str:
        """The name of a QueryFunction returning `value` (an expression of q alone, reading
        `reads` of it): one already written with that value, else a new one named after the
        mask function and the call that reads it (`reader`: coords.fields' packing,
        coords.within's side)."""
        if value in self.shared:
            return self.shared[value]
        stem, result = ("fields", "packed") if reader == "coords.fields" else ("side", "side")
        name = self.fresh(f"{self.owner}_{stem}")
        self.shared[value] = name
        self.query_functions.append(
            QueryFunction(
                name,
                self.owner,
                (f"{result} = {value}",),
                result,
                tuple(sorted(reads)),
                reader,
                value,
            )
        )
        return name

    def _field_terms(self, args: list) -> list["_FieldTerm"]:
        """The conjuncts coords.fields can hold, as terms 0 <= a - b <= width (width None:
        a one-sided bound), a reading only query and b only key coordinates, each side and
        their packing within int32's reach over the geometry: a - b, and the sides scaled
        to their field (m * a and m * b, printed; m reaches about 2 * width)."""
        found = []
        for conjuncts, a, b, width in self._window_terms(args):
            found.append((conjuncts, *key_side_positive(a, b, width), width, "window"))
        taken = {c for t in found for c in t[0]}
        for x in args:
            if x in taken:
                continue
            if isinstance(x, sympy.Eq):
                pair = equality_sides(x)
                if pair is not None:
                    found.append(((x,), *key_side_positive(*pair, 0), 0, "equality"))
                continue
            low = non_negative(x)
            pair = None if low is None else split_sides(low)
            if pair is not None:
                found.append(((x,), *pair, None, "bound"))
        terms = []
        for conjuncts, a, b, width, kind in found:
            if not self._fits_int32(a, b):
                continue
            (la, ha), (lb, hb) = (int_range.value_range(side, self.domain) for side in (a, b))
            m, _ = _field_scale(width, ha - lb)
            if not self._sides_fit_int32(sympy.expand(m * a), sympy.expand(m * b)):
                continue
            order = min(args.index(c) for c in conjuncts)
            terms.append(_FieldTerm(conjuncts, a, b, width, la - hb, ha - lb, kind, order))
        return sorted(terms, key=lambda t: t.order)

    def _equalities(self, args: list, alone: bool) -> list[str]:
        """Two or more equalities a == b among the conjuncts (removed from `args`), a reading
        the query and b the key, (a - b) % d == 0 among them as a % d == b % d, as one
        runtime.coords.same: one compare of their mixed-radix packings, each a_i - lo_i and
        b_i - lo_i within [0, n_i) over the geometry (a dilated neighborhood's row and column
        parities: one op where two compares and an AND were). Left apart where the packing
        could pass int32."""
        found = []
        for x in args:
            if not isinstance(x, sympy.Eq):
                continue
            pair = equality_sides(x)
            if pair is None or not self._fits_int32(*pair):
                continue
            (la, ha), (lb, hb) = (int_range.value_range(side, self.domain) for side in pair)
            found.append((x, *pair, min(la, lb), max(ha, hb) - min(la, lb) + 1))
        if len(found) < 2 or math.prod(n for *_, n in found) > int_range.INT32_MAX:
            return []
        for x, *_ in found:
            args.remove(x)
        printed = ", ".join(
            f"({strip_group(self.integer(a - lo))}, {strip_group(self.integer(b - lo))}, {n})"
            for _, a, b, lo, n in found
        )
        return self._call_line("same", self.coords_call("same", printed), alone and not args)

    def _call_line(self, name: str, call: str, whole: bool) -> list[str]:
        """A fused conjunction's call: returned inline when it is the `whole` conjunction,
        else on a line of its own (the formatter lays out a lone call, an argument a line)
        and referred to by name."""
        if whole:
            return [call]
        name = self.fresh(name)
        self.lines.append(f"{name} = {call}")
        return [name]

    def _windows(self, args: list, alone: bool) -> list[str]:
        """Two or more windows 0 <= a - b <= c among the conjuncts (removed from `args`), a
        reading only query and b only key coordinates (a clamped neighborhood's axes
        a <= x <= a + c, or |x| <= c), as one runtime.coords.windows: a subtract and a
        maximum per window on every pair and one compare for them all, where each `within`
        is a subtract and a compare followed by an AND. Scaled to one width (_common_width);
        left as they were where a scaled side might leave int32.

        Measured (svgen cost, v6e, 512 x 512 blocks): a BOUNDARY block of NATTEN 3 x 7 x 7,
        its causal and first-frame forms, 3-D windows and the frame-decay spec 1-8% cheaper;
        of the dilated neighborhoods (sides divided, `h_k // 2`) 3-6% dearer, cause not
        found, so windows with a divided side are not fused."""
        found = [t for t in self._window_terms(args) if not divides(t[1]) and not divides(t[2])]
        if len(found) < 2:
            return []
        common = _common_width([c for _, _, _, c in found])
        if common is None:
            return []
        width, scales = common
        terms = [key_side_positive(m * a, m * b, width) for (_, a, b, _), m in zip(found, scales)]
        if not all(self._fits_int32(a, b) for a, b in terms):
            return []
        for conjuncts, *_ in found:
            for c in conjuncts:
                args.remove(c)
        printed = ", ".join(
            f"({strip_group(self.integer(a))}, {strip_group(self.integer(b))})" for a, b in terms
        )
        return self._call_line(
            "windows", self.coords_call("windows", f"{printed}, width={width}"), alone and not args
        )

    def _fits_int32(self, a, b) -> bool:
        """a, b and a - b within int32 over the geometry (coords.windows wraps a + _SIGN - b,
        which is exact when a - b is an int32)."""
        if not self._sides_fit_int32(a, b):
            return False
        lo, hi = int_range.value_range(sympy.expand(a - b), self.domain)
        return int_range.INT32_MIN <= lo and hi <= int_range.INT32_MAX

    def _sides_fit_int32(self, *values) -> bool:
        """Every value, each of its sub-expressions and its literals within int32 over the
        geometry: a fused form prints them as they are, and a Python int past int32 in a
        generated module makes JAX raise OverflowError at its first call."""
        return all(int_range.int32_overflow(v, self.domain) is None for v in values)

    def _window_terms(self, args: list) -> list[tuple[tuple, object, object, int]]:
        """(the conjuncts, a, b, c) of each window 0 <= a - b <= c among `args`, in their
        order, a reading only the query's coordinates and b only the key's."""
        pairs = chain_pairs(args, lambda x: split_sides(x) is not None)
        found = [((first, second), *split_sides(x), width) for first, second, x, width in pairs]
        paired = {c for first, second, _, _ in pairs for c in (first, second)}
        for x in args:
            term = None if x in paired else abs_window(x)
            if term is not None:
                found.append(((x,), *term))
        return found

    def _abs_within(self, e):
        """|x| <= c as one unsigned compare of x + c against 2c (runtime.coords.within):
        two full-tile VALU ops instead of four; the constant joins the narrow operand."""
        parts = self._within_parts(e)
        return None if parts is None else self.coords_call("within", f"{parts[0]}, {parts[1]}")

    def _within_parts(self, e) -> tuple[str, int] | None:
        """(x + c printed, 2c) when e is |x| <= c (or |x| < c + 1), else None."""
        found = abs_upper_bound(e)
        if found is None:
            return None
        x, bound = found
        shifted, width = sympy.Add(x, bound), 2 * bound
        if not self._sides_fit_int32(shifted, sympy.Integer(width)):
            return None  # x + c or 2c leaves int32 where x and c do not: printed with abs
        grouped = self._grouped_sides(shifted, width)
        return grouped or strip_group(self.integer(shifted)), width

    def _grouped_sides(self, shifted, width: int) -> str | None:
        """x printed as query side - key side for 0 <= x <= width where a side sums several
        coordinates (Radial Attention's place 80 * h + w): the query side is a query
        function (q.once: once per q tile), the key side a row of the block, so every pair
        pays one subtract where x printed term by term paid one per term after the first
        of the other side (and the 0 <= x <= width compare after it, as before). None where
        each side is one term: printed as it was."""
        sides = split_sides(shifted)
        if sides is None or not self._fits_int32(*sides):
            return None
        a, b = key_side_positive(*sides, width)
        constant, query = sympy.expand(a).as_coeff_Add()
        terms = [len(sympy.Add.make_args(side)) for side in (query, b)]
        if max(terms) < 2:
            return None
        with self.query_side() as query_reads:
            value = strip_group(self.integer(query))
        name = self._query_function(value, query_reads, reader="coords.within")
        return f"q.once({name}) - {self.integer(sympy.expand(b - constant))}"

    def _is_text_test(self, e):
        """is_text_x == 0/1 printed as the boolean itself."""
        sym, val = e.args
        if isinstance(sym, sympy.Integer):
            sym, val = val, sym
        if not (
            isinstance(sym, sympy.Symbol)
            and sym.name.startswith("is_text_")
            and isinstance(val, sympy.Integer)
            and int(val) in (0, 1)
        ):
            return None
        side = sym.name[-1]
        truth = (int(val) == 1) == isinstance(e, sympy.Eq)
        test = self.read(side, "is_text")
        return test if truth else f"~{test}"

    def integer(self, e) -> str:
        if isinstance(e, sympy.Symbol):
            if e.name.startswith("is_text_"):
                return self.read(e.name[-1], "is_text_int")
            coord, side = e.name.split("_")
            return self.read(side, _COORD[coord])
        if isinstance(e, sympy.Integer):
            v = int(e)
            return str(v) if v >= 0 else f"({v})"
        if isinstance(e, sympy.Add):
            # Positive terms first, so "q.frame - k.frame" rather than "(-k.frame) + q.frame".
            terms = sorted(e.as_ordered_terms(), key=_is_negative_term)
            out = ""
            for t in terms:
                negative = _is_negative_term(t)
                body = self.integer(-t if negative else t)
                # "a + (b - c)" may lose its parentheses, "a - (b - c)" and "-(b - c)" not.
                if not (negative and is_sum(strip_group(body))):
                    body = strip_group(body)
                out += (
                    (" - " if negative else " + ") + body
                    if out
                    else ("-" if negative else "") + body
                )
            return f"({out})"
        if isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            factors = " * ".join(self.integer(a) for a in sympy.Mul.make_args(rest))
            if coeff == 1:
                return f"({factors})"
            if coeff == -1:
                return f"(-{factors})"
            return f"({self.integer(coeff)} * {factors})"
        if isinstance(e, sympy.Abs):
            return f"jnp.abs({strip_group(self.integer(e.args[0]))})"
        if isinstance(e, (sympy.Min, sympy.Max)):
            fn = "jnp.minimum" if isinstance(e, sympy.Min) else "jnp.maximum"
            args = [self.integer(a) for a in sorted(e.args, key=_print_order)]
            out = strip_group(args[0])
            for a in args[1:]:
                out = f"{fn}({out}, {strip_group(a)})"
            return out
        if isinstance(e, (FloorDiv, FloorMod)):
            numerator, divisor = e.args
            d = int(divisor)
            if d > 1 and d & (d - 1) == 0:
                # A power of two: in two's complement x // 2^n is the arithmetic shift x >> n
                # and x % 2^n the low bits x & (2^n - 1), for negative x too (both floor), one
                # VALU op each where lax.div / lax.rem cost a sequence; no shift needed.
                # Calls, not the operators: & and >> bind looser than + and -.
                value = strip_group(self.integer(numerator))
                if isinstance(e, FloorMod):
                    return f"jnp.bitwise_and({value}, {d - 1})"
                return f"jnp.right_shift({value}, {d.bit_length() - 1})"
            # lax.div / lax.rem truncate toward zero: shift the dividend by a multiple of d
            # to make it non-negative (sympy folds the shift into its constant term).
            shift = int_range.non_negative_shift(numerator, d, self.domain)
            shifted = strip_group(self.integer(sympy.Add(numerator, shift)))
            if isinstance(e, FloorMod):
                return f"lax.rem({shifted}, {d})"
            return (
                f"(lax.div({shifted}, {d}) - {shift // d})" if shift else f"lax.div({shifted}, {d})"
            )
        raise TypeError(f"cannot print integer expression {e}")


@dataclasses.dataclass(frozen=True)
class _FieldTerm:
    """One conjunct (or a window's two) as 0 <= a - b <= width (None: a - b >= 0), a - b in
    lo .. hi over the geometry; kind says what printed it before (for the op count)."""

    conjuncts: tuple
    a: object
    b: object
    width: int | None
    lo: int
    hi: int
    kind: str  # "window", "equality" or "bound"
    order: int  # the first conjunct's place among the conjunction's, for a stable layout


def _separate_ops(terms: list[_FieldTerm]) -> int:
    """Full-block ops of the terms printed without coords.fields: two per window (a
    subtract and a compare), one compare per bound, one for all the equalities (coords.same)
    or one each, and an AND between each printed part and the next (windows fused by
    coords.windows cost the same two per window)."""
    kinds = [t.kind for t in terms]
    windows, bounds = kinds.count("window"), kinds.count("bound")
    equalities = min(kinds.count("equality"), 1)
    parts = windows + bounds + equalities
    return 2 * windows + bounds + equalities + parts - 1


def _field_scale(width: int | None, hi: int) -> tuple[int, int]:
    """(m, bits) with 0 <= x <= width exactly when 0 <= m * x <= 2^bits - 1 for an integer
    x, bits the fewest: m * width <= 2^bits - 1 < m * (width + 1). width None (x >= 0, and x
    <= hi anyway): m 1 and 2^bits - 1 >= hi."""
    if width is None:
        return 1, max(hi, 0).bit_length()
    if width == 0:
        return 1, 0
    bits = width.bit_length()
    while True:
        top = (1 << bits) - 1
        m = top // width
        if m * (width + 1) > top:
            return m, bits
        bits += 1


def _field(lo: int, hi: int, width: int | None) -> tuple[int, int, int]:
    """(m, bits, room) of a term's field (_field_scale), room the bits it takes: its kept
    bits and room above them for every m * x with x in lo .. hi, so that m * x modulo
    2^room is at most 2^bits - 1 only when m * x itself is (0 <= m * x < 2^room, and
    m * x > 2^bits - 1 - 2^room)."""
    m, bits = _field_scale(width, hi)
    top = (1 << bits) - 1
    return m, bits, max(bits, max(m * hi, top - m * lo).bit_length())


def _field_layout(terms) -> list[tuple[int, int, int]] | None:
    """(m, shift, bits) per (lo, hi, width) term, the fields side by side from bit 0, or
    None when they need more than 32 bits. A field without room (a - b is 0 on every pair)
    adds nothing to the difference at any shift: it takes shift 0, never one past the
    word's 31 (the next free bit may be 32, and an int32 shift by 32 is no shift to
    rely on)."""
    layout, shift = [], 0
    for lo, hi, width in terms:
        m, bits, room = _field(lo, hi, width)
        layout.append((m, shift if room else 0, bits))
        shift += room
    return layout if shift <= 32 else None


def _common_width(widths: list[int]) -> tuple[int, list[int]] | None:
    """(W, m per window) with m * c <= W < m * (c + 1) for each width c (m = W + 1 for
    c = 0), W the smallest such at most MAX_COMMON_WIDTH: then for an integer x,
    0 <= x <= c exactly when 0 <= m * x <= W."""
    for common in range(max(widths), MAX_COMMON_WIDTH + 1):
        scales = []
        for c in widths:
            m = common + 1 if c == 0 else common // c
            if c and m * (c + 1) <= common:
                break
            scales.append(m)
        else:
            return common, scales
    return None


def _print_order(e):
    return sympy.default_sort_key(e)


def _is_negative_term(t) -> bool:
    return bool(t.as_coeff_Mul()[0].is_negative)
