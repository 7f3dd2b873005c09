"""The front end: YAML spec -> frozen, validated dataclasses, with file/line/column/key errors.

The YAML text is composed into nodes (PyYAML's safe loader, bounded: ``_BoundedLoader``)
and the values are built here by hand, so that every error can name the file, the 1-based
line and column, and the key path (``mask.any_of[1].spatial_window.frames``) it is about.
Every error raised from this package is a :class:`svgen.spec.errors.SpecError`. Mask keys, their
parameters and the checks on them are declared in the primitive registry
(:mod:`svgen.spec.primitives`), which the reader reads without importing the IR.

Hostile input is bounded before the work it would blow up (:mod:`svgen.spec.limits`): the file
size before parsing, YAML nesting and alias expansion while composing, every integer
against a range before any arithmetic, the geometry and its tile grid before analysis,
and each mask's size and depth, refs expanded, before lowering.

The package, by part (each imports only those above it):
    errors, limits, primitives, expr, int_range   the front end's vocabulary
    model       the spec as dataclasses, and the language's constants
    canonical   the canonical JSON a spec's digest hashes
    nodes       reading YAML nodes with located errors (`Reader`)
    masks       mask trees, the patterns' dependency order, mask sizes
    sections    geometry, attention, tiling (per chip too), gpu, runtime, select, layout, heads
    loader      `parse_spec`, `load_spec`: the bounded YAML loader and the whole spec
    schema      the JSON Schema of the language (`svgen schema`)
What later stages use is re-exported here: `from svgen.spec import load_spec, Spec, ...`.
"""

from __future__ import annotations

from svgen.core.layout import TEXT_POSITIONS, TILED, TokenLayout
from svgen.spec.canonical import canonical_json
from svgen.spec.errors import SpecError
from svgen.spec.loader import load_spec, parse_spec
from svgen.spec.masks import dependency_order, pattern_graph
from svgen.spec.model import (
    ALIGN_MODES,
    BLOCK_MAX,
    BLOCK_MIN,
    BLOCK_MULTIPLE,
    DEFAULT_BLOCK,
    DTYPES,
    HEAD_DIMS,
    IMPLICIT_PATTERN,
    LAYOUTS,
    NAME_PATTERN,
    NAME_RE,
    SOFTMAX_MODES,
    QK_MODES,
    SPEC_VERSION,
    TPU_CHIPS,
    Attention,
    Candidate,
    GpuTiling,
    HeadPatterns,
    Location,
    MaskTerm,
    Runtime,
    Select,
    Spec,
    Tiling,
    reserved_name_reason,
)
from svgen.spec.sections import (
    ATTENTION_KEYS,
    ATTENTION_REQUIRED,
    CANDIDATE_KEYS,
    CHIP_TILING_KEYS,
    GEOMETRY_KEYS,
    GEOMETRY_MINIMUMS,
    GPU_BLOCKS,
    GPU_KEYS,
    GPU_MAX_STAGES,
    GPU_WARPS,
    HEADS_KEYS,
    KV_CACHE_KEYS,
    LAYOUT_KEYS,
    MAX_COMPUTE_BLOCKS,
    MAX_SAMPLED_ROWS,
    MAX_SELECT_BLOCKS,
    RUNTIME_KEYS,
    SELECT_KEYS,
    TILED_KEYS,
    TILING_KEYS,
    TOP_K_KEYS,
    TOP_KEYS,
    TOP_P_KEYS,
)

__all__ = [
    "ALIGN_MODES",
    "ATTENTION_KEYS",
    "ATTENTION_REQUIRED",
    "Attention",
    "BLOCK_MAX",
    "BLOCK_MIN",
    "BLOCK_MULTIPLE",
    "CANDIDATE_KEYS",
    "CHIP_TILING_KEYS",
    "Candidate",
    "DEFAULT_BLOCK",
    "DTYPES",
    "GEOMETRY_KEYS",
    "GEOMETRY_MINIMUMS",
    "GPU_BLOCKS",
    "GPU_KEYS",
    "GPU_MAX_STAGES",
    "GPU_WARPS",
    "GpuTiling",
    "HEADS_KEYS",
    "HEAD_DIMS",
    "HeadPatterns",
    "IMPLICIT_PATTERN",
    "KV_CACHE_KEYS",
    "LAYOUTS",
    "LAYOUT_KEYS",
    "Location",
    "MAX_COMPUTE_BLOCKS",
    "MAX_SAMPLED_ROWS",
    "MAX_SELECT_BLOCKS",
    "MaskTerm",
    "NAME_PATTERN",
    "NAME_RE",
    "RUNTIME_KEYS",
    "Runtime",
    "SELECT_KEYS",
    "SOFTMAX_MODES",
    "QK_MODES",
    "SPEC_VERSION",
    "Select",
    "Spec",
    "SpecError",
    "TEXT_POSITIONS",
    "TILED",
    "TILED_KEYS",
    "TILING_KEYS",
    "TOP_KEYS",
    "TOP_K_KEYS",
    "TOP_P_KEYS",
    "TPU_CHIPS",
    "Tiling",
    "TokenLayout",
    "canonical_json",
    "dependency_order",
    "load_spec",
    "parse_spec",
    "pattern_graph",
    "reserved_name_reason",
]
