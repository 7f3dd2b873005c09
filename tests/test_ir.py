"""Lowering spec terms to the mask IR: named patterns, desugaring, simplification."""

import pytest

from svgen import ir
from svgen.errors import SpecError
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
