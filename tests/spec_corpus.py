"""The spec corpus shared by the spec reader's tests and the JSON Schema's: valid specs, the
invalid-spec cases, and the integer parameters with their ranges (test_spec.py checks the
reader's messages, test_schema.py that the schema accepts and refuses the same files)."""

from __future__ import annotations

from svgen.spec.limits import MAX_HEADS, MAX_PARAM, MAX_SEQ_LEN


FULL = """\
# a full spec exercising every section
svgen: 1
name: wan21_720p_spatial
geometry: {frames: 21, height: 45, width: 80, text_tokens: 512, text_position: first}
attention: {heads: 10, head_dim: 128, dtype: bfloat16}
layout: temporal_major
mask:
  any_of:
    - first_frame: {}
    - spatial_window: {frames: 1, rows: 3, cols: 5}
    - ref: local
    - expr: "f_q // 2 == f_k // 2 and is_text_k"
    - not:
        band: {density: 0.5}
    - all_of:
        - prefix: {tokens: 64}
        - causal_frames: {}
patterns:
  local: {temporal_stride: {stride: 2, rows: 1}}
  caption:
    text:
tiling: {block_q: 256, block_kv: 1024}
"""


# Same content: keys reordered, block vs flow style, different comments and quoting.
FULL_REORDERED = """\
tiling:
  block_kv: 1024   # kv tiles
  block_q: 256
patterns:
  caption: {text: {}}
  local:
    temporal_stride: {rows: 1, stride: 2}
mask:
  any_of:
    - first_frame: {}
    - spatial_window: {cols: 5, rows: 3, frames: 1}
    - ref: 'local'
    - expr: 'f_q // 2 == f_k // 2 and is_text_k'
    - not: {band: {density: 0.50}}
    - all_of: [{prefix: {tokens: 64}}, {causal_frames: null}]
layout: temporal_major
attention: {dtype: bfloat16, head_dim: 128, heads: 10}
geometry:
  text_position: first
  text_tokens: 512
  width: 80
  height: 45
  frames: 21
name: "wan21_720p_spatial"
svgen: 1
"""


MINIMAL = """\
svgen: 1
name: tiny
geometry: {frames: 2, height: 1, width: 1}
attention: {heads: 1, head_dim: 64, dtype: float32}
mask: {causal_frames: }
"""


MIXED = """\
svgen: 1
name: wan21_720p_mixed
geometry: {frames: 21, height: 45, width: 80}
attention: {heads: 10, head_dim: 128, dtype: bfloat16}
layout: frame_major            # default layout for candidates that do not say
patterns:
  spatial: {any_of: [{first_frame: {frames: 1}}, {spatial_window: {frames: 1}}]}
  temporal: {any_of: [{first_frame: {frames: 1}}, {temporal_stride: {}}]}
heads:
  candidates:                  # head pattern index = position in this list
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: runtime              # or a list of candidate pattern names, exactly attention.heads long
tiling: {block_q: 512, block_kv: 512}
"""


BASE = """\
svgen: 1
name: demo
geometry: {frames: 4, height: 2, width: 3, text_tokens: 8, text_position: last}
attention: {heads: 2, head_dim: 128, dtype: bfloat16}
layout: frame_major
mask:
  any_of:
    - first_frame: {frames: 1}
    - spatial_window: {frames: 1, rows: 1, cols: 2}
    - ref: local
patterns:
  local: {band: {width: 3}}
tiling: {block_q: 256, block_kv: 512}
"""


def _sub(old, new):
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


HEADS_BASE = """\
svgen: 1
name: demo
geometry: {frames: 4, height: 2, width: 3}
attention: {heads: 3, head_dim: 128, dtype: bfloat16}
layout: frame_major
patterns:
  spatial: {spatial_window: {frames: 1}}
  temporal: {temporal_stride: {}}
  local: {band: {width: 3}}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: [spatial, temporal, spatial]
tiling: {block_q: 256, block_kv: 512}
"""


def _hsub(old, new):
    assert HEADS_BASE.count(old) == 1, old
    return HEADS_BASE.replace(old, new)


# HEADS_BASE's heads section: its candidates and its assignment, as the cases cut them.
_CANDIDATES = (
    "  candidates:\n    - {pattern: spatial}\n    - {pattern: temporal, layout: temporal_major}\n"
)
_ASSIGN = "assign: [spatial, temporal, spatial]"
_HEADS = "heads:\n" + _CANDIDATES + "  " + _ASSIGN + "\n"


def _assigned(value: str) -> str:
    """HEADS_BASE with ``value`` as heads.assign."""
    return _hsub(_ASSIGN, "assign: " + value)


CASES = [  # (id, spec text)
    (
        "unknown_top_level_key",
        _sub("layout: frame_major\n", "layout: frame_major\nkernel: flash\n"),
    ),
    ("unknown_primitive", _sub("- ref: local", "- sliding: {width: 2}")),
    ("unknown_param_key", _sub("rows: 1, cols: 2", "rows: 1, colz: 2")),
    ("string_where_int", _sub("frames: 4,", "frames: four,")),
    ("bool_where_int", _sub("heads: 2,", "heads: true,")),
    ("float_where_int", _sub("height: 2,", "height: 2.5,")),
    ("zero_frames", _sub("frames: 4,", "frames: 0,")),
    ("negative_window", _sub("rows: 1, cols: 2", "rows: -1, cols: 2")),
    ("negative_text_tokens", _sub("text_tokens: 8", "text_tokens: -8")),
    ("bad_text_position", _sub("text_position: last", "text_position: middle")),
    ("bad_head_dim", _sub("head_dim: 128", "head_dim: 96")),
    ("bad_dtype", _sub("dtype: bfloat16", "dtype: float16")),
    ("bad_layout", _sub("layout: frame_major", "layout: row_major")),
    ("block_not_multiple", _sub("block_q: 256", "block_q: 100")),
    ("block_too_big", _sub("block_kv: 512", "block_kv: 16384")),
    ("block_bool", _sub("block_kv: 512", "block_kv: yes")),
    ("bad_name", _sub("name: demo", "name: Demo-Spec")),
    ("name_too_long", _sub("name: demo", "name: " + "a" * 65)),
    ("name_not_string", _sub("name: demo", "name: 42")),
    ("duplicate_key", _sub("attention:", "name: again\nattention:")),
    ("duplicate_param", _sub("{frames: 1, rows: 1,", "{frames: 1, frames: 2, rows: 1,")),
    ("yaml_syntax_error", _sub("dtype: bfloat16}", "dtype: bfloat16")),
    ("yaml_bad_indent", _sub("    - ref: local", "    - ref: local\n   - text: {}")),
    (
        "missing_mask",
        _sub(
            "mask:\n  any_of:\n    - first_frame: {frames: 1}\n    - spatial_window: {frames: 1, rows: 1, cols: 2}\n    - ref: local\n",
            "",
        ),
    ),
    ("missing_svgen", _sub("svgen: 1\n", "")),
    ("missing_geometry_key", _sub("height: 2, ", "")),
    ("missing_attention_key", _sub(", dtype: bfloat16", "")),
    ("svgen_2", _sub("svgen: 1", "svgen: 2")),
    ("svgen_string", _sub("svgen: 1", "svgen: '1'")),
    ("two_keys_in_mask", _sub("    - ref: local", "    - {band: {width: 1}, prefix: {tokens: 2}}")),
    ("zero_keys_in_mask", _sub("    - ref: local", "    - {}")),
    ("mask_not_mapping", _sub("    - ref: local", "    - band")),
    ("empty_any_of", _sub("local: {band: {width: 3}}", "local: {any_of: []}")),
    ("all_of_not_list", _sub("local: {band: {width: 3}}", "local: {all_of: {band: {width: 1}}}")),
    ("band_both", _sub("{band: {width: 3}}", "{band: {width: 3, density: 0.5}}")),
    ("band_neither", _sub("{band: {width: 3}}", "{band: {}}")),
    ("band_density_range", _sub("{band: {width: 3}}", "{band: {density: 1.5}}")),
    ("band_density_zero", _sub("{band: {width: 3}}", "{band: {density: 0}}")),
    ("prefix_missing_tokens", _sub("{band: {width: 3}}", "{prefix: {}}")),
    ("prefix_zero", _sub("{band: {width: 3}}", "{prefix: {tokens: 0}}")),
    ("stride_zero", _sub("{band: {width: 3}}", "{temporal_stride: {stride: 0}}")),
    ("first_frame_zero", _sub("first_frame: {frames: 1}", "first_frame: {frames: 0}")),
    ("text_with_params", _sub("{band: {width: 3}}", "{text: {tokens: 3}}")),
    ("causal_frames_scalar", _sub("{band: {width: 3}}", "{causal_frames: 3}")),
    ("block_causal_missing_frames", _sub("{band: {width: 3}}", "{block_causal: {}}")),
    ("block_causal_zero", _sub("{band: {width: 3}}", "{block_causal: {frames: 0}}")),
    ("bad_expr_syntax", _sub("{band: {width: 3}}", '{expr: "abs(f_q - f_k) <= bogus"}')),
    ("bad_expr_plain", _sub("    - ref: local", "    - expr: f_q // f_k == 0")),
    (
        "bad_expr_block",
        _sub("    - ref: local", "    - expr: |\n        f_q < 1 and\n          f_k <\n"),
    ),
    ("expr_not_string", _sub("    - ref: local", "    - expr: 3")),
    ("bad_ref_name", _sub("ref: local", "ref: Local")),
    ("bad_pattern_name", _sub("  local: {band", "  local: {band: {width: 1}}\n  Bad: {band")),
    ("duplicate_pattern", _sub("  local: {band", "  local: {band: {width: 1}}\n  local: {band")),
    ("not_with_list", _sub("    - ref: local", "    - not: [ {text: {}} ]")),
    ("top_level_list", "- svgen: 1\n"),
    (
        "geometry_not_mapping",
        _sub(
            "geometry: {frames: 4, height: 2, width: 3, text_tokens: 8, text_position: last}",
            "geometry: 4x2x3",
        ),
    ),
    ("unknown_tag", _sub("heads: 2,", "heads: !big 2,")),
    # heads
    ("both_mask_and_heads", _hsub("heads:\n", "mask: {text: {}}\nheads:\n")),
    ("neither_mask_nor_heads", _hsub(_HEADS, "")),
    ("heads_not_mapping", _hsub(_HEADS, "heads: [spatial]\n")),
    ("heads_unknown_key", _hsub("  assign:", "  default: spatial\n  assign:")),
    ("heads_missing_assign", _hsub("  " + _ASSIGN + "\n", "")),
    ("heads_missing_candidates", _hsub(_CANDIDATES, "")),
    ("candidates_empty", _hsub(_CANDIDATES, "  candidates: []\n")),
    ("candidates_not_list", _hsub(_CANDIDATES, "  candidates: {pattern: spatial}\n")),
    ("candidate_not_mapping", _hsub("- {pattern: spatial}", "- spatial")),
    (
        "candidate_missing_pattern",
        _hsub("{pattern: temporal, layout: temporal_major}", "{layout: temporal_major}"),
    ),
    ("candidate_unknown_key", _hsub("{pattern: spatial}", "{pattern: spatial, tiling: 256}")),
    ("candidate_unknown_pattern", _hsub("{pattern: temporal, layout", "{pattern: radial, layout")),
    (
        "candidate_bad_pattern_name",
        _hsub("{pattern: temporal, layout", "{pattern: Temporal, layout"),
    ),
    (
        "candidate_duplicate",
        _hsub(
            "{pattern: temporal, layout: temporal_major}",
            "{pattern: temporal, layout: temporal_major}\n"
            "    - {pattern: spatial, layout: temporal_major}",
        ),
    ),
    ("candidate_bad_layout", _hsub("layout: temporal_major}", "layout: column_major}")),
    ("assign_too_short", _assigned("[spatial, temporal]")),
    ("assign_too_long", _assigned("[spatial, temporal, spatial, spatial]")),
    ("assign_unknown_name", _assigned("[spatial, temporal, radial]")),
    ("assign_not_a_candidate", _assigned("[spatial, local, spatial]")),
    ("assign_entry_not_name", _assigned("[spatial, 1, spatial]")),
    ("assign_wrong_string", _assigned("spatial")),
    ("assign_mapping", _assigned("{0: spatial}")),
    ("assign_integer", _assigned("3")),
    # gpu
    ("gpu_not_mapping", BASE + "gpu: 64\n"),
    ("gpu_unknown_key", BASE + "gpu: {warps: 4}\n"),
    ("gpu_block_not_power_of_two", BASE + "gpu: {block_q: 48}\n"),
    ("gpu_block_too_big", BASE + "gpu: {block_kv: 512}\n"),
    ("gpu_warps", BASE + "gpu: {num_warps: 3}\n"),
]


LIMITS_SPEC = """\
svgen: 1
name: tiny
geometry: {GEOMETRY}
attention: {heads: HEADS, head_dim: 64, dtype: float32}
mask: MASK
tiling: {block_q: 4096, block_kv: 4096}
"""


# Every integer parameter of every primitive and section: (where the value goes, key path,
# smallest valid value, largest valid value). Written out by hand rather than derived from
# spec.py's tables, so that a wrong bound there (a negative band width accepted) fails here.
INTEGER_PARAMS = [
    ("mask", "{first_frame: {frames: X}}", "mask.first_frame.frames", 1, MAX_PARAM),
    ("mask", "{spatial_window: {frames: X}}", "mask.spatial_window.frames", 0, MAX_PARAM),
    ("mask", "{spatial_window: {frames: 1, rows: X}}", "mask.spatial_window.rows", 0, MAX_PARAM),
    ("mask", "{spatial_window: {frames: 1, cols: X}}", "mask.spatial_window.cols", 0, MAX_PARAM),
    ("mask", "{temporal_stride: {rows: X}}", "mask.temporal_stride.rows", 0, MAX_PARAM),
    ("mask", "{temporal_stride: {cols: X}}", "mask.temporal_stride.cols", 0, MAX_PARAM),
    ("mask", "{temporal_stride: {stride: X}}", "mask.temporal_stride.stride", 1, MAX_PARAM),
    ("mask", "{temporal_stride: {frames: X}}", "mask.temporal_stride.frames", 0, MAX_PARAM),
    ("mask", "{band: {width: X}}", "mask.band.width", 0, MAX_PARAM),
    ("mask", "{prefix: {tokens: X}}", "mask.prefix.tokens", 1, MAX_PARAM),
    ("mask", "{block_causal: {frames: X}}", "mask.block_causal.frames", 1, MAX_PARAM),
    ("geometry", "frames", "geometry.frames", 1, MAX_SEQ_LEN),
    ("geometry", "height", "geometry.height", 1, MAX_SEQ_LEN),
    ("geometry", "width", "geometry.width", 1, MAX_SEQ_LEN),
    ("geometry", "text_tokens", "geometry.text_tokens", 0, MAX_SEQ_LEN - 1),
    ("heads", "HEADS", "attention.heads", 1, MAX_HEADS),
    ("gpu", "num_stages", "gpu.num_stages", 1, 8),
]


def _limits_spec(where: str, slot: str, value) -> str:
    geometry = {"frames": 1, "height": 1, "width": 1, "text_tokens": 0}
    mask, heads = "{causal_frames: {}}", 1
    if where == "mask":
        mask = slot.replace("X", str(value))
    elif where == "geometry":
        geometry[slot] = value
    elif where == "heads":
        heads = value
    text = LIMITS_SPEC.replace("GEOMETRY", ", ".join(f"{k}: {v}" for k, v in geometry.items()))
    if where == "gpu":
        text += f"gpu: {{{slot}: {value}}}\n"
    return text.replace("HEADS", str(heads)).replace("MASK", mask)


def _bad_values(minimum: int, maximum: int) -> list:
    return [
        minimum - 1,
        -1,
        -(2**63),
        maximum + 1,
        2**31,
        2**63,
        2**64 + 1,
        10**40,
        "2.5",
        "true",
        "'7'",
        "[1]",
    ]


# -- small specs from their sections (the kernel, tool and bench tests) ---------------------

#: The tiling of most small specs: one 128 x 128 block a tile.
TILES = "{block_q: 128, block_kv: 128}"
#: The first frame, kept for every query (a YAML flow term, as the terms below).
ANCHOR = "{first_frame: {frames: 1}}"
GEOMETRY_KEYS = ("frames", "height", "width", "text_tokens", "text_position")


def any_of(*terms: str) -> str:
    """The union of YAML flow terms, as one."""
    return "{any_of: [" + ", ".join(terms) + "]}"


#: The small specs' spatial pattern: the first frame and the query's own frame.
SPATIAL = any_of(ANCHOR, "{spatial_window: {frames: 1}}")
#: Their temporal pattern: the first frame and the query's own place in every frame.
TEMPORAL = any_of(ANCHOR, "{temporal_stride: {rows: 0, cols: 0}}")


def spec_text(
    name: str,
    geometry: tuple | str,
    heads: int,
    *,
    head_dim: int = 128,
    dtype: str = "float32",
    layout: str | None = None,
    mask: str | None = None,
    patterns: dict[str, str] | None = None,
    layouts: dict[str, str] | None = None,
    assign: str = "runtime",
    tiling: str | None = TILES,
    **sections: str,
) -> str:
    """A spec's YAML text, a section a line, values as YAML flow text: ``geometry`` (frames,
    height, width[, text_tokens[, text_position]], or its text), the attention's ``heads``, head_dim and
    dtype, the default ``layout`` where given, and either one ``mask`` or ``patterns`` (name ->
    term) chosen per head by ``assign`` among candidates in that order, each written
    `    - {pattern: NAME}` or, with a ``layouts`` entry, `    - {pattern: NAME, layout: L}`.
    Then ``tiling`` (None: no tiling section) and any other section (runtime=, select=...)."""
    if not isinstance(geometry, str):
        place = ", ".join(f"{key}: {value}" for key, value in zip(GEOMETRY_KEYS, geometry))
        geometry = f"{{{place}}}"
    lines = [
        "svgen: 1",
        f"name: {name}",
        f"geometry: {geometry}",
        f"attention: {{heads: {heads}, head_dim: {head_dim}, dtype: {dtype}}}",
    ]
    lines += [f"layout: {layout}"] if layout else []
    lines += [f"mask: {mask}"] if mask else []
    if patterns:
        lines += ["patterns:"] + [f"  {key}: {term}" for key, term in patterns.items()]
        lines += ["heads:", "  candidates:"]
        for key in patterns:
            where = f", layout: {layouts[key]}" if key in (layouts or {}) else ""
            lines.append(f"    - {{pattern: {key}{where}}}")
        lines.append(f"  assign: {assign}")
    lines += [f"tiling: {tiling}"] if tiling else []
    lines += [f"{key}: {value}" for key, value in sections.items()]
    return "\n".join(lines) + "\n"


#: Two patterns of two layouts chosen per head at run time, text tokens, a sequence (1576
#: tokens) that no 256-token block divides: the chip tools' tests' spec (test_chip_bench.py's
#: MIXED, test_kernel_size.py's).
TINY_MIXED = spec_text(
    "tiny_mixed",
    (4, 8, 12, 40),
    3,
    dtype="bfloat16",
    layout="frame_major",
    patterns={"spatial": SPATIAL, "temporal": TEMPORAL},
    layouts={"temporal": "temporal_major"},
)
