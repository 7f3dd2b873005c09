"""Tests for svgen.spec: YAML specs to frozen, validated dataclasses with precise errors."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from spec_corpus import (
    BASE,
    CASES,
    FULL,
    FULL_REORDERED,
    HEADS_BASE,
    INTEGER_PARAMS,
    MINIMAL,
    MIXED,
    SPATIAL,
    _bad_values,
    _limits_spec,
    spec_text,
)
from svgen.spec.errors import SpecError
from svgen.spec.limits import MAX_SEQ_LEN, MAX_SPEC_BYTES
from svgen.spec import (
    Attention,
    Candidate,
    TokenLayout,
    HeadPatterns,
    Location,
    MaskTerm,
    Spec,
    Tiling,
    canonical_json,
    load_spec,
    parse_spec,
)


def test_full_spec_parses_to_expected_dataclasses():
    spec = parse_spec(FULL, source="specs/full.yaml")
    assert isinstance(spec, Spec)
    assert spec.name == "wan21_720p_spatial"
    assert spec.geometry == TokenLayout(
        frames=21, height=45, width=80, text_tokens=512, text_position="first"
    )
    assert spec.geometry.tokens_per_frame == 3600
    assert spec.geometry.video_tokens == 21 * 3600
    assert spec.geometry.seq_len == 21 * 3600 + 512
    assert spec.attention == Attention(heads=10, head_dim=128, dtype="bfloat16")
    assert spec.layout == "temporal_major"
    assert spec.tiling == Tiling(block_q=256, block_kv=1024)
    assert spec.source == "specs/full.yaml"
    expected_mask = MaskTerm(
        "any_of",
        (),
        (
            MaskTerm("first_frame", ()),
            MaskTerm("spatial_window", (("cols", 5), ("frames", 1), ("rows", 3))),
            MaskTerm("ref", (("name", "local"),)),
            MaskTerm("expr", (("source", "f_q // 2 == f_k // 2 and is_text_k"),)),
            MaskTerm("not", (), (MaskTerm("band", (("density", 0.5),)),)),
            MaskTerm(
                "all_of", (), (MaskTerm("prefix", (("tokens", 64),)), MaskTerm("causal_frames", ()))
            ),
        ),
    )
    assert spec.mask == expected_mask
    assert spec.patterns == (
        ("caption", MaskTerm("text", ())),
        ("local", MaskTerm("temporal_stride", (("rows", 1), ("stride", 2)))),
    )
    assert spec.digest == hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()
    assert len(spec.digest) == 64


def test_mask_terms_know_where_they_were_written():
    spec = parse_spec(FULL, source="specs/full.yaml")
    assert spec.mask.where == Location("specs/full.yaml", 8, 3, "mask.any_of")
    window = spec.mask.children[1]
    assert window.where == Location("specs/full.yaml", 10, 7, "mask.any_of[1].spatial_window")
    band = spec.mask.children[4].children[0]
    assert band.where == Location("specs/full.yaml", 14, 9, "mask.any_of[4].not.band")
    assert dict(spec.patterns)["local"].where.key == "patterns.local.temporal_stride"


def test_mask_term_param_and_hashing():
    spec = parse_spec(FULL)
    window = spec.mask.children[1]
    assert window.param("rows") == 3
    assert window.param("frames") == 1
    assert window.param("missing") is None
    assert window.param("missing", 7) == 7
    assert spec.mask.children[0].param("frames", 1) == 1  # defaults are not filled in
    # Locations take no part in equality or hashing.
    moved = dataclasses.replace(window, where=Location("elsewhere.yaml", 99, 1, "x"))
    assert moved == window and hash(moved) == hash(window)
    assert hash(spec) == hash(parse_spec(FULL))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_digest_is_stable_across_order_style_and_comments():
    a = parse_spec(FULL, source="a.yaml")
    b = parse_spec(FULL_REORDERED, source="b.yaml")
    assert a == dataclasses.replace(b, source="a.yaml")
    assert a.digest == b.digest
    assert canonical_json(a) == canonical_json(b)
    assert "a.yaml" not in canonical_json(a)


@pytest.mark.parametrize(
    "old,new",
    [
        ("heads: 10", "heads: 12"),
        ("block_q: 256", "block_q: 512"),
        ("text_position: first", "text_position: last"),
        ("layout: temporal_major", "layout: frame_major"),
        ("rows: 3", "rows: 4"),
        ("first_frame: {}", "first_frame: {frames: 1}"),
        ("density: 0.5", "density: 0.25"),
        ("f_k // 2 and", "f_k // 2 or"),
        ("name: wan21_720p_spatial", "name: wan21_720p_spatial2"),
        ("  caption:\n    text:\n", "  caption:\n    causal_frames:\n"),
        ("any_of:", "all_of:"),
    ],
)
def test_digest_changes_when_a_value_changes(old, new):
    assert FULL.count(old) == 1
    assert parse_spec(FULL).digest != parse_spec(FULL.replace(old, new)).digest


def test_defaults():
    spec = parse_spec(MINIMAL)
    assert spec.geometry == TokenLayout(2, 1, 1, 0, "last")
    assert spec.layout == "frame_major"
    assert spec.tiling == Tiling(512, 512)
    assert spec.patterns == ()
    assert spec.mask == MaskTerm("causal_frames", ())
    assert spec.source == "<string>"


def test_values_may_exceed_geometry():
    text = MINIMAL.replace(
        "mask: {causal_frames: }",
        "mask: {any_of: [{first_frame: {frames: 50}}, {prefix: {tokens: 100000}},"
        " {spatial_window: {frames: 9, rows: 0, cols: 0}}, {band: {width: 0}}, {band: {density: 1}}]}",
    )
    spec = parse_spec(text)
    assert spec.mask.children[0].param("frames") == 50
    assert spec.mask.children[4].param("density") == 1.0


def test_keys_left_to_their_defaults_stay_out_of_the_canonical_form():
    """spatial_window without `frames` and top_k without `max` read (every frame; the
    candidate's bound), and only what was written enters the canonical JSON, so the digest
    of a spec that writes the key is what it was (svgen compile --check: the shipped ones)."""
    text = MINIMAL.replace("mask: {causal_frames: }", "mask: {spatial_window: {rows: 1}}")
    spec = parse_spec(text + "select:\n  candidate: {text: }\n  top_k: {k: 3}\n")
    assert spec.mask == MaskTerm("spatial_window", (("rows", 1),))
    assert (spec.select.default, spec.select.min_blocks, spec.select.max_blocks) == (3.0, 0, None)
    written = canonical_json(spec)
    assert '"params":{"rows":1}' in written and '"top_k":{"default":3.0,"min":0}' in written
    given = parse_spec(text + "select:\n  candidate: {text: }\n  top_k: {k: 3, max: 3}\n")
    assert '"top_k":{"default":3.0,"max":3,"min":0}' in canonical_json(given)


def test_load_spec(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(MINIMAL)
    spec = load_spec(path)
    assert spec.source == str(path)
    assert spec.digest == parse_spec(MINIMAL).digest
    assert load_spec(str(path)) == spec


def test_load_spec_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    assert str(info.value) == f"{missing}: cannot read the spec file: No such file or directory"
    assert info.value.file == str(missing)


def test_spec_error_formatting():
    e = SpecError(
        "must be a non-negative integer, got -1",
        file="specs/x.yaml",
        line=12,
        column=7,
        key="mask.any_of[1].spatial_window.frames",
    )
    assert (
        str(e)
        == "specs/x.yaml:12:7: mask.any_of[1].spatial_window.frames: must be a non-negative integer, got -1"
    )
    assert (e.message, e.file, e.line, e.column, e.key) == (
        "must be a non-negative integer, got -1",
        "specs/x.yaml",
        12,
        7,
        "mask.any_of[1].spatial_window.frames",
    )
    assert str(SpecError("msg", file="specs/x.yaml", key="k")) == "specs/x.yaml: k: msg"
    assert str(SpecError("msg")) == "msg"
    assert str(SpecError("msg", file="f.yaml", line=3)) == "f.yaml:3: msg"


def test_yaml_error_has_line_and_column():
    with pytest.raises(SpecError) as info:
        parse_spec("svgen: 1\nname: [x\n", source="s.yaml")
    assert info.value.file == "s.yaml"
    assert info.value.line is not None and info.value.column is not None
    assert info.value.message.startswith("YAML syntax error: ")


def test_empty_spec():
    with pytest.raises(SpecError) as info:
        parse_spec("# nothing here\n", source="e.yaml")
    assert str(info.value) == (
        "e.yaml: the spec is empty; expected a mapping with keys svgen, name, geometry, "
        "attention, layout, mask, heads, patterns, tiling, gpu, runtime, select"
    )


def test_deeply_nested_masks_are_refused():
    text = MINIMAL.replace(
        "mask: {causal_frames: }", "mask: " + "{not: " * 80 + "{text: {}}" + "}" * 80
    )
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert "nested more than 64 deep" in info.value.message


# ----------------------------------------------------------------------------- heads


MIXED_ASSIGN = (
    "[spatial, temporal, spatial, spatial, temporal, temporal, spatial, spatial, spatial, temporal]"
)

#: Digest of specs/wan21_720p_spatial.yaml before the 'heads' section existed. Generated
#: files embed digests: a spec without 'heads' must keep exactly this one.
SPATIAL_DIGEST = "77fc9c45d81818d477f1004f8cb332251e9848fc2fc585e070f798e33c570ecf"


# The Wan spatial spec as first shipped (512 x 512 tiles); its digest predates `heads`.
SPATIAL_AS_FIRST_SHIPPED = spec_text(
    "wan21_720p_spatial",
    (21, 45, 80, 0, "last"),
    10,
    dtype="bfloat16",
    layout="frame_major",
    mask=SPATIAL,
    tiling="{block_q: 512, block_kv: 512}",
)


def test_mask_only_digest_is_unchanged():
    spec = parse_spec(SPATIAL_AS_FIRST_SHIPPED, source="specs/wan21_720p_spatial.yaml")
    assert spec.heads is None
    assert spec.digest == SPATIAL_DIGEST
    assert '"heads":{' not in canonical_json(spec) and '"heads":null' not in canonical_json(spec)


def test_mixed_spec_parses_to_expected_dataclasses():
    spec = parse_spec(MIXED, source="specs/mixed.yaml")
    assert spec.mask is None
    assert spec.layout == "frame_major"
    spatial = MaskTerm(
        "any_of",
        (),
        (MaskTerm("first_frame", (("frames", 1),)), MaskTerm("spatial_window", (("frames", 1),))),
    )
    temporal = MaskTerm(
        "any_of", (), (MaskTerm("first_frame", (("frames", 1),)), MaskTerm("temporal_stride", ()))
    )
    assert spec.patterns == (("spatial", spatial), ("temporal", temporal))
    assert spec.heads == HeadPatterns(
        candidates=(Candidate("spatial", "frame_major"), Candidate("temporal", "temporal_major")),
        assign=None,
    )
    assert spec.heads.candidates[1].where == Location(
        "specs/mixed.yaml", 12, 7, "heads.candidates[1]"
    )
    assert spec.head_patterns() is spec.heads
    assert spec.pattern_mask("spatial") == spatial
    assert spec.pattern_mask("temporal") == temporal
    assert spec.digest == hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()
    assert hash(spec) == hash(parse_spec(MIXED, source="specs/mixed.yaml"))
    assert '"mask"' not in canonical_json(spec)

    listed = parse_spec(MIXED.replace("assign: runtime", f"assign: {MIXED_ASSIGN}"))
    assert listed.heads.assign == (
        "spatial",
        "temporal",
        "spatial",
        "spatial",
        "temporal",
        "temporal",
        "spatial",
        "spatial",
        "spatial",
        "temporal",
    )
    assert listed.heads.candidates == spec.heads.candidates
    assert listed.digest != spec.digest
    # The spec's layout is the default for candidates that do not give one.
    flipped = parse_spec(MIXED.replace("layout: frame_major ", "layout: temporal_major "))
    assert [c.layout for c in flipped.heads.candidates] == ["temporal_major", "temporal_major"]
    # dataclasses.replace keeps working on Spec.
    other = dataclasses.replace(spec, heads=listed.heads)
    assert other.head_patterns().assign == listed.heads.assign


def test_mask_spec_has_one_implicit_candidate():
    spec = parse_spec(FULL)
    assert spec.heads is None
    assert spec.head_patterns() == HeadPatterns(
        (Candidate("mask", "temporal_major"),), ("mask",) * 10
    )
    assert spec.pattern_mask("mask") is spec.mask
    assert spec.pattern_mask("local") == MaskTerm("temporal_stride", (("rows", 1), ("stride", 2)))
    # A user pattern named 'mask' next to a top-level mask: the implicit candidate is the top-level mask.
    named = parse_spec(MINIMAL + "patterns: {mask: {text: {}}}\n")
    assert named.pattern_mask("mask") == MaskTerm("causal_frames", ())
    # In a heads spec, 'mask' is just a pattern name.
    heads = parse_spec(
        MIXED.replace("  spatial:", "  mask:").replace("pattern: spatial", "pattern: mask")
    )
    assert heads.heads.candidates[0].pattern == "mask"
    assert heads.pattern_mask("mask") == dict(heads.patterns)["mask"]


def test_mixed_digest_ignores_defaulted_layouts_and_style():
    a = parse_spec(MIXED)
    b = parse_spec(MIXED.replace("{pattern: spatial}", "{layout: frame_major, pattern: spatial}"))
    assert a.heads == b.heads and a.digest == b.digest


@pytest.mark.parametrize(
    "old,new",
    [
        ("layout: temporal_major}", "layout: frame_major}"),
        ("{pattern: spatial}", "{pattern: spatial, layout: temporal_major}"),
        ("layout: frame_major ", "layout: temporal_major "),
        (
            "    - {pattern: spatial}\n    - {pattern: temporal, layout: temporal_major}\n",
            "    - {pattern: temporal, layout: temporal_major}\n    - {pattern: spatial}\n",
        ),
        ("assign: runtime", f"assign: {MIXED_ASSIGN}"),
        ("    - {pattern: temporal, layout: temporal_major}\n", ""),
    ],
)
def test_mixed_digest_changes_when_heads_change(old, new):
    assert MIXED.count(old) == 1
    assert parse_spec(MIXED).digest != parse_spec(MIXED.replace(old, new)).digest


def test_mixed_assign_changes_digest():
    listed = MIXED.replace("assign: runtime", f"assign: {MIXED_ASSIGN}")
    swapped = MIXED.replace(
        "assign: runtime", f"assign: {MIXED_ASSIGN.replace('[spatial', '[temporal', 1)}"
    )
    assert parse_spec(listed).digest != parse_spec(swapped).digest


# ----------------------------------------------------------------------------- invalid specs


def test_base_is_valid():
    spec = parse_spec(BASE, source="specs/demo.yaml")
    assert spec.name == "demo"
    spec = parse_spec(HEADS_BASE, source="specs/demo.yaml")
    assert spec.heads.assign == ("spatial", "temporal", "spatial")


EXPECTED = {
    "unknown_top_level_key": "specs/demo.yaml:6:1: kernel: unknown key 'kernel'; allowed keys: svgen, name, geometry, attention, layout, mask, heads, patterns, tiling, gpu, runtime, select",
    "unknown_primitive": "specs/demo.yaml:10:7: mask.any_of[2].sliding: unknown mask primitive 'sliding'; allowed: first_frame, spatial_window, temporal_stride, band, prefix, text, causal_frames, block_causal, cube_window, neighborhood, radial, blocks, expr, any_of, all_of, not, ref",
    "unknown_param_key": "specs/demo.yaml:9:44: mask.any_of[1].spatial_window.colz: unknown key 'colz'; allowed keys: frames, rows, cols",
    "string_where_int": "specs/demo.yaml:3:20: geometry.frames: must be a positive integer, got a string ('four')",
    "bool_where_int": "specs/demo.yaml:4:20: attention.heads: must be a positive integer, got a boolean (true)",
    "float_where_int": "specs/demo.yaml:3:31: geometry.height: must be a positive integer, got a number (2.5)",
    "zero_frames": "specs/demo.yaml:3:20: geometry.frames: must be a positive integer, got 0",
    "negative_window": "specs/demo.yaml:9:41: mask.any_of[1].spatial_window.rows: must be a non-negative integer, got -1",
    "negative_text_tokens": "specs/demo.yaml:3:57: geometry.text_tokens: must be a non-negative integer, got -8",
    "bad_text_position": "specs/demo.yaml:3:75: geometry.text_position: must be one of first, last, got 'middle'",
    "bad_head_dim": "specs/demo.yaml:4:33: attention.head_dim: must be one of 64, 128, 256, got 96",
    "bad_dtype": "specs/demo.yaml:4:45: attention.dtype: must be one of bfloat16, float32, got 'float16'",
    "bad_layout": "specs/demo.yaml:5:9: layout: must be one of frame_major, temporal_major, got 'row_major'",
    "block_not_multiple": "specs/demo.yaml:13:19: tiling.block_q: block_q must be a multiple of 128 between 128 and 8192 (TPU tiles are 8x128 and the VMEM budget), got 100",
    "block_too_big": "specs/demo.yaml:13:34: tiling.block_kv: block_kv must be a multiple of 128 between 128 and 8192 (TPU tiles are 8x128 and the VMEM budget), got 16384",
    "block_bool": "specs/demo.yaml:13:34: tiling.block_kv: block_kv must be a multiple of 128 between 128 and 8192 (TPU tiles are 8x128 and the VMEM budget), got a boolean (yes)",
    "bad_name": "specs/demo.yaml:2:7: name: must be a spec name matching [a-z][a-z0-9_]* of at most 64 characters, got 'Demo-Spec'",
    "name_too_long": "specs/demo.yaml:2:7: name: must be a spec name matching [a-z][a-z0-9_]* of at most 64 characters, got 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'",
    "name_not_string": "specs/demo.yaml:2:7: name: must be a spec name matching [a-z][a-z0-9_]* of at most 64 characters, got an integer (42)",
    "duplicate_key": "specs/demo.yaml:4:1: name: duplicate key 'name' (first given on line 2)",
    "duplicate_param": "specs/demo.yaml:9:35: mask.any_of[1].spatial_window.frames: duplicate key 'frames' (first given on line 9)",
    "yaml_syntax_error": "specs/demo.yaml:5:7: YAML syntax error: expected ',' or '}', but got ':' (while parsing a flow mapping)",
    "yaml_bad_indent": "specs/demo.yaml:11:4: YAML syntax error: expected <block end>, but found '<block sequence start>' (while parsing a block mapping)",
    "missing_mask": "specs/demo.yaml:1:1: missing required key 'mask' (or 'heads')",
    "missing_svgen": "specs/demo.yaml:1:1: missing required key 'svgen' (the spec format version; write 'svgen: 1')",
    "missing_geometry_key": "specs/demo.yaml:3:11: geometry: missing required key 'height'",
    "missing_attention_key": "specs/demo.yaml:4:12: attention: missing required key 'dtype'",
    "svgen_2": "specs/demo.yaml:1:8: svgen: must be 1 (the only spec format version this svgen understands), got 2",
    "svgen_string": "specs/demo.yaml:1:8: svgen: must be 1 (the only spec format version this svgen understands), got a string ('1')",
    "two_keys_in_mask": "specs/demo.yaml:10:7: mask.any_of[2]: a mask has exactly one key, got 2: band, prefix",
    "zero_keys_in_mask": "specs/demo.yaml:10:7: mask.any_of[2]: a mask has exactly one key, got 0",
    "mask_not_mapping": "specs/demo.yaml:10:7: mask.any_of[2]: a mask must be a mapping with exactly one key (one of: first_frame, spatial_window, temporal_stride, band, prefix, text, causal_frames, block_causal, cube_window, neighborhood, radial, blocks, expr, any_of, all_of, not, ref), got a string ('band')",
    "empty_any_of": "specs/demo.yaml:12:19: patterns.local.any_of: must be a non-empty list of masks, got an empty list",
    "all_of_not_list": "specs/demo.yaml:12:19: patterns.local.all_of: must be a non-empty list of masks, got a mapping",
    "band_both": "specs/demo.yaml:12:17: patterns.local.band: band needs exactly one of 'width' or 'density', got both",
    "band_neither": "specs/demo.yaml:12:17: patterns.local.band: band needs exactly one of 'width' or 'density', got neither",
    "band_density_range": "specs/demo.yaml:12:27: patterns.local.band.density: must be a number with 0 < density <= 1, got 1.5",
    "band_density_zero": "specs/demo.yaml:12:27: patterns.local.band.density: must be a number with 0 < density <= 1, got 0",
    "prefix_missing_tokens": "specs/demo.yaml:12:19: patterns.local.prefix: missing required key 'tokens'",
    "prefix_zero": "specs/demo.yaml:12:28: patterns.local.prefix.tokens: must be a positive integer, got 0",
    "stride_zero": "specs/demo.yaml:12:37: patterns.local.temporal_stride.stride: must be a positive integer, got 0",
    "first_frame_zero": "specs/demo.yaml:8:29: mask.any_of[0].first_frame.frames: must be a positive integer, got 0",
    "text_with_params": "specs/demo.yaml:12:18: patterns.local.text.tokens: unknown key 'tokens'; 'text' takes no parameters",
    "causal_frames_scalar": "specs/demo.yaml:12:26: patterns.local.causal_frames: must be an empty mapping {} or null, got an integer (3)",
    "block_causal_missing_frames": "specs/demo.yaml:12:25: patterns.local.block_causal: missing required key 'frames'",
    "block_causal_zero": "specs/demo.yaml:12:34: patterns.local.block_causal.frames: must be a positive integer, got 0",
    "bad_expr_syntax": "specs/demo.yaml:12:36: patterns.local.expr: invalid expression: unknown name 'bogus'; allowed names: f_q, h_q, w_q, f_k, h_k, w_k, i_q, i_k, is_text_q, is_text_k",
    "bad_expr_plain": "specs/demo.yaml:10:20: mask.any_of[2].expr: invalid expression: divisor of '//' must be a positive integer literal",
    "bad_expr_block": "specs/demo.yaml:12:16: mask.any_of[2].expr: invalid expression: unexpected end of expression: expected an operand",
    "expr_not_string": "specs/demo.yaml:10:13: mask.any_of[2].expr: must be a string holding a predicate, got an integer (3)",
    "bad_ref_name": "specs/demo.yaml:10:12: mask.any_of[2].ref: must be a pattern name matching [a-z][a-z0-9_]* of at most 64 characters, got 'Local'",
    "bad_pattern_name": "specs/demo.yaml:13:3: patterns.Bad: pattern name must match [a-z][a-z0-9_]* and be at most 64 characters, got 'Bad'",
    "duplicate_pattern": "specs/demo.yaml:13:3: patterns.local: duplicate key 'local' (first given on line 12)",
    "not_with_list": "specs/demo.yaml:10:12: mask.any_of[2].not: a mask must be a mapping with exactly one key (one of: first_frame, spatial_window, temporal_stride, band, prefix, text, causal_frames, block_causal, cube_window, neighborhood, radial, blocks, expr, any_of, all_of, not, ref), got a list",
    "top_level_list": "specs/demo.yaml:1:1: must be a mapping at the top level, got a list",
    "geometry_not_mapping": "specs/demo.yaml:3:11: geometry: must be a mapping, got a string ('4x2x3')",
    "unknown_tag": "specs/demo.yaml:4:20: attention.heads: YAML tags are not part of a spec (it is plain data): remove '!big'",
    # heads
    "both_mask_and_heads": "specs/demo.yaml:11:1: heads: give either mask (one pattern for every head) or heads (patterns per head), not both",
    "neither_mask_nor_heads": "specs/demo.yaml:1:1: missing required key 'mask' (or 'heads')",
    "heads_not_mapping": "specs/demo.yaml:10:8: heads: must be a mapping, got a list",
    "heads_unknown_key": "specs/demo.yaml:14:3: heads.default: unknown key 'default'; allowed keys: candidates, assign",
    "heads_missing_assign": "specs/demo.yaml:11:3: heads: missing required key 'assign'",
    "heads_missing_candidates": "specs/demo.yaml:11:3: heads: missing required key 'candidates'",
    "candidates_empty": "specs/demo.yaml:11:15: heads.candidates: must be a non-empty list of candidates ({pattern: NAME, layout: LAYOUT}), got an empty list",
    "candidates_not_list": "specs/demo.yaml:11:15: heads.candidates: must be a non-empty list of candidates ({pattern: NAME, layout: LAYOUT}), got a mapping",
    "candidate_not_mapping": "specs/demo.yaml:12:7: heads.candidates[0]: must be a mapping with a 'pattern' and an optional 'layout', got a string ('spatial')",
    "candidate_missing_pattern": "specs/demo.yaml:13:7: heads.candidates[1]: missing required key 'pattern'",
    "candidate_unknown_key": "specs/demo.yaml:12:26: heads.candidates[0].tiling: unknown key 'tiling'; allowed keys: pattern, layout",
    "candidate_unknown_pattern": "specs/demo.yaml:13:17: heads.candidates[1].pattern: unknown pattern 'radial'; known patterns: local, spatial, temporal",
    "candidate_bad_pattern_name": "specs/demo.yaml:13:17: heads.candidates[1].pattern: must be a pattern name matching [a-z][a-z0-9_]* of at most 64 characters, got 'Temporal'",
    "candidate_duplicate": "specs/demo.yaml:14:17: heads.candidates[2].pattern: pattern 'spatial' is already a candidate (heads.candidates[0]); each pattern may be a candidate only once",
    "candidate_bad_layout": "specs/demo.yaml:13:35: heads.candidates[1].layout: must be one of frame_major, temporal_major, got 'column_major'",
    "assign_too_short": "specs/demo.yaml:14:11: heads.assign: must name one candidate pattern per head: attention.heads is 3, got 2 entries",
    "assign_too_long": "specs/demo.yaml:14:11: heads.assign: must name one candidate pattern per head: attention.heads is 3, got 4 entries",
    "assign_unknown_name": "specs/demo.yaml:14:31: heads.assign[2]: 'radial' is not a candidate; candidates: spatial, temporal",
    "assign_not_a_candidate": "specs/demo.yaml:14:21: heads.assign[1]: 'local' is not a candidate; candidates: spatial, temporal",
    "assign_entry_not_name": "specs/demo.yaml:14:21: heads.assign[1]: must be a candidate pattern name matching [a-z][a-z0-9_]* of at most 64 characters, got an integer (1)",
    "assign_wrong_string": "specs/demo.yaml:14:11: heads.assign: must be 'runtime' or a list of candidate pattern names, one per head, got a string ('spatial')",
    "assign_mapping": "specs/demo.yaml:14:11: heads.assign: must be 'runtime' or a list of candidate pattern names, one per head, got a mapping",
    "assign_integer": "specs/demo.yaml:14:11: heads.assign: must be 'runtime' or a list of candidate pattern names, one per head, got an integer (3)",
    "gpu_not_mapping": "specs/demo.yaml:14:6: gpu: must be a mapping, got an integer (64)",
    "gpu_unknown_key": "specs/demo.yaml:14:7: gpu.warps: unknown key 'warps'; allowed keys: block_q, block_kv, num_warps, num_stages",
    "gpu_block_not_power_of_two": "specs/demo.yaml:14:16: gpu.block_q: must be one of 16, 32, 64, 128, 256, got 48",
    "gpu_block_too_big": "specs/demo.yaml:14:17: gpu.block_kv: must be one of 16, 32, 64, 128, 256, got 512",
    "gpu_warps": "specs/demo.yaml:14:18: gpu.num_warps: must be one of 1, 2, 4, 8, 16, got 3",
}


@pytest.mark.parametrize("case_id,text", CASES, ids=[c for c, _ in CASES])
def test_invalid_specs(case_id, text):
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="specs/demo.yaml")
    assert str(info.value) == EXPECTED[case_id]
    assert info.value.file == "specs/demo.yaml"


def test_every_invalid_case_has_an_expectation():
    assert len(CASES) >= 20
    assert {c for c, _ in CASES} == set(EXPECTED)


# ----------------------------------------------------------------------------- integer ranges


@pytest.mark.parametrize(
    "where,slot,key,minimum,maximum", INTEGER_PARAMS, ids=[p[2] for p in INTEGER_PARAMS]
)
def test_every_integer_parameter_refuses_invalid_values(where, slot, key, minimum, maximum):
    for value in _bad_values(minimum, maximum):
        with pytest.raises(SpecError) as info:
            parse_spec(_limits_spec(where, slot, value), source="s.yaml")
        if info.value.key == "geometry" and where == "geometry":  # in range, but the sum is not
            assert "MAX_SEQ_LEN" in info.value.message
            continue
        assert info.value.key == key, (value, str(info.value))
        assert info.value.message.startswith("must be"), (value, str(info.value))
        assert info.value.line is not None


@pytest.mark.parametrize(
    "where,slot,key,minimum,maximum", INTEGER_PARAMS, ids=[p[2] for p in INTEGER_PARAMS]
)
def test_every_integer_parameter_accepts_its_whole_range(where, slot, key, minimum, maximum):
    for value in (minimum, minimum + 1, maximum):
        parse_spec(_limits_spec(where, slot, value))


def test_integer_past_the_maximum_names_the_limit():
    with pytest.raises(SpecError) as info:
        parse_spec(_limits_spec("mask", "{band: {width: X}}", 2**63), source="s.yaml")
    assert str(info.value) == (
        "s.yaml:5:22: mask.band.width: must be at most 4,194,304 (MAX_PARAM: no count in a mask "
        "exceeds the longest sequence), got 9223372036854775808"
    )


@pytest.mark.parametrize(
    "key,value",
    [
        (key, value)
        for key in ("block_q", "block_kv", "compute_q", "compute_kv")
        for value in (-128, -1, 0, 64, 8320, 16384, 2**63, 2**64, "2.5", "true")
    ],
)
def test_tiling_integers_refuse_invalid_values(key, value):
    tiling = {"block_q": 512, "block_kv": 512}
    tiling[key] = value
    text = MINIMAL + "tiling: {" + ", ".join(f"{k}: {v}" for k, v in tiling.items()) + "}\n"
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert info.value.key == f"tiling.{key}"
    assert "multiple of 128" in info.value.message


@pytest.mark.parametrize(
    "key,value",
    [("svgen", v) for v in (0, -1, 2, 2**63)] + [("head_dim", v) for v in (-64, 0, 63, 2**63)],
)
def test_choice_integers_refuse_invalid_values(key, value):
    text = (
        MINIMAL.replace("svgen: 1", f"svgen: {value}")
        if key == "svgen"
        else MINIMAL.replace("head_dim: 64", f"head_dim: {value}")
    )
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert info.value.key in ("svgen", "attention.head_dim")
    assert "must be" in info.value.message


def test_geometry_total_is_bounded():
    geometry = f"{{frames: {MAX_SEQ_LEN}, height: 2, width: 1}}"
    with pytest.raises(SpecError) as info:
        parse_spec(MINIMAL.replace("{frames: 2, height: 1, width: 1}", geometry), source="s.yaml")
    assert info.value.key == "geometry" and "MAX_SEQ_LEN" in info.value.message
    assert (info.value.line, info.value.column) == (3, 11)


def test_tile_grid_is_bounded_and_a_fitting_tiling_suggested():
    geometry = f"{{frames: 1, height: 1, width: {MAX_SEQ_LEN}}}"
    text = MINIMAL.replace("{frames: 2, height: 1, width: 1}", geometry)
    parse_spec(text + "tiling: {block_q: 1024, block_kv: 1024}\n")  # 4096 x 4096 pairs: fits
    with pytest.raises(SpecError) as info:
        parse_spec(
            text + "tiling: {block_q: 512, block_kv: 512, compute_q: 128, compute_kv: 128}\n"
        )
    assert info.value.key == "tiling"
    assert "MAX_TILE_PAIRS" in info.value.message
    assert "tiling {block_q: 1024, block_kv: 1024} would fit" in info.value.message


# ----------------------------------------------------------------------------- names and sizes


@pytest.mark.parametrize(
    "name,reason",
    [
        ("jax", "an importable module"),
        ("numpy", "an importable module"),
        ("svgen", "an importable module"),
        ("yaml", "an importable module"),
        ("jinja2", "an importable module"),
        ("sympy", "an importable module"),
        ("networkx", "an importable module"),
        ("typing", "a standard-library module"),
        ("os", "a standard-library module"),
        ("class", "a Python keyword"),
        ("import", "a Python keyword"),
        ("list", "a Python builtin"),
        ("id", "a Python builtin"),
    ],
)
def test_reserved_names_are_refused_with_the_reason(name, reason):
    with pytest.raises(SpecError) as info:
        parse_spec(MINIMAL.replace("name: tiny", f"name: {name}"), source="s.yaml")
    assert str(info.value).startswith(f"s.yaml:2:7: name: '{name}' is {reason}")
    text = MINIMAL.replace(
        "mask: {causal_frames: }", f"mask: {{ref: {name}}}\npatterns:\n  {name}: {{text: {{}}}}"
    )
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="s.yaml")
    assert str(info.value).startswith(f"s.yaml:7:3: patterns.{name}: '{name}' is {reason}")


def test_every_standard_library_module_is_reserved():
    import sys

    from svgen.spec import NAME_RE, reserved_name_reason

    names = [n for n in sys.stdlib_module_names if NAME_RE.match(n)]
    assert len(names) > 150
    assert all(reserved_name_reason(n) for n in names)
    assert reserved_name_reason("wan21_720p_spatial") is None


def test_yaml_aliases_within_the_limits_still_work():
    text = MINIMAL.replace(
        "mask: {causal_frames: }", "mask: {any_of: [&w {spatial_window: {frames: 1}}, *w, *w]}"
    )
    assert len(parse_spec(text).mask.children) == 3


def test_expr_met_again_through_an_alias_is_counted_each_time():
    expr = "f_q + " * 100 + "0 < 3"  # 203 tokens: two fit in a mask, three do not
    two = MINIMAL.replace(
        "mask: {causal_frames: }", f'mask: {{any_of: [&e {{expr: "{expr}"}}, *e]}}'
    )
    assert len(parse_spec(two).mask.children) == 2
    with pytest.raises(SpecError) as info:
        parse_spec(two.replace("*e]", "*e, *e]"))
    assert info.value.key == "mask.any_of[2].expr" and "MAX_MASK_SIZE" in info.value.message


def test_ref_expansion_is_measured_not_performed():
    # 60 levels of each pattern naming the next twice: 2^60 leaves if expanded.
    lines = ["patterns:"] + [
        f"  p{i}: {{any_of: [{{ref: p{i + 1}}}, {{ref: p{i + 1}}}]}}" for i in range(60)
    ]
    lines.append("  p60: {text: {}}")
    text = MINIMAL.replace("mask: {causal_frames: }", "mask: {ref: p0}\n" + "\n".join(lines))
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    assert (
        info.value.key.startswith("patterns.p") and "once refs are expanded" in info.value.message
    )


def test_cycles_and_unknown_refs_are_left_to_lowering():
    # The expanded-size check must not trip over what lowering reports with the chain.
    text = MINIMAL.replace(
        "mask: {causal_frames: }",
        "mask: {ref: a}\npatterns:\n  a: {ref: b}\n  b: {any_of: [{ref: a}, {ref: zz}]}",
    )
    spec = parse_spec(text)
    assert [n for n, _ in spec.patterns] == ["a", "b"]


def test_spec_file_size_is_bounded(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(MINIMAL + "#" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == (
        f"{path}: the spec file is larger than the {MAX_SPEC_BYTES:,} bytes of MAX_SPEC_BYTES"
    )


def test_gpu_section():
    """Given keys override GpuTiling's defaults; the section takes part in the digest only
    when given (the digests of specs without it, in generated headers, stay valid)."""
    from spec_corpus import BASE

    from svgen.spec import GpuTiling

    plain = parse_spec(BASE, source="s.yaml")
    assert plain.gpu is None and plain.gpu_tiling == GpuTiling(64, 64, 4, 2)
    given = parse_spec(BASE + "gpu: {block_kv: 128, num_stages: 3}\n", source="s.yaml")
    assert given.gpu == GpuTiling(block_q=64, block_kv=128, num_warps=4, num_stages=3)
    assert given.digest != plain.digest
    assert parse_spec(BASE + "gpu:\n", source="s.yaml").digest == plain.digest
    assert '"gpu":{"block_kv":128' in canonical_json(given)
    assert "gpu" not in canonical_json(plain)


# ----------------------------------------------------------------------------- sm_scale


@pytest.mark.parametrize(
    "written",
    [
        '"0.1"',  # a string
        "'abc'",
        "true",  # a boolean
        ".nan",  # NaN and infinities, as YAML writes them
        ".inf",
        "-.inf",
        "0.125",  # even a good number: the scale is the call's, not the spec's
    ],
)
def test_sm_scale_in_a_spec_is_refused_where_it_is_written(written):
    """A spec has no softmax scale (it is attention()'s sm_scale argument, checked there):
    whatever value is written, the key is refused at its file:line:col, saying where the
    scale goes."""
    text = BASE.replace(
        "attention: {heads: 2, head_dim: 128, dtype: bfloat16}",
        "attention: {heads: 2, head_dim: 128, dtype: bfloat16, sm_scale: " + written + "}",
    )
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="specs/demo.yaml")
    assert str(info.value) == (
        "specs/demo.yaml:4:55: attention.sm_scale: unknown key 'sm_scale'; allowed "
        "keys: heads, head_dim, dtype, softmax, qk (the softmax scale is not part of a spec: pass "
        "sm_scale=... to the generated attention())"
    )


def test_sm_scale_at_the_top_level_is_refused_too():
    with pytest.raises(SpecError) as info:
        parse_spec(BASE + "sm_scale: .nan\n", source="specs/demo.yaml")
    assert str(info.value).startswith("specs/demo.yaml:14:1: sm_scale: unknown key 'sm_scale'")
