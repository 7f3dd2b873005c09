"""Mask trees: primitives, combinators, refs and predicates read into `MaskTerm`s through
the primitive registry, the patterns' dependency order, and each mask's size and depth
with refs expanded, checked before lowering.
"""

from __future__ import annotations

import math

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from svgen.spec import primitives
from svgen.spec.errors import SpecError
from svgen.spec.expr import ExprSyntaxError, parse_predicate, predicate_tokens
from svgen.spec.limits import (
    MAX_MASK_DEPTH,
    MAX_MASK_SIZE,
    MAX_PATH_CHARS,
)
from svgen.spec.model import Location, MaskTerm
from svgen.spec.nodes import MISSING, Reader, join_path, key_text
from svgen.spec.quoting import control_character

# ----------------------------------------------------------------------------- masks


def is_null(r: Reader, node: Node, path: str | None = None) -> bool:
    return isinstance(node, ScalarNode) and r.scalar(node, path) is None


def _expr_error_position(
    r: Reader, node: ScalarNode, value: str, offset: int
) -> tuple[int, int] | None:
    """1-based (line, column) of ``offset`` into the expression, when it can be told exactly."""
    lines = r.text.splitlines()
    offset = min(offset, len(value.rstrip()))  # "unexpected end": just after the last character
    start, end = node.start_mark, node.end_mark
    if node.style in (None, "'", '"'):
        if start.line != end.line or start.line >= len(lines):
            return None
        quote = 1 if node.style else 0
        col0 = start.column + quote
        if lines[start.line][col0 : col0 + len(value)] != value:
            return None  # escapes or folding: the text differs from the value
        return start.line + 1, col0 + offset + 1
    if node.style == "|":
        before = value[:offset]
        k = before.count("\n")
        col_in_line = offset - (before.rfind("\n") + 1)
        value_lines = value.split("\n")
        # Content starts on the line after the indicator; find where this value line sits.
        src_index = start.line + 1 + k
        if k >= len(value_lines) or src_index >= len(lines):
            return None
        src = lines[src_index]
        vline = value_lines[k]
        if not vline or not src.endswith(vline):
            return None
        return src_index + 1, len(src) - len(vline) + col_in_line + 1
    return None


_SIZE_LIMIT = "MAX_MASK_SIZE: one per primitive or combinator, one per token of an expr"


def _error_at(term: MaskTerm, message: str) -> SpecError:
    w = term.where
    if w is None:
        return SpecError(message)
    return SpecError(message, file=w.file, line=w.line, column=w.column, key=w.key)


def _form(term: MaskTerm) -> str:
    return primitives.get(term.op).form


def pattern_graph(patterns: dict[str, MaskTerm]):
    """The named patterns as a networkx DiGraph: an edge from each pattern to every known
    pattern it refers to (unknown names are left out: whoever reads the graph reports them).
    The one dependency order of patterns, for the spec reader and for lowering (svgen.ir)."""
    # Imported here: 0.2-0.3 s that a spec without named patterns never needs.
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(sorted(patterns))
    for name, term in sorted(patterns.items()):
        targets = (ref.param("name") for ref in term.references())
        graph.add_edges_from((name, target) for target in targets if target in patterns)
    return graph


def dependency_order(graph) -> list[str]:
    """The patterns of `pattern_graph`, each after every pattern it refers to, ties broken by
    name (deterministic). Patterns in a cycle, or referring to one, are left out: lowering
    reports the cycle."""
    import networkx as nx

    in_cycles = (c for c in nx.strongly_connected_components(graph) if len(c) > 1)
    tainted = {n for c in in_cycles for n in c} | {n for n in graph if graph.has_edge(n, n)}
    frontier = list(tainted)
    while frontier:  # everything that refers to a cycle, breadth first (no recursion)
        for user in graph.predecessors(frontier.pop()):
            if user not in tainted:
                tainted.add(user)
                frontier.append(user)
    acyclic = graph.subgraph(n for n in graph if n not in tainted)
    return list(nx.lexicographical_topological_sort(acyclic.reverse(copy=True)))


class MaskReader:
    """Reads masks, bounding each one's size as it is written (before any expr is handed to
    sympy) and, once every pattern is read, its size and depth with refs expanded."""

    def __init__(self, r: Reader):
        self.r = r
        self.size = 0  # of the mask being read
        self.tokens: dict[str, int] = {}  # expr text -> tokens; each text is parsed once

    def read_mask(self, node: Node, path: str) -> MaskTerm:
        """One whole mask: the spec's ``mask`` or one pattern."""
        self.size = 0
        return self.read(node, path)

    def _grow(self, node: Node, path: str, weight: int) -> None:
        self.size += weight
        if self.size > MAX_MASK_SIZE:
            raise self.r.error(
                node, path, f"the mask is larger than {MAX_MASK_SIZE} nodes ({_SIZE_LIMIT})"
            )

    def read(self, node: Node, path: str, depth: int = 0) -> MaskTerm:
        r = self.r
        if depth > MAX_MASK_DEPTH:
            raise r.error(
                node, path, f"masks are nested more than {MAX_MASK_DEPTH} deep (MAX_MASK_DEPTH)"
            )
        if not isinstance(node, MappingNode):
            raise r.error(
                node,
                path,
                f"a mask must be a mapping with exactly one key (one of: "
                f"{', '.join(primitives.keys())}), got {r.describe(node)}",
            )
        keys = [key_text(k.value) if isinstance(k, ScalarNode) else "?" for k, _ in node.value]
        if len(keys) != 1:
            listed = f": {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}" if keys else ""
            raise r.error(node, path, f"a mask has exactly one key, got {len(keys)}{listed}")
        knode, vnode = node.value[0]
        if not isinstance(knode, ScalarNode):
            raise r.error(
                knode, path, f"a mask key must be a primitive name, got {r.describe(knode)}"
            )
        op = knode.value
        op_path = join_path(path, key_text(op))
        primitive = primitives.get(op)
        if primitive is None:
            raise r.error(
                knode,
                op_path,
                f"unknown mask primitive '{key_text(op)}'; allowed: {', '.join(primitives.keys())}",
            )
        where = r.location(knode, op_path)
        if primitive.form != primitives.PREDICATE:  # a predicate counts its tokens instead
            self._grow(knode, op_path, 1)
        return self._FORMS[primitive.form](self, primitive, vnode, op_path, where, depth)

    def _predicate(
        self,
        primitive: primitives.Primitive,
        vnode: Node,
        op_path: str,
        where: Location,
        depth: int,
    ) -> MaskTerm:
        source = self.r.string(vnode, op_path, "a string holding a predicate")
        self._expr(vnode, op_path, source)
        return MaskTerm(primitive.key, (("source", source),), (), where)

    def _masks(
        self,
        primitive: primitives.Primitive,
        vnode: Node,
        op_path: str,
        where: Location,
        depth: int,
    ) -> MaskTerm:
        if not isinstance(vnode, SequenceNode) or not vnode.value:
            raise self.r.error(
                vnode, op_path, f"must be a non-empty list of masks, got {self.r.describe(vnode)}"
            )
        children = tuple(
            self.read(item, f"{op_path}[{i}]", depth + 1) for i, item in enumerate(vnode.value)
        )
        return MaskTerm(primitive.key, (), children, where)

    def _mask(
        self,
        primitive: primitives.Primitive,
        vnode: Node,
        op_path: str,
        where: Location,
        depth: int,
    ) -> MaskTerm:
        return MaskTerm(primitive.key, (), (self.read(vnode, op_path, depth + 1),), where)

    def _pattern(
        self,
        primitive: primitives.Primitive,
        vnode: Node,
        op_path: str,
        where: Location,
        depth: int,
    ) -> MaskTerm:
        name = self.r.name(vnode, op_path, "a pattern name")
        return MaskTerm(primitive.key, (("name", name),), (), where)

    def _expr(self, vnode: ScalarNode, op_path: str, source: str) -> None:
        """Check a predicate: its tokens count towards the mask's size before it is parsed,
        and a text met again (through a YAML alias) is not parsed again."""
        try:
            if source not in self.tokens:
                tokens = predicate_tokens(source)
                self._grow(vnode, op_path, tokens)
                parse_predicate(source)
                self.tokens[source] = tokens
            else:
                self._grow(vnode, op_path, self.tokens[source])
        except ExprSyntaxError as exc:
            pos = _expr_error_position(self.r, vnode, source, exc.offset)
            if pos is None:
                raise self.r.error(vnode, op_path, f"invalid expression: {exc.message}") from None
            raise SpecError(
                f"invalid expression: {exc.message}",
                file=self.r.source,
                line=pos[0],
                column=pos[1],
                key=op_path,
            ) from None

    def check_expanded(self, mask: MaskTerm | None, patterns: list[tuple[str, MaskTerm]]) -> None:
        """Each mask's size and depth once refs are expanded, computed per pattern once
        (dependencies first), so that a fan-out of refs is refused without expanding it."""
        known = dict(patterns)
        measured: dict[str, tuple[int, int]] = {}
        for name in dependency_order(pattern_graph(known)) if known else ():
            measured[name] = self._measure(known[name], measured)
        if mask is not None:
            self._measure(mask, measured)

    def _measure(self, term: MaskTerm, measured: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """(size, depth) of ``term`` with refs expanded; a ref to a pattern not measured (an
        unknown name, or one in a cycle) counts as a leaf: lowering reports those."""
        form = _form(term)
        if form == primitives.PATTERN:
            target = measured.get(term.param("name"))
            size, depth = (1, 0) if target is None else (1 + target[0], 1 + target[1])
        elif form == primitives.PREDICATE:
            size, depth = self.tokens[term.param("source")], 0
        else:
            parts = [self._measure(child, measured) for child in term.children]
            size = 1 + sum(p[0] for p in parts)
            depth = 1 + max(p[1] for p in parts) if parts else 0
        if size > MAX_MASK_SIZE:
            raise _error_at(
                term,
                f"the mask is larger than {MAX_MASK_SIZE} nodes once refs are "
                f"expanded ({_SIZE_LIMIT}; a ref counts the whole pattern "
                f"it names, each time)",
            )
        if depth > MAX_MASK_DEPTH:
            raise _error_at(
                term,
                f"masks are nested more than {MAX_MASK_DEPTH} deep once refs "
                f"are expanded (MAX_MASK_DEPTH; a ref and the pattern it "
                f"names count as levels)",
            )
        return size, depth

    def _params(
        self,
        primitive: primitives.Primitive,
        vnode: Node,
        op_path: str,
        where: Location,
        depth: int,
    ) -> MaskTerm:
        """A primitive's parameter mapping, checked against its declaration (names,
        required ones, ``one_of``, each value's kind and range); null stands for {}."""
        r, op = self.r, primitive.key
        if not primitive.params:
            if is_null(r, vnode, op_path):
                return MaskTerm(op, (), (), where)
            if not isinstance(vnode, MappingNode):
                raise r.error(
                    vnode,
                    op_path,
                    f"must be an empty mapping {{}} or null, got {r.describe(vnode)}",
                )
            r.mapping(vnode, op_path, (), allowed_note=f"'{op}' takes no parameters")
            return MaskTerm(op, (), (), where)
        if is_null(r, vnode, op_path):
            entries: dict[str, tuple[Node, Node]] = {}
        else:
            entries = r.mapping(vnode, op_path, primitive.param_names)
        r.require(vnode, op_path, entries, primitive.required)
        if primitive.one_of:
            present = [k for k in primitive.one_of if k in entries]
            if len(present) != 1:
                raise r.error(
                    vnode,
                    op_path,
                    f"{op} needs exactly one of "
                    f"{_or_list(primitive.one_of)}, got "
                    f"{_how_many(present, len(primitive.one_of))}",
                )
        params = {
            p.name: _param_value(r, p, entries[p.name][1], join_path(op_path, p.name))
            for p in primitive.params
            if p.name in entries
        }
        return MaskTerm(op, tuple(sorted(params.items())), (), where)

    _FORMS = {
        primitives.PARAMS: _params,
        primitives.PREDICATE: _predicate,
        primitives.MASKS: _masks,
        primitives.MASK: _mask,
        primitives.PATTERN: _pattern,
    }


def _param_value(r: Reader, param: primitives.Param, node: Node, path: str) -> int | float | str:
    """One parameter's value, checked against its kind and range before anything uses it."""
    if param.kind == primitives.INTEGER:
        return r.integer(node, path, param.minimum, param.maximum, param.limit)
    if param.kind == primitives.TEXT:
        value = r.string(node, path)
        if not value or len(value) > MAX_PATH_CHARS:
            raise r.error(
                node,
                path,
                f"must be a non-empty string of at most {MAX_PATH_CHARS} characters "
                f"(MAX_PATH_CHARS), got {r.describe(node)}",
            )
        control = control_character(value)
        if control is not None:  # the generated module names it: a name is never code
            raise r.error(
                node,
                path,
                f"must hold no control character (line break, NUL, tab...), got {control}",
            )
        return value
    assert param.kind == primitives.FRACTION, param.kind
    must = f"must be a number with 0 < {param.name} <= 1"
    value = r.scalar(node, path) if isinstance(node, ScalarNode) else MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise r.error(node, path, f"{must}, got {r.describe(node)}")
    if not (math.isfinite(value) and 0 < value <= 1):
        raise r.error(node, path, f"{must}, got {node.value}")
    return float(value)


def _or_list(names: tuple[str, ...]) -> str:
    """'a' or 'b'; 'a', 'b' or 'c'."""
    quoted = [f"'{n}'" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _how_many(present: list[str], choices: int) -> str:
    """What was given instead of exactly one of ``choices`` parameters, in words."""
    if not present:
        return "neither" if choices == 2 else "none"
    return "both" if len(present) == choices == 2 else ", ".join(present)
