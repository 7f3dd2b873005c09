"""The mask primitives and combinators, each declared once: the one list the compiler reads.

A :class:`Primitive` says how a spec writes it (its key and parameters, with defaults,
ranges and cross-parameter rules), which IR node it lowers to, which row-set analysis
classifies that node's tiles, what the generated boundary mask calls its line, and what it
means in one line. Spec validation and its error messages (the "allowed: ..." lists),
lowering, tile analysis, code generation and the JSON Schema (`svgen schema`) all read this
registry, so a new primitive is one entry here plus its IR node and its row sets.

Order matters: it is the documented order, and the order of every "allowed:" list.

This module imports nothing of the compiler. The IR node and the row-set function are named
as ``"module:attribute"`` and imported on first use, because the spec reader consults the
registry before (and without) loading the IR or the analysis, which pull in NumPy, networkx
and, through ``svgen.analysis``, JAX. A primitive registered at run time (a test, a plugin)
may give the class and the function themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, Callable

from svgen.spec.limits import MAX_NAME_LEN, MAX_PARAM

__all__ = [
    "Param",
    "Primitive",
    "BUILTINS",
    "PARAMS",
    "PREDICATE",
    "MASKS",
    "MASK",
    "PATTERN",
    "INTEGER",
    "FRACTION",
    "TEXT",
    "EXTENTS",
    "FRAME_COUNT",
    "FRAME_DIFFERENCE",
    "ROW_DIFFERENCE",
    "COL_DIFFERENCE",
    "POSITION_COUNT",
    "POSITION_DIFFERENCE",
    "register",
    "unregister",
    "get",
    "keys",
    "registered",
    "by_node",
]

# How a spec writes the value under a primitive's key (Primitive.form).
PARAMS = "params"  # a mapping of named parameters; {} or null when none is needed
PREDICATE = "predicate"  # a string: an `expr` predicate (svgen.spec.expr)
MASKS = "masks"  # a non-empty list of masks (any_of, all_of)
MASK = "mask"  # one mask (not)
PATTERN = "pattern"  # the name of a pattern from `patterns` (ref); it lowers to that pattern

# Parameter kinds (Param.kind).
INTEGER = "integer"  # an integer in [minimum, maximum]
FRACTION = "fraction"  # a number with 0 < value <= 1
TEXT = "text"  # a non-empty string of at most MAX_PATH_CHARS characters (a file's path, a name)

# What an integer parameter is measured against (Param.within). A value past the geometry's
# largest meaningful one is legal (it means the same as that one, or keeps only what it
# can) but is likely a mistake of scale or of units, so `svgen` warns (svgen.report.lint).
FRAME_COUNT = "frame_count"  # at most geometry.frames
FRAME_DIFFERENCE = "frame_difference"  # at most frames - 1
ROW_DIFFERENCE = "row_difference"  # at most height - 1
COL_DIFFERENCE = "col_difference"  # at most width - 1
POSITION_COUNT = "position_count"  # at most the sequence length (text included)
POSITION_DIFFERENCE = "position_difference"  # at most the sequence length - 1
EXTENTS = (
    FRAME_COUNT,
    FRAME_DIFFERENCE,
    ROW_DIFFERENCE,
    COL_DIFFERENCE,
    POSITION_COUNT,
    POSITION_DIFFERENCE,
)

#: Named in the message when an integer parameter exceeds MAX_PARAM.
PARAM_LIMIT = "MAX_PARAM: no count in a mask exceeds the longest sequence"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a primitive.

    ``default`` is what lowering uses when the spec leaves it out (None: unbounded, or
    absent); ``required`` parameters have none. Integers are range-checked in the spec
    reader before any arithmetic sees them; ``limit`` names the maximum in the message.
    ``within`` (one of EXTENTS, or None) is the size of the geometry the value is measured
    against: past it, compiling warns.
    """

    name: str
    doc: str
    kind: str = INTEGER
    minimum: int = 0
    maximum: int = MAX_PARAM
    default: Any = None
    required: bool = False
    limit: str = PARAM_LIMIT
    within: str | None = None


@dataclasses.dataclass(frozen=True)
class Primitive:
    """Everything the compiler needs to know about one spec key.

    ``node`` builds the IR node: with ``form=PARAMS`` it is called with every parameter
    (given or default) as a keyword, or, when the class defines
    ``from_params(values, geometry)``, through that (band: a density becomes a width);
    with ``MASKS`` it gets the tuple of children, with ``MASK`` the child, with
    ``PREDICATE`` the source text and its sympy form. ``rows(node, chunk)`` returns the
    node's row sets (svgen.analysis.rowsets.Bounds). ``code_name`` names the node's line
    in a generated ``boundary_mask``. ``one_of``: exactly one of these parameters must be
    given. A ``PATTERN`` primitive (ref) has no node, rows or code name: lowering replaces
    it by the pattern it names.
    """

    key: str
    doc: str
    form: str = PARAMS
    params: tuple[Param, ...] = ()
    one_of: tuple[str, ...] = ()
    node: type | str | None = None
    rows: Callable | str | None = None
    code_name: str | None = None

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.required)

    @functools.cached_property
    def node_class(self) -> type | None:
        return _resolve(self.node)

    @functools.cached_property
    def rows_function(self) -> Callable | None:
        return _resolve(self.rows)

    def lower(self, given: dict[str, Any], geometry) -> Any:
        """The IR node of a PARAMS primitive from the parameters the spec gave."""
        values = {p.name: given.get(p.name, p.default) for p in self.params}
        build = getattr(self.node_class, "from_params", None)
        return build(values, geometry) if build is not None else self.node_class(**values)


def _resolve(ref):
    """A "module:attribute" reference, imported; anything else as it is."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _ir(name: str) -> str:
    return f"svgen.ir:{name}"


def _rows(name: str) -> str:
    return f"svgen.analysis.rowsets:{name}"


BUILTINS = (
    Primitive(
        "first_frame",
        "k is a video token of the first `frames` frames (any query, text too)",
        params=(
            Param(
                "frames",
                "leading frames every query attends",
                minimum=1,
                default=1,
                within=FRAME_COUNT,
            ),
        ),
        node=_ir("FirstFrame"),
        rows=_rows("first_frame_rows"),
        code_name="first_frame",
    ),
    Primitive(
        "spatial_window",
        "both video, |f_q-f_k| <= frames, |h_q-h_k| <= rows, |w_q-w_k| <= cols",
        params=(
            Param(
                "frames",
                "largest frame difference (omitted: every frame)",
                within=FRAME_DIFFERENCE,
            ),
            Param("rows", "largest row difference (omitted: unbounded)", within=ROW_DIFFERENCE),
            Param("cols", "largest column difference (omitted: unbounded)", within=COL_DIFFERENCE),
        ),
        node=_ir("SpatialWindow"),
        rows=_rows("spatial_window_rows"),
        code_name="spatial_window",
    ),
    Primitive(
        "temporal_stride",
        "both video, |h_q-h_k| <= rows, |w_q-w_k| <= cols, (f_q-f_k) mod stride = 0, "
        "|f_q-f_k| <= frames",
        params=(
            Param("rows", "largest row difference", default=0, within=ROW_DIFFERENCE),
            Param("cols", "largest column difference", default=0, within=COL_DIFFERENCE),
            Param(
                "stride",
                "frame difference must be a multiple of it",
                minimum=1,
                default=1,
                within=FRAME_DIFFERENCE,
            ),
            Param(
                "frames", "largest frame difference (omitted: unbounded)", within=FRAME_DIFFERENCE
            ),
        ),
        node=_ir("TemporalStride"),
        rows=_rows("temporal_stride_rows"),
        code_name="temporal_stride",
    ),
    Primitive(
        "band",
        "|i_q - i_k| <= width (positions in the layout's order); give width or density",
        params=(
            Param("width", "largest position difference", within=POSITION_DIFFERENCE),
            Param("density", "kept fraction: width = 128*ceil(N*(1-sqrt(1-d))/128)", kind=FRACTION),
        ),
        one_of=("width", "density"),
        node=_ir("Band"),
        rows=_rows("band_rows"),
        code_name="band",
    ),
    Primitive(
        "prefix",
        "i_k < tokens (the first positions of the layout's order)",
        params=(
            Param(
                "tokens",
                "positions every query attends",
                minimum=1,
                required=True,
                within=POSITION_COUNT,
            ),
        ),
        node=_ir("Prefix"),
        rows=_rows("prefix_rows"),
        code_name="prefix",
    ),
    Primitive(
        "text",
        "q or k is a text token",
        node=_ir("Text"),
        rows=_rows("text_rows"),
        code_name="text",
    ),
    Primitive(
        "causal_frames",
        "both video and f_k <= f_q",
        node=_ir("CausalFrames"),
        rows=_rows("causal_frames_rows"),
        code_name="causal_frames",
    ),
    Primitive(
        "block_causal",
        "both video and f_k // frames <= f_q // frames (causal over chunks)",
        params=(
            Param(
                "frames",
                "frames per chunk; a chunk attends itself and earlier chunks",
                minimum=1,
                required=True,
                within=FRAME_COUNT,
            ),
        ),
        node=_ir("BlockCausal"),
        rows=_rows("block_causal_rows"),
        code_name="block_causal",
    ),
    Primitive(
        "cube_window",
        "both video and the key's cube within frames x rows x cols cubes of the query's "
        "(cubes of cube_frames x cube_rows x cube_cols: Sliding Tile Attention's window)",
        params=(
            Param("cube_frames", "frames per cube", minimum=1, required=True, within=FRAME_COUNT),
            Param("cube_rows", "rows per cube", minimum=1, required=True),
            Param("cube_cols", "columns per cube", minimum=1, required=True),
            Param("frames", "largest cube difference in time", required=True),
            Param("rows", "largest cube difference in rows", required=True),
            Param("cols", "largest cube difference in columns", required=True),
        ),
        node=_ir("CubeWindow"),
        rows=_rows("cube_window_rows"),
        code_name="cube_window",
    ),
    Primitive(
        "neighborhood",
        "both video, the key in the query's window of frames x rows x cols on each axis, "
        "shifted inward at the video's edges (NATTEN's neighborhood attention), over "
        "every dilation-th position; causal: frames up to the query's",
        params=(
            Param(
                "frames",
                "window frames (omitted: every frame)",
                minimum=1,
                within=FRAME_COUNT,
            ),
            Param("rows", "window rows (omitted: every row)", minimum=1),
            Param("cols", "window columns (omitted: every column)", minimum=1),
            Param("frame_dilation", "every n-th frame", minimum=1, default=1, within=FRAME_COUNT),
            Param("row_dilation", "every n-th row", minimum=1, default=1),
            Param("col_dilation", "every n-th column", minimum=1, default=1),
            Param("causal", "1: the frame window ends at the query's frame", maximum=1, default=0),
        ),
        node=_ir("Neighborhood"),
        rows=_rows("predicate_rows"),
        code_name="neighborhood",
    ),
    Primitive(
        "radial",
        "both video, place distance |(h_q-h_k)*W + w_q-w_k| < width / 2^r where r = "
        "floor(log2(max(|f_q-f_k|, 1))) (Radial Attention's window, halving as the frame "
        "distance doubles)",
        params=(
            Param(
                "width",
                "the window at frame distance 0 and 1, in places (omitted: a frame's places)",
                minimum=1,
            ),
        ),
        node=_ir("Radial"),
        rows=_rows("predicate_rows"),
        code_name="radial",
    ),
    Primitive(
        "blocks",
        "a block mask given as data: keep(q, k) = array[p_q // block, p_k // block] (p: the "
        "token's position in the head's kernel order), read from a .npy or .npz file",
        params=(
            Param(
                "file",
                "the .npy or .npz file, relative to the spec's folder: a 0/1 array of "
                "[ceil(seq_len / block)] x [ceil(seq_len / block)], or [heads] x that",
                kind=TEXT,
                required=True,
            ),
            Param(
                "block",
                "tokens per block on each side (the array's grain)",
                minimum=1,
                required=True,
                within=POSITION_COUNT,
            ),
            Param("head", "which array of a [heads, n, n] file (omitted: the file is [n, n])"),
            Param(
                "array",
                "which array of a .npz file (omitted: its only array)",
                kind=TEXT,
            ),
        ),
        node=_ir("BlockData"),
        rows=_rows("block_data_rows"),
        code_name="blocks",
    ),
    Primitive(
        "expr",
        "a predicate over f_q h_q w_q f_k h_k w_k i_q i_k is_text_q is_text_k",
        form=PREDICATE,
        node=_ir("Predicate"),
        rows=_rows("predicate_rows"),
        code_name="expr",
    ),
    Primitive(
        "any_of",
        "union: keep(q, k) when any of the masks keeps it",
        form=MASKS,
        node=_ir("AnyOf"),
        rows=_rows("any_of_rows"),
        code_name="any_of",
    ),
    Primitive(
        "all_of",
        "intersection: keep(q, k) when every one of the masks keeps it",
        form=MASKS,
        node=_ir("AllOf"),
        rows=_rows("all_of_rows"),
        code_name="all_of",
    ),
    Primitive(
        "not",
        "complement of the mask",
        form=MASK,
        node=_ir("Not"),
        rows=_rows("not_rows"),
        code_name="negated",
    ),
    Primitive(
        "ref",
        f"the named pattern from `patterns` (a name of at most {MAX_NAME_LEN} characters)",
        form=PATTERN,
    ),
)

_REGISTRY: dict[str, Primitive] = {}


def register(primitive: Primitive) -> Primitive:
    """Add a primitive after those registered (its key must be new)."""
    if primitive.key in _REGISTRY:
        raise ValueError(f"mask primitive {primitive.key!r} is already registered")
    _REGISTRY[primitive.key] = primitive
    return primitive


def unregister(key: str) -> None:
    """Remove a primitive registered at run time (tests); built-ins stay."""
    if any(p.key == key for p in BUILTINS):
        raise ValueError(f"{key!r} is a built-in mask primitive")
    del _REGISTRY[key]


def get(key: str) -> Primitive | None:
    return _REGISTRY.get(key)


def keys() -> tuple[str, ...]:
    """Every spec key, in the documented order (the "allowed:" lists)."""
    return tuple(_REGISTRY)


def registered() -> tuple[Primitive, ...]:
    return tuple(_REGISTRY.values())


def by_node(node_class: type) -> Primitive | None:
    """The primitive whose IR node is ``node_class`` (imports the IR on first use)."""
    return next(
        (p for p in _REGISTRY.values() if p.node is not None and p.node_class is node_class), None
    )


for _builtin in BUILTINS:
    register(_builtin)
