"""The primitive registry: every primitive has every piece, and a new one takes three steps.

The guard tests are parametrized by spec key, so a primitive that lacks a piece (its spec
parameters, IR node, row sets, generated-code name, docs/spec.md row) fails under its own name.
The toy primitive at the end is added the way CONTRIBUTING.md says, without editing a
library file, and then goes through the whole compiler.
"""

from __future__ import annotations

import ast
import dataclasses
import keyword
import os
import pathlib
import re
import tempfile

import jsonschema
import numpy as np
import pytest
import sympy

from svgen import codegen, ir
from svgen.spec import primitives
from svgen.analysis import analyze
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.analysis.key_sets import Bounds, nominal_keys
from svgen.analysis.mask_code import emit_mask
from svgen.spec.errors import SpecError
from svgen.spec.expr import SYMBOLS
from svgen.core.layout import TokenLayout
from svgen.spec.schema import spec_schema
from svgen.spec import parse_spec

from helpers import REPO, brute_force_kinds, dense_keep, lower_mask_dict, mask_spec_text
from kernel_helpers import emitted_function, emitted_keep

KEYS = primitives.keys()
WITH_NODE = [p.key for p in primitives.registered() if p.form != primitives.PATTERN]

#: Small layouts every order and text placement: (frames, height, width, text, text first,
#: order, anchor frames).
LAYOUTS = [
    TokenLayout(3, 2, 5, 0, "last"),
    TokenLayout(4, 3, 2, 7, "first"),
    TokenLayout(3, 2, 3, 5, "last", "temporal_major", 1),
    TokenLayout(4, 2, 2, 0, "last", "temporal_major", 0),
]


def _example_value(p: primitives.Primitive, lay: TokenLayout):
    """A valid value for primitive ``p``, built from its declaration (a TEXT parameter named
    `file` gets a block-mask file for ``lay``, written by `_example_file`)."""
    if p.form == primitives.PARAMS:
        skipped = set(p.one_of[1:])
        return {q.name: _example_param(q, lay) for q in p.params if q.name not in skipped}
    if p.form == primitives.PREDICATE:
        return "i_k < 3 or f_q == f_k + 1"
    if p.form == primitives.MASKS:
        return [{"first_frame": {}}, {"causal_frames": {}}]
    if p.form == primitives.MASK:
        return {"first_frame": {}}
    return "anchor"


def _example_param(q: primitives.Param, lay: TokenLayout):
    if q.kind == primitives.FRACTION:
        return 0.5
    if q.kind == primitives.TEXT:
        return _example_file(lay) if q.name == "file" else "example"
    return max(q.minimum, 1)


def _example_file(lay: TokenLayout) -> str:
    """A .npz whose member `example` holds two random 0/1 masks of blocks of 1 token (what
    the declared minima of a `blocks` example ask for: block 1, head 1)."""
    folder = pathlib.Path(tempfile.gettempdir()) / f"svgen-example-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    path = folder / f"blocks_{lay.seq_len}.npz"
    if not path.exists():
        bits = np.random.default_rng(lay.seq_len).random((2, lay.seq_len, lay.seq_len)) < 0.5
        np.savez(path, example=bits.astype(np.uint8))
    return str(path)


def _example_spec(key: str, lay: TokenLayout = LAYOUTS[1]):
    """(spec, lowered mask) of a spec whose mask is primitive ``key``'s example."""
    p = primitives.get(key)
    mask = {key: _example_value(p, lay)}
    if p.form == primitives.PATTERN:
        return _with_pattern(mask, lay)
    return lower_mask_dict(mask, lay, 128, 128)


def _with_pattern(mask: dict, lay: TokenLayout):
    text = mask_spec_text(
        mask,
        lay,
        name="example",
        order=None,
        tiling=False,
        patterns={"anchor": {"first_frame": {}}},
    )
    spec = parse_spec(text)
    return spec, ir.lower(spec)


# ----------------------------------------------------------------------------- the guard


@pytest.mark.parametrize("key", KEYS)
def test_spec_parameters_are_declared_coherently(key):
    p = primitives.get(key)
    assert p.form in (
        primitives.PARAMS,
        primitives.PREDICATE,
        primitives.MASKS,
        primitives.MASK,
        primitives.PATTERN,
    )
    assert p.doc and "\n" not in p.doc, "a one-line doc"
    assert re.fullmatch(r"[a-z][a-z0-9_]*", key)
    assert not p.params or p.form == primitives.PARAMS, "only PARAMS primitives take params"
    assert len(set(p.param_names)) == len(p.params)
    for q in p.params:
        assert q.kind in (primitives.INTEGER, primitives.FRACTION, primitives.TEXT), q.name
        assert q.doc, f"{key}.{q.name} has no doc"
        if q.kind == primitives.INTEGER:
            assert 0 <= q.minimum <= q.maximum, q.name
            assert q.default is None or q.minimum <= q.default <= q.maximum, q.name
        assert not (q.required and q.default is not None), f"{key}.{q.name}: required or default"
    assert set(p.one_of) <= set(p.param_names) - set(p.required)
    spec, _ = _example_spec(key)
    assert spec.mask.op == key


@pytest.mark.parametrize("key", WITH_NODE)
def test_ir_node_exists_and_is_what_the_spec_lowers_to(key):
    p = primitives.get(key)
    assert isinstance(p.node_class, type), f"{key}: no IR node"
    for method in ("evaluate", "predicate", "describe"):
        assert callable(getattr(p.node_class, method, None)), f"{key}: no {method}"
    # the facts the analysis reads of it (safe defaults where it declares none)
    assert issubclass(p.node_class, ir.NodeFacts), f"{key}: its node does not inherit NodeFacts"
    assert dataclasses.is_dataclass(p.node_class) and p.node_class.__hash__ is not None
    _, node = _example_spec(key)
    assert isinstance(node, p.node_class), (key, node)
    assert primitives.by_node(p.node_class) is p


@pytest.mark.parametrize("key", WITH_NODE)
def test_row_bounds_exist_and_classify_exactly(key):
    p = primitives.get(key)
    assert callable(p.rows_function), f"{key}: no row-set function"
    for lay in LAYOUTS:
        _, node = _example_spec(key, lay)
        got = classify_tiles(node, lay, TileGrid(lay.seq_len, 8, 16))
        keep = dense_keep(node, lay)
        assert got.kept_pairs == int(keep.sum())
        np.testing.assert_array_equal(got.kinds, brute_force_kinds(keep, 8, 16), err_msg=key)


@pytest.mark.parametrize("key", WITH_NODE)
def test_generated_code_name_names_the_line(key):
    p = primitives.get(key)
    assert p.code_name and p.code_name.isidentifier() and not keyword.iskeyword(p.code_name)
    names = [q.code_name for q in primitives.registered() if q.code_name]
    assert names.count(p.code_name) == 1, f"{key}: code name {p.code_name!r} taken twice"
    _, node = _example_spec(key)
    lines = emit_mask(node, LAYOUTS[1]).lines
    assert any(line.startswith(f"{p.code_name} = ") for line in lines), lines


def _readme_primitives() -> list[str]:
    """Spec keys in the first cell of each row of the primitive table in docs/spec.md."""
    text = (REPO / "docs" / "spec.md").read_text()
    table = text.split("| primitive | keep(q, k) |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    keys = []
    for row in table.splitlines():
        first = row.split(" | ")[0]
        keys += re.findall(r"`([a-z_]+):", first)
    return keys


@pytest.mark.parametrize("key", KEYS)
def test_readme_documents_the_primitive(key):
    assert key in _readme_primitives(), f"docs/spec.md's primitive table has no row for {key!r}"


def test_readme_documents_no_other_primitive():
    assert set(_readme_primitives()) == set(KEYS)


def test_allowed_lists_come_from_the_registry():
    with pytest.raises(SpecError) as info:
        lower_mask_dict({"sliding": {}}, LAYOUTS[0], 128, 128)
    assert info.value.message.endswith("allowed: " + ", ".join(KEYS))
    assert KEYS[:13] == (
        "first_frame",
        "spatial_window",
        "temporal_stride",
        "band",
        "prefix",
        "text",
        "causal_frames",
        "block_causal",
        "cube_window",
        "neighborhood",
        "radial",
        "blocks",
        "expr",
    )


def test_registering_twice_or_removing_a_builtin_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        primitives.register(primitives.get("band"))
    with pytest.raises(ValueError, match="built-in"):
        primitives.unregister("band")


# ----------------------------------------------------------------------------- a new primitive
# The three steps of CONTRIBUTING.md's "Adding a mask primitive", written here instead of in
# svgen/ir/builtin_nodes.py, svgen/analysis/rowsets.py and svgen/spec/primitives.py.


# Step 1: the IR node, its oracle written from the documented meaning.
@dataclasses.dataclass(frozen=True)
class CausalBand(ir.NodeFacts):
    """0 <= i_q - i_k <= width (positions in the layout's order): a sliding causal window."""

    width: int

    def evaluate(self, q, k):
        diff = q.index - k.index
        return (diff >= 0) & (diff <= self.width)

    def predicate(self):
        diff = SYMBOLS["i_q"] - SYMBOLS["i_k"]
        return sympy.And(sympy.Ge(diff, 0), sympy.Le(diff, self.width))

    def describe(self):
        return f"causal band: 0 <= position difference <= {self.width}"


# Step 2: the row sets, per query row the keys [i_q - width, i_q] of the nominal order.
def causal_band_rows(node: CausalBand, chunk) -> Bounds:
    nominal = chunk.coords.index
    return Bounds.exact(
        nominal_keys(chunk, np.arange(chunk.num_rows), nominal - node.width, nominal + 1)
    )


# Step 3: the registry entry.
CAUSAL_BAND = primitives.Primitive(
    "causal_band",
    "0 <= i_q - i_k <= width (positions in the layout's order)",
    params=(primitives.Param("width", "largest position difference", required=True),),
    node=CausalBand,
    rows=causal_band_rows,
    code_name="causal_band",
)


@pytest.fixture
def causal_band():
    primitives.register(CAUSAL_BAND)
    try:
        yield CAUSAL_BAND
    finally:
        primitives.unregister(CAUSAL_BAND.key)


TOY_MASKS = [
    {"causal_band": {"width": 5}},
    {"any_of": [{"causal_band": {"width": 3}}, {"first_frame": {}}]},
    {"all_of": [{"causal_band": {"width": 9}}, {"not": {"spatial_window": {"frames": 0}}}]},
    {"not": {"causal_band": {"width": 0}}},
]


def test_new_primitive_is_parsed_and_checked(causal_band):
    spec, node = lower_mask_dict(TOY_MASKS[0], LAYOUTS[0], 128, 128)
    assert spec.mask.op == "causal_band" and spec.mask.param("width") == 5
    assert node == CausalBand(5)
    for value, message in (
        ({"width": -1}, "width: must be a non-negative integer, got -1"),
        ({}, "causal_band: missing required key 'width'"),
        ({"rows": 1}, "causal_band.rows: unknown key 'rows'; allowed keys: width"),
    ):
        with pytest.raises(SpecError) as info:
            lower_mask_dict({"causal_band": value}, LAYOUTS[0], 128, 128)
        assert str(info.value).endswith(message)
    with pytest.raises(SpecError) as info:
        lower_mask_dict({"sliding": {}}, LAYOUTS[0], 128, 128)
    assert info.value.message.endswith(", ref, causal_band")


@pytest.mark.parametrize("mask", TOY_MASKS, ids=range(len(TOY_MASKS)))
def test_new_primitive_classifies_and_generates_exactly(causal_band, mask):
    for lay in LAYOUTS:
        _, node = lower_mask_dict(mask, lay, 128, 128)
        keep = dense_keep(node, lay)
        for bq, bkv in ((8, 8), (16, 24)):
            got = classify_tiles(node, lay, TileGrid(lay.seq_len, bq, bkv))
            assert got.kept_pairs == int(keep.sum())
            np.testing.assert_array_equal(got.kinds, brute_force_kinds(keep, bq, bkv))
        fn, text = emitted_function(node, lay)
        assert "causal_band = " in text
        np.testing.assert_array_equal(emitted_keep(fn, lay), keep, err_msg=text)


def test_new_primitive_compiles_to_a_module_and_is_in_the_schema(causal_band):
    lay = LAYOUTS[1]
    spec, _ = lower_mask_dict(TOY_MASKS[1], lay, 128, 128)
    files = codegen.render(analyze(spec), "specs/random_mask.yaml")
    text = files["random_mask.py"].decode()
    ast.parse(text)
    assert "causal_band = " in text and "causal band: 0 <= position difference <= 3" in text
    schema = spec_schema()
    assert schema["$defs"]["mask"]["properties"]["causal_band"]["required"] == ["width"]
    document = {
        "svgen": 1,
        "name": "toy",
        "geometry": {"frames": 1, "height": 2, "width": 3},
        "attention": {"heads": 1, "head_dim": 64, "dtype": "float32"},
        "mask": {},
    }
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(dict(document, mask=TOY_MASKS[1]))
    assert not validator.is_valid(dict(document, mask={"causal_band": {"width": -1}}))
