"""Lowering: spec terms -> nodes, named patterns resolved in dependency order."""

from __future__ import annotations


from svgen.spec import primitives
from svgen.spec import int_range
from svgen.spec.errors import SpecError
from svgen.spec.expr import parse_predicate
from svgen.spec import MaskTerm, Spec, dependency_order, pattern_graph

from svgen.ir.nodes import AllOf, BlockCausal, Node, simplify
from svgen.ir.recognize import recognize_builtins


def _where(term: MaskTerm) -> dict:
    w = term.where
    return {} if w is None else {"file": w.file, "line": w.line, "column": w.column, "key": w.key}


def lower(spec: Spec, term: MaskTerm | None = None) -> Node:
    """A mask term of the spec (default: its `mask`) as a simplified node, refs resolved."""
    term = spec.mask if term is None else term
    patterns = dict(spec.patterns)
    order = _pattern_order(term, patterns)
    lowered: dict[str, Node] = {}
    for name in order:
        lowered[name] = _lower_term(patterns[name], spec, lowered)
    node = _lower_term(term, spec, lowered)
    if spec.runtime.kv_cache:
        # Chunked generation: a chunk sees only the frames generated before it and itself,
        # whatever the mask says of later ones (they are not in the cache yet).
        node = AllOf((node, BlockCausal(spec.runtime.chunk_frames)))
    return simplify(node)


def _pattern_order(term: MaskTerm, patterns: dict[str, MaskTerm]) -> list[str]:
    """Patterns in dependency order (svgen.spec.dependency_order); unknown names and cycles
    are SpecErrors."""
    known = ", ".join(sorted(patterns)) or "none defined"
    for root in [term] + [t for _, t in sorted(patterns.items())]:
        for ref in root.references():
            if ref.param("name") not in patterns:
                raise SpecError(
                    f"unknown pattern {ref.param('name')!r} (patterns: {known})", **_where(ref)
                )
    if not patterns:  # the common case: nothing to order
        return []
    import networkx as nx

    graph = pattern_graph(patterns)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        chain = " -> ".join([a for a, _ in cycle] + [cycle[0][0]])
        first = patterns[cycle[0][0]]
        raise SpecError(f"patterns refer to each other in a cycle: {chain}", **_where(first))
    return dependency_order(graph)


def _lower_term(term: MaskTerm, spec: Spec, patterns: dict[str, Node]) -> Node:
    primitive = primitives.get(term.op)
    form = primitive.form
    if form == primitives.PATTERN:
        return patterns[term.param("name")]
    if form == primitives.PARAMS:
        from_term = getattr(primitive.node_class, "from_term", None)
        if from_term is not None:  # a node that reads a file, and says where it is wrong
            return from_term(term, spec)
        return primitive.lower(dict(term.params), spec.geometry)
    if form == primitives.PREDICATE:
        source = term.param("source")
        expr = parse_predicate(source)
        _check_device_range(expr, spec.geometry, term)
        return recognize_builtins(expr, spec.geometry) or primitive.node_class(source, expr)
    children = tuple(_lower_term(c, spec, patterns) for c in term.children)
    if form == primitives.MASKS:
        return primitive.node_class(children)
    assert form == primitives.MASK, form
    return primitive.node_class(children[0])


def _check_device_range(expr, geometry, term: MaskTerm) -> None:
    """Refuse a predicate that int32 cannot evaluate over this geometry (svgen.spec.int_range):
    the analysis would count its pairs exactly and the kernel compute others."""
    domain = int_range.coordinate_domain(
        geometry.frames, geometry.height, geometry.width, geometry.seq_len
    )
    overflow = int_range.int32_overflow(expr, domain)
    if overflow is not None:
        sub, (lo, hi) = overflow
        raise SpecError(
            f"{sub} takes values {lo:,} .. {hi:,} on this geometry, outside the kernel's "
            f"int32 ({int_range.INT32_MIN:,} .. {int_range.INT32_MAX:,}); rewrite the "
            "predicate with smaller factors or offsets",
            **_where(term),
        )
