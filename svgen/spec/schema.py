"""A JSON Schema (draft 2020-12) of spec files, for editors: `svgen schema` prints it.

Mask keys and their parameters come from the primitive registry (`svgen.spec.primitives`), the
sections' keys from `svgen.spec`'s key lists and the numbers from `svgen.spec.limits`, so the
schema follows the compiler. It is an aid for completion and early red squiggles, not the
validator: `svgen compile` stays the judge. What a JSON Schema cannot say is left out:
  * the YAML itself: syntax, duplicate keys (a loader keeps the last), tags, aliases, the
    file's size and nesting;
  * the `expr` grammar;
  * references between values: `ref`, candidate and `assign` names must be defined
    patterns, a pattern may be a candidate once, `assign` has one entry per head;
  * arithmetic between values: the total token count, compute blocks dividing tiles (at
    most 16 per tile), the tile-pair, VMEM and SMEM budgets, mask size and depth with refs
    expanded;
  * names reserved as Python keywords, builtins or module names (they depend on the Python
    version, and the schema must not);
  * integral floats: JSON Schema counts 2.0 as an integer, svgen refuses it.
"""

from __future__ import annotations

import json

from svgen import spec
from svgen.core.curves import CURVE_SCOPES, CURVES
from svgen.spec import primitives
from svgen.spec.limits import (
    MAX_EXPR_CHARS,
    MAX_HEADS,
    MAX_NAME_LEN,
    MAX_PATH_CHARS,
    MAX_PATTERNS,
    MAX_SEQ_LEN,
)

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def spec_schema() -> dict:
    """The schema of a spec file, as a JSON-ready dict (insertion order is output order)."""
    sections = {
        "svgen": {
            "const": spec.SPEC_VERSION,
            "description": "the spec format version; write 'svgen: 1'",
        },
        "name": _ref("name", "the generated module's name (generated/<name>.py)"),
        "geometry": _geometry(),
        "attention": _attention(),
        "layout": _layout("the token order of the kernel; the default of head candidates"),
        "mask": _ref("mask", "one pattern for every head (or give 'heads')"),
        "heads": _heads(),
        "patterns": _patterns(),
        "tiling": _tiling(),
        "gpu": _gpu(),
        "runtime": _runtime(),
        "select": _select(),
    }
    return {
        "$schema": DRAFT,
        "title": "svgen spec",
        "description": "A video-attention mask for svgen to compile into a Pallas TPU or GPU kernel.",
        "type": "object",
        "properties": {key: sections[key] for key in spec.TOP_KEYS},
        "additionalProperties": False,
        "required": ["svgen", "name", "geometry", "attention"],
        "oneOf": [{"required": ["mask"]}, {"required": ["heads"]}],
        "$defs": {"name": _name(), "mask": _mask()},
    }


def schema_text() -> str:
    """What `svgen schema` prints (and svgen.schema.json holds): deterministic JSON."""
    return json.dumps(spec_schema(), indent=2) + "\n"


def _ref(name: str, description: str) -> dict:
    return {"$ref": f"#/$defs/{name}", "description": description}


def _name() -> dict:
    return {"type": "string", "pattern": f"^{spec.NAME_PATTERN}$", "maxLength": MAX_NAME_LEN}


def _layout(description: str) -> dict:
    size = {"type": "integer", "minimum": 1, "maximum": MAX_SEQ_LEN}
    cube = _section(
        spec.TILED_KEYS,
        {
            key: dict(size, description=f"the cube's {key} (at most the video's)")
            for key in spec.TILED_KEYS
        },
        spec.TILED_KEYS,
        "Sliding Tile Attention's cube-major order: each frames x rows x cols cube contiguous",
    )
    tiled = _section((spec.TILED,), {spec.TILED: cube}, (spec.TILED,), "a tiled layout")
    axes = {
        "type": "array",
        "items": {"enum": ["f", "h", "w"]},
        "minItems": 3,
        "maxItems": 3,
        "uniqueItems": True,
        "description": "the axes f (frame), h (row), w (column), outermost first",
    }
    order = _section(("order",), {"order": axes}, ("order",), "the video in this axis order")
    curve = _section(
        ("curve", "over"),
        {
            "curve": {"enum": list(CURVES), "description": "the space-filling curve"},
            "over": {
                "enum": list(CURVE_SCOPES),
                "default": CURVE_SCOPES[0],
                "description": "each frame's places (frames in order), or the whole video",
            },
        },
        ("curve",),
        "tokens along a space-filling curve (masks may not read what it scatters)",
    )
    return {
        "oneOf": [{"enum": list(spec.LAYOUTS)}, tiled, order, curve],
        "default": spec.LAYOUTS[0],
        "description": description,
    }


def _section(
    keys: tuple[str, ...],
    schemas: dict,
    required: tuple[str, ...],
    description: str,
    nullable: bool = False,
) -> dict:
    """An object with exactly ``keys`` (each must have a schema: a key the spec reader gains
    without one here fails loudly, not silently)."""
    out = {
        "type": ["object", "null"] if nullable else "object",
        "description": description,
        "properties": {key: schemas[key] for key in keys},
        "additionalProperties": False,
    }
    if required:
        out["required"] = list(required)
    return out


def _geometry() -> dict:
    sizes = {
        key: {"type": "integer", "minimum": least, "maximum": MAX_SEQ_LEN}
        for key, least in spec.GEOMETRY_MINIMUMS.items()
    }
    sizes["text_tokens"]["default"] = 0
    sizes["text_position"] = {
        "enum": list(spec.TEXT_POSITIONS),
        "default": "last",
        "description": "where the text tokens sit in the sequence",
    }
    return _section(
        spec.GEOMETRY_KEYS,
        sizes,
        ("frames", "height", "width"),
        f"the latent video grid and text tokens; at most {MAX_SEQ_LEN} tokens",
    )


def _attention() -> dict:
    keys = {
        "heads": {"type": "integer", "minimum": 1, "maximum": MAX_HEADS},
        "head_dim": {"enum": list(spec.HEAD_DIMS)},
        "dtype": {"enum": list(spec.DTYPES)},
        "softmax": {
            "enum": list(spec.SOFTMAX_MODES),
            "default": spec.SOFTMAX_MODES[0],
            "description": "bounded: q tiles whose score bound |q| max|k| is small enough run "
            "without a running row max (faster, same results); the others run online",
        },
        "qk": {
            "enum": list(spec.QK_MODES),
            "default": spec.QK_MODES[0],
            "description": "int8: QK^T in int8 (k smoothed by its mean over the keys, q and k "
            "quantized per compute block, int32 products rescaled; P·V in the dtype); TPU "
            "only, not with softmax: bounded; jax.grad runs the float backward",
        },
    }
    return _section(spec.ATTENTION_KEYS, keys, spec.ATTENTION_REQUIRED, "heads and their size")


def _tiling() -> dict:
    block = {
        "type": "integer",
        "multipleOf": spec.BLOCK_MULTIPLE,
        "minimum": spec.BLOCK_MIN,
        "maximum": spec.BLOCK_MAX,
    }
    keys = {
        "block_q": dict(block, default=spec.DEFAULT_BLOCK),
        "block_kv": dict(block, default=spec.DEFAULT_BLOCK),
        "compute_q": dict(block, description="divides block_q; default: block_q"),
        "compute_kv": dict(block, description="divides block_kv; default: block_kv"),
        "align": {
            "enum": list(spec.ALIGN_MODES),
            "default": spec.ALIGN_MODES[0],
            "description": "round the mask to whole compute blocks: BOUNDARY blocks "
            "become FULL or EMPTY (exact: no rounding)",
        },
    }
    chip = {key: keys[key] for key in spec.CHIP_TILING_KEYS}
    for name in spec.TPU_CHIPS:
        keys[name] = _section(
            spec.CHIP_TILING_KEYS,
            chip,
            (),
            f"{name}'s own tiling, in place of the plain keys' when compiling for {name} "
            "(none of them inherited; align is every chip's: tiling.align)",
        )
    return _section(
        spec.TILING_KEYS + spec.TPU_CHIPS,
        keys,
        (),
        "tiles and the compute blocks inside them: the plain keys for every chip, a chip's "
        "key (v5e, ...) for that chip's own",
        nullable=True,
    )


def _gpu() -> dict:
    d = spec.GpuTiling()
    keys = {
        "block_q": {"enum": list(spec.GPU_BLOCKS), "default": d.block_q},
        "block_kv": {"enum": list(spec.GPU_BLOCKS), "default": d.block_kv},
        "num_warps": {"enum": list(spec.GPU_WARPS), "default": d.num_warps},
        "num_stages": {
            "type": "integer",
            "minimum": 1,
            "maximum": spec.GPU_MAX_STAGES,
            "default": d.num_stages,
        },
    }
    return _section(
        spec.GPU_KEYS,
        keys,
        (),
        "the GPU kernel's tiles, warps and pipeline stages (svgen compile --target h100|h200)",
        nullable=True,
    )


def _select() -> dict:
    def blocks(description: str, least: int) -> dict:
        return {
            "type": "integer",
            "minimum": least,
            "maximum": spec.MAX_SELECT_BLOCKS,
            "description": description,
        }

    bounds = {
        "min": blocks("the least blocks selected per compute block row (default 0)", 0),
        "max": blocks(
            "the most blocks selected per compute block row (default: the most the "
            "candidate offers any row)",
            1,
        ),
    }
    top_k = _section(
        spec.TOP_K_KEYS,
        {"k": blocks("blocks per row unless the call gives top_k= (at most max)", 0), **bounds},
        ("k",),
        "keep the k best-scoring candidate blocks per compute block row",
    )
    top_p = _section(
        spec.TOP_P_KEYS,
        {
            "p": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "description": "the mass to reach unless the call gives top_p=",
            },
            **bounds,
        },
        ("p",),
        "keep the fewest best candidate blocks per row whose softmax mass of pooled scores "
        "reaches p",
    )
    own = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "candidate": _ref("mask", "this pattern's heads choose among the blocks it touches"),
            "top_k": top_k,
            "top_p": top_p,
        },
        "minProperties": 1,
        "description": "what the heads of this pattern choose otherwise: a rule's block is "
        "taken whole; the rule itself is the section's",
    }
    patterns = {
        "type": "object",
        "additionalProperties": own,
        "minProperties": 1,
        "description": "with heads: per pattern of heads.candidates, its own candidate and amounts",
    }
    out = _section(
        spec.SELECT_KEYS,
        {
            "candidate": _ref("mask", "the region blocks may be chosen from (blocks it touches)"),
            "top_k": top_k,
            "top_p": top_p,
            "patterns": patterns,
            "sampled_rows": {
                "type": "integer",
                "minimum": 1,
                "maximum": spec.MAX_SAMPLED_ROWS,
                "description": "score blocks by the attention mass of this many evenly "
                "spaced query rows per compute block row (8: near the exact block mass) "
                "instead of mean-pooled q.k",
            },
        },
        ("candidate",),
        "blocks chosen per call from mean-pooled q.k scores (or sampled rows' attention "
        "mass), attended whole, besides the always-kept mask of each head",
    )
    out["oneOf"] = [{"required": ["top_k"]}, {"required": ["top_p"]}]
    return out


def _runtime() -> dict:
    keys = {
        "segments": {
            "type": "boolean",
            "default": False,
            "description": "attention(..., segment_ids=int32 [seq] or [batch, seq]): keep only "
            "pairs of one segment; a negative id marks a padding token",
        },
        "text_lengths": {
            "type": "boolean",
            "default": False,
            "description": "attention(..., text_lengths=int32 [] or [batch]): the real text "
            "tokens; padding text is never attended and its rows come out as zeros",
        },
        "per_video_frames": {
            "type": "boolean",
            "default": False,
            "description": "with segments: each video segment (whole frames of the geometry's "
            "height x width) numbers its frames from its own first frame, so first_frame and "
            "block_causal apply per video; text keeps frame 0",
        },
        "kv_cache": _section(
            spec.KV_CACHE_KEYS,
            {
                "chunk_frames": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "frames per chunk (divides geometry.frames): "
                    "attention(q_chunk, k_cache, v_cache, q_frame_offset=...) attends a chunk "
                    "against a cache of the whole video, the mask in absolute frames and "
                    "block-causal over the chunks",
                },
                "window_frames": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "a rolling cache: a ring of this many frames (at least "
                    "chunk_frames) after the sink frames; frame a >= sink_frames lives in "
                    "slot sink_frames + (a - sink_frames) mod window_frames; a mask keeping a "
                    "frame the ring has evicted is refused",
                },
                "sink_frames": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "a rolling cache's first frames, always held (frame a in "
                    "slot a); only with window_frames",
                },
            },
            ("chunk_frames",),
            "calls that attend a chunk of frames against a KV cache (autoregressive video); "
            "video-only geometry, frame_major layouts",
        ),
    }
    return _section(
        spec.RUNTIME_KEYS,
        keys,
        (),
        "inputs given at call time that only remove pairs from the compiled mask; the tables "
        "are refined on the device per call, with no recompilation",
        nullable=True,
    )


def _patterns() -> dict:
    return {
        "type": ["object", "null"],
        "description": "named masks, for ref and heads",
        "propertyNames": {"$ref": "#/$defs/name"},
        "maxProperties": MAX_PATTERNS,
        "additionalProperties": {"$ref": "#/$defs/mask"},
    }


def _heads() -> dict:
    candidate = _section(
        spec.CANDIDATE_KEYS,
        {
            "pattern": _ref("name", "a name from 'patterns'"),
            "layout": _layout("this candidate's token order; default: the spec's layout"),
        },
        ("pattern",),
        "a pattern a head may use",
    )
    keys = {
        "candidates": {
            "type": "array",
            "minItems": 1,
            "items": candidate,
            "description": "head_pattern index = position here",
        },
        "assign": {
            "oneOf": [{"const": "runtime"}, {"type": "array", "items": {"$ref": "#/$defs/name"}}],
            "description": "'runtime' (profiling), or one candidate name per head",
        },
    }
    return _section(spec.HEADS_KEYS, keys, spec.HEADS_KEYS, "patterns per head")


def _mask() -> dict:
    return {
        "type": "object",
        "description": "a mask: exactly one primitive or combinator",
        "properties": {p.key: _value(p) for p in primitives.registered()},
        "minProperties": 1,
        "maxProperties": 1,
        "additionalProperties": False,
    }


def _value(p: primitives.Primitive) -> dict:
    """The schema of what a spec writes under primitive ``p``'s key."""
    if p.form == primitives.PREDICATE:
        return {"type": "string", "maxLength": MAX_EXPR_CHARS, "description": p.doc}
    if p.form == primitives.MASKS:
        return {
            "type": "array",
            "minItems": 1,
            "items": {"$ref": "#/$defs/mask"},
            "description": p.doc,
        }
    if p.form == primitives.MASK:
        return _ref("mask", p.doc)
    if p.form == primitives.PATTERN:
        return _ref("name", p.doc)
    assert p.form == primitives.PARAMS, p.form
    out = _section(
        p.param_names,
        {q.name: _param(q) for q in p.params},
        p.required,
        p.doc,
        nullable=not (p.required or p.one_of),
    )  # null stands for {}
    if p.one_of:
        out["oneOf"] = [{"required": [name]} for name in p.one_of]
    return out


def _param(q: primitives.Param) -> dict:
    if q.kind == primitives.FRACTION:
        out = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    elif q.kind == primitives.TEXT:
        out = {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS}
    else:
        assert q.kind == primitives.INTEGER, q.kind
        out = {"type": "integer", "minimum": q.minimum, "maximum": q.maximum}
    if q.default is not None:
        out["default"] = q.default
    out["description"] = q.doc
    return out
