"""Lowering spec terms to the mask IR: named patterns, desugaring, simplification."""

import pytest

from svgen import ir
from svgen.spec.errors import SpecError
from svgen.spec import parse_spec

HEAD = """svgen: 1
name: t
geometry: {frames: 21, height: 45, width: 80}
attention: {heads: 1, head_dim: 128, dtype: bfloat16}
"""


def lower(body: str) -> ir.Node:
    return ir.lower(parse_spec(HEAD + body, source="t.yaml"))


def test_named_patterns_resolve_in_dependency_order():
    node = lower("""patterns:
  outer: {any_of: [{ref: inner}, {text: {}}]}
  inner: {spatial_window: {frames: 1}}
mask: {all_of: [{ref: outer}, {not: {ref: inner}}]}
""")
    inner = ir.SpatialWindow(1, None, None)
    assert node == ir.AllOf((ir.AnyOf((inner, ir.Text())), ir.Not(inner)))


def test_unknown_pattern_names_the_reference():
    with pytest.raises(SpecError) as err:
        lower("patterns: {a: {text: {}}}\nmask: {any_of: [{ref: a}, {ref: b}]}\n")
    assert str(err.value) == "t.yaml:6:28: mask.any_of[1].ref: unknown pattern 'b' (patterns: a)"


def test_cycle_names_the_chain():
    with pytest.raises(SpecError, match="cycle: a -> b -> c -> a"):
        lower("patterns:\n  a: {ref: b}\n  b: {ref: c}\n  c: {not: {ref: a}}\nmask: {ref: a}\n")


def test_band_density_uses_the_tpu_port_rule():
    assert lower("mask: {band: {density: 0.35}}\n") == ir.Band(14720)


def test_simplify_flattens_and_folds_constants():
    a, b = ir.FirstFrame(1), ir.Band(3)
    assert ir.simplify(ir.AnyOf((a, ir.AnyOf((b, a))))) == ir.AnyOf((a, b))
    assert ir.simplify(ir.AllOf((a, ir.Always(True)))) == a
    assert ir.simplify(ir.AnyOf((a, ir.Always(True)))) == ir.Always(True)
    assert ir.simplify(ir.Not(ir.Not(a))) == a
    assert lower('mask: {expr: "f_q >= 0"}\n') == ir.Always(True)


def test_defaults_of_primitives():
    assert lower("mask: {temporal_stride: {}}\n") == ir.TemporalStride(0, 0, 1, None)
    assert lower("mask: {first_frame: {}}\n") == ir.FirstFrame(1)


RECOGNIZABLE = [
    "abs(f_q - f_k) <= 4 and (f_q - f_k) % 2 == 0 and abs(h_q - h_k) <= 1 and abs(w_q - w_k) <= 2",
    "2 >= abs(f_k - f_q)",
    "h_q == h_k and w_q == w_k",
    "abs(h_q - h_k) < 2 and f_q == f_k",
    "(f_k - f_q) % 3 == 0",
    "abs(w_q - w_k) <= 1 and not is_text_q and not is_text_k",
]
NOT_RECOGNIZABLE = [
    "abs(h_q - h_k) < 3 and i_k < 5",
    "abs(f_q - f_k) <= 1 or h_q == h_k",
    "abs(f_q - 2 * f_k) <= 1",
]


@pytest.mark.parametrize("text_tokens", [0, 9])
@pytest.mark.parametrize("source", RECOGNIZABLE + NOT_RECOGNIZABLE)
def test_window_predicates_become_builtins_with_the_same_meaning(source, text_tokens):
    import numpy as np

    from svgen.spec.expr import parse_predicate
    from svgen.core.layout import TokenLayout

    expr = parse_predicate(source)
    node = ir.recognize_window(expr, TokenLayout(5, 4, 6, text_tokens, "first"))
    guarded = "is_text" in source
    if source in NOT_RECOGNIZABLE or (text_tokens and not guarded):
        assert node is None
        return
    assert isinstance(node, (ir.SpatialWindow, ir.TemporalStride))
    lay = TokenLayout(5, 4, 6, text_tokens, "first")
    c = lay.coordinates(np.arange(lay.seq_len))
    q, k = c.reshape(-1, 1), c.reshape(1, -1)
    np.testing.assert_array_equal(
        node.evaluate(q, k), np.broadcast_to(ir.evaluate_sympy(expr, q, k), (lay.seq_len,) * 2)
    )


def _ref(name: str):
    from svgen.spec import MaskTerm

    return MaskTerm("ref", (("name", name),))


def _refs_to(*names: str):
    from svgen.spec import MaskTerm

    return MaskTerm("any_of", (), tuple(_ref(n) for n in names))


def test_dependency_order_puts_each_pattern_after_its_references_and_leaves_cycles_out():
    from svgen.spec import dependency_order, pattern_graph

    patterns = {
        "a": _ref("b"),
        "b": _ref("c"),
        "c": _ref("b"),  # b and c: a cycle; a refers to it
        "d": _refs_to("e", "f"),
        "e": _ref("f"),
        "f": _ref("nowhere"),  # unknown: lowering says so; no edge here
        "g": _ref("g"),  # refers to itself
        "h": _refs_to("d", "g"),  # refers to a self-reference
    }
    assert dependency_order(pattern_graph(patterns)) == ["f", "e", "d"]


def test_dependency_order_of_a_long_chain_does_not_recurse():
    from svgen.spec import dependency_order, pattern_graph

    n = 5000  # deeper than Python's recursion limit
    patterns = {f"p{i:05d}": _ref(f"p{i + 1:05d}") for i in range(n)}
    assert dependency_order(pattern_graph(patterns)) == [f"p{i:05d}" for i in reversed(range(n))]
