"""YAML spec -> frozen, validated dataclasses, with file/line/column/key errors.

The YAML text is composed into nodes (PyYAML's safe loader, bounded: ``_BoundedLoader``)
and the values are built here by hand, so that every error can name the file, the 1-based
line and column, and the key path (``mask.any_of[1].spatial_window.frames``) it is about.
Every error raised from this module is a :class:`svgen.errors.SpecError`. Mask keys, their
parameters and the checks on them are declared in the primitive registry
(:mod:`svgen.primitives`), which this module reads without importing the IR.

Hostile input is bounded before the work it would blow up (:mod:`svgen.limits`): the file
size before parsing, YAML nesting and alias expansion while composing, every integer
against a range before any arithmetic, the geometry and its tile grid before analysis,
and each mask's size and depth, refs expanded, before lowering.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import keyword
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from svgen import primitives
from svgen.errors import SpecError
from svgen.expr import ExprSyntaxError, parse_predicate, predicate_tokens
from svgen.limits import (
    MAX_HEADS,
    MAX_MASK_DEPTH,
    MAX_MASK_SIZE,
    MAX_NAME_LEN,
    MAX_PATTERNS,
    MAX_SEQ_LEN,
    MAX_SPEC_BYTES,
    MAX_TILE_PAIRS,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
)
from svgen.runtime.layout import (
    FRAME_MAJOR,
    TEMPORAL_MAJOR,
    TEXT_POSITIONS,
    TILED,
    Tiled,
    TokenLayout,
)

__all__ = [
    "Location",
    "TokenLayout",
    "Attention",
    "Tiling",
    "MaskTerm",
    "Candidate",
    "HeadPatterns",
    "Spec",
    "NAME_RE",
    "parse_spec",
    "load_spec",
    "canonical_json",
]

NAME_PATTERN = "[a-z][a-z0-9_]*"
NAME_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
SPEC_VERSION = 1
LAYOUTS = (FRAME_MAJOR, TEMPORAL_MAJOR)  # the `layout:` names; tiled is {tiled: {...}}
DTYPES = ("bfloat16", "float32")
#: attention.softmax: the online softmax (a running row max), or a bound of each row's scores
#: from the norms of q and k where it is small enough, online elsewhere (svgen.runtime.forward).
SOFTMAX_MODES = ("online", "bounded")
HEAD_DIMS = (64, 128, 256)
#: How `tiling.align` rounds the mask to whole compute blocks (svgen.analysis.align says how
#: each mode decides); "exact" keeps the mask as written.
ALIGN_MODES = ("exact", "superset", "subset", "nearest", "balanced")
BLOCK_MULTIPLE = 128
BLOCK_MIN = 128
BLOCK_MAX = 4096
DEFAULT_BLOCK = 512

#: Top-level modules besides the standard library that a spec name must not shadow: the
#: spec name becomes ``<name>.py`` next to other generated modules, and importing that
#: folder would then hide the real module from every module in it. svgen, what svgen and
#: its generated code import, and their usual neighbours in a model's environment.
THIRD_PARTY_MODULES = frozenset(
    {
        "svgen",
        "jax",
        "jaxlib",
        "libtpu",
        "numpy",
        "ml_dtypes",
        "opt_einsum",
        "scipy",
        "yaml",
        "jinja2",
        "markupsafe",
        "sympy",
        "mpmath",
        "networkx",
        "matplotlib",
        "pytest",
        "setuptools",
        "pip",
        "pkg_resources",
        "flax",
        "optax",
        "torch",
        "einops",
    }
)
_BUILTIN_NAMES = frozenset(dir(builtins))


def reserved_name_reason(name: str) -> str | None:
    """Why ``name`` may not name a spec or pattern (None when it may).

    A keyword makes the generated module unimportable; a builtin or an importable module
    name makes it shadow what other code means by that name.
    """
    if keyword.iskeyword(name):
        return "a Python keyword"
    if name in _BUILTIN_NAMES:
        return "a Python builtin"
    if name in sys.stdlib_module_names:
        return "a standard-library module"
    if name in THIRD_PARTY_MODULES:
        return "an importable module that svgen or generated code may use"
    return None


# ----------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class Location:
    """Where something was written: file, 1-based line and column, key path."""

    file: str
    line: int
    column: int
    key: str


@dataclass(frozen=True)
class Attention:
    heads: int
    head_dim: int
    dtype: str  # "bfloat16" | "float32"
    softmax: str = "online"  # one of SOFTMAX_MODES


@dataclass(frozen=True)
class Tiling:
    """Tiles (what one grid step brings into VMEM) and the compute blocks inside them (what
    one matmul pair works on; None: the whole tile)."""

    block_q: int
    block_kv: int
    compute_q: int | None = None
    compute_kv: int | None = None
    align: str = "exact"  # one of ALIGN_MODES: BOUNDARY compute blocks rounded to FULL/EMPTY

    @property
    def aligned(self) -> bool:
        return self.align != "exact"

    @property
    def cq(self) -> int:
        return self.compute_q or self.block_q

    @property
    def ckv(self) -> int:
        return self.compute_kv or self.block_kv

    @property
    def compute_blocks(self) -> int:
        return (self.block_q // self.cq) * (self.block_kv // self.ckv)


@dataclass(frozen=True)
class Runtime:
    """The `runtime` section: inputs given at call time that only remove pairs from the
    compiled mask (svgen.runtime.segments): per-token segment ids, per-prompt text lengths;
    and `kv_cache: {chunk_frames: C}`: calls that attend a chunk of C frames (its first
    frame given at call time) against a cache of the video's keys and values
    (svgen.runtime.chunks). chunk_frames 0: no chunked calls. window_frames W > 0: the
    cache is rolling, sink_frames S and a ring of W frames (else the whole video)."""

    segments: bool = False
    text_lengths: bool = False
    # Each video segment numbers its frames from its own first frame (svgen.runtime.segments).
    per_video_frames: bool = False
    chunk_frames: int = 0
    sink_frames: int = 0
    window_frames: int = 0
    where: Location | None = field(default=None, compare=False, hash=False)  # kv_cache's key
    frames_where: Location | None = field(default=None, compare=False, hash=False)

    @property
    def any(self) -> bool:
        return self.segments or self.text_lengths

    @property
    def kv_cache(self) -> bool:
        return self.chunk_frames > 0

    @property
    def rolling(self) -> bool:
        return self.window_frames > 0

    def cache_frames(self, video_frames: int) -> int:
        """Frames a chunked call's cache holds: the sink and the ring, or the whole video."""
        return self.sink_frames + self.window_frames if self.rolling else video_frames


@dataclass(frozen=True)
class Select:
    """The `select` section: blocks chosen per call from the activations
    (svgen.runtime.select). `candidate` bounds what can be chosen (the compute blocks it
    touches); `rule` is top_k (default: k blocks per compute block row) or top_p (default:
    the mass p), each clamped to [min_blocks, max_blocks] per row."""

    candidate: MaskTerm
    rule: str
    default: float
    min_blocks: int
    max_blocks: int
    where: Location | None = field(default=None, compare=False, hash=False)
    # Block scores from this many sampled query rows per compute block row (their attention
    # mass per block); 0: mean pooling of q and k (svgen.runtime.select).
    sampled_rows: int = 0


@dataclass(frozen=True)
class GpuTiling:
    """How `svgen compile --target h100|h200` tiles the GPU kernel (svgen.runtime.gpu): a
    Triton program's q and kv tiles (they live in registers, so they are small), its warps
    and its software-pipelining stages."""

    block_q: int = 64
    block_kv: int = 64
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class MaskTerm:
    """One node of a mask tree.

    ``params`` holds only the keys the user gave (no defaults filled in), sorted by
    name. ``where`` points at the primitive's key in the YAML (its ``key`` is the key
    path of that primitive, e.g. ``mask.any_of[1].ref``); it takes no part in equality.
    """

    op: str
    params: tuple[tuple[str, object], ...]
    children: tuple["MaskTerm", ...] = ()
    where: Location | None = field(default=None, compare=False, hash=False)

    def param(self, name: str, default: Any = None) -> Any:
        for key, value in self.params:
            if key == name:
                return value
        return default

    def references(self) -> Iterator["MaskTerm"]:
        """The `pattern` terms of this tree (references to named patterns), depth first and
        left to right, without recursion (a tree may be MAX_MASK_DEPTH deep)."""
        stack = [self]
        while stack:
            term = stack.pop()
            if primitives.get(term.op).form == primitives.PATTERN:
                yield term
            stack.extend(reversed(term.children))


@dataclass(frozen=True)
class Candidate:
    """One pattern a head may use: a name from ``Spec.patterns`` and its token layout.

    ``where`` points at the candidate's mapping in the YAML (key ``heads.candidates[i]``);
    it takes no part in equality.
    """

    pattern: str
    layout: str | Tiled  # a name of LAYOUTS or a tiled cube; the spec's layout when not given
    where: Location | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class HeadPatterns:
    """The patterns heads choose from, and which head uses which.

    A head's pattern index is the position of its candidate in ``candidates``.
    ``assign`` names one candidate pattern per head (``attention.heads`` entries), or is
    ``None`` when the assignment is chosen at run time (``assign: runtime``).
    """

    candidates: tuple[Candidate, ...]
    assign: tuple[str, ...] | None  # None = chosen at run time ("runtime")


#: The candidate name of a spec's top-level ``mask`` in :meth:`Spec.head_patterns`.
IMPLICIT_PATTERN = "mask"


@dataclass(frozen=True)
class Spec:
    name: str
    geometry: TokenLayout
    attention: Attention
    layout: str | Tiled  # a name of LAYOUTS or a tiled cube; the default of head candidates
    mask: MaskTerm | None  # one pattern for every head; None when ``heads`` is given
    patterns: tuple[tuple[str, MaskTerm], ...]  # sorted by name
    heads: HeadPatterns | None  # patterns per head; None when ``mask`` is given
    tiling: Tiling
    source: str  # the path string as given
    digest: str  # sha256 hex of canonical_json(spec)
    gpu: GpuTiling | None = None  # the `gpu` section; None: not given (GpuTiling's defaults)
    runtime: Runtime = Runtime()  # the `runtime` section (all False: not given)
    select: Select | None = None  # the `select` section; None: a static mask

    @property
    def gpu_tiling(self) -> GpuTiling:
        return self.gpu or GpuTiling()

    def head_patterns(self) -> HeadPatterns:
        """``heads``, or for a ``mask`` spec its one implicit candidate named ``"mask"`` on every head."""
        if self.heads is not None:
            return self.heads
        return HeadPatterns(
            (Candidate(IMPLICIT_PATTERN, self.layout),), (IMPLICIT_PATTERN,) * self.attention.heads
        )

    def pattern_mask(self, name: str) -> MaskTerm:
        """The mask of the candidate pattern ``name`` (a name from :meth:`head_patterns`)."""
        if self.heads is None and name == IMPLICIT_PATTERN:
            assert self.mask is not None
            return self.mask
        return dict(self.patterns)[name]


# ----------------------------------------------------------------------------- canonical form


def _term_json(term: MaskTerm) -> dict:
    return {
        "op": term.op,
        "params": {k: v for k, v in term.params},
        "children": [_term_json(c) for c in term.children],
    }


def _heads_json(heads: HeadPatterns) -> dict:
    return {
        "candidates": [
            {"pattern": c.pattern, "layout": _layout_json(c.layout)} for c in heads.candidates
        ],
        "assign": "runtime" if heads.assign is None else list(heads.assign),
    }


def _canonical_obj(name, geometry, attention, layout, mask, patterns, heads, tiling) -> dict:
    # A mask spec's form is exactly what it was before ``heads`` existed (no "heads" key),
    # so the digests embedded in generated files stay valid; a heads spec has no "mask".
    obj = {
        "name": name,
        "geometry": {
            "frames": geometry.frames,
            "height": geometry.height,
            "width": geometry.width,
            "text_tokens": geometry.text_tokens,
            "text_position": geometry.text_position,
        },
        "attention": {
            "heads": attention.heads,
            "head_dim": attention.head_dim,
            "dtype": attention.dtype,
        },
        "layout": _layout_json(layout),
        "mask": _term_json(mask) if mask is not None else None,
        "patterns": {n: _term_json(t) for n, t in patterns},
        "tiling": _tiling_json(tiling),
    }
    if heads is not None:
        del obj["mask"]
        obj["heads"] = _heads_json(heads)
    if attention.softmax != SOFTMAX_MODES[0]:  # declared only: older digests stay valid
        obj["attention"]["softmax"] = attention.softmax
    return obj


def _layout_json(layout: str | Tiled) -> str | dict:
    # A name as before (digests of older specs stay valid); a tiled layout as written, so
    # that its cube is part of the spec's identity.
    if isinstance(layout, str):
        return layout
    return {TILED: {"frames": layout.frames, "rows": layout.rows, "cols": layout.cols}}


def _tiling_json(tiling: Tiling) -> dict:
    # Compute blocks appear only when given, and align only when it changes the mask, so
    # digests of older specs stay valid.
    out = {"block_q": tiling.block_q, "block_kv": tiling.block_kv}
    for key in ("compute_q", "compute_kv"):
        if getattr(tiling, key) is not None:
            out[key] = getattr(tiling, key)
    if tiling.aligned:
        out["align"] = tiling.align
    return out


def _with_gpu(obj: dict, gpu: GpuTiling | None) -> dict:
    # Only when given, so the digests of specs without it stay what they were.
    if gpu is not None:
        obj["gpu"] = {
            "block_q": gpu.block_q,
            "block_kv": gpu.block_kv,
            "num_warps": gpu.num_warps,
            "num_stages": gpu.num_stages,
        }
    return obj


def _with_runtime(obj: dict, runtime: Runtime) -> dict:
    # Only when something is declared, so the digests of specs without it stay what they were.
    if runtime.any:
        obj["runtime"] = {"segments": runtime.segments, "text_lengths": runtime.text_lengths}
        if runtime.per_video_frames:
            obj["runtime"]["per_video_frames"] = True
    if runtime.kv_cache:
        cache = {"chunk_frames": runtime.chunk_frames}
        if runtime.rolling:
            cache.update(sink_frames=runtime.sink_frames, window_frames=runtime.window_frames)
        obj.setdefault("runtime", {})["kv_cache"] = cache
    return obj


def _with_select(obj: dict, select: Select | None) -> dict:
    # Only when given, so the digests of specs without it stay what they were.
    if select is not None:
        obj["select"] = {
            "candidate": _term_json(select.candidate),
            select.rule: {
                "default": select.default,
                "min": select.min_blocks,
                "max": select.max_blocks,
            },
        }
        if select.sampled_rows:
            obj["select"]["sampled_rows"] = select.sampled_rows
    return obj


def _dumps(obj: dict) -> str:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def canonical_json(spec: Spec) -> str:
    """The canonical JSON text the digest is computed from (no source, no locations)."""
    obj = _canonical_obj(
        spec.name,
        spec.geometry,
        spec.attention,
        spec.layout,
        spec.mask,
        spec.patterns,
        spec.heads,
        spec.tiling,
    )
    return _dumps(_with_select(_with_runtime(_with_gpu(obj, spec.gpu), spec.runtime), spec.select))


# ----------------------------------------------------------------------------- node helpers

_MISSING = object()


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Reader:
    def __init__(self, text: str, source: str):
        self.text = text
        self.source = source
        self._constructor = yaml.constructor.SafeConstructor()

    # -- errors
    def error(self, node: Node | None, key: str | None, message: str) -> SpecError:
        if node is None:
            return SpecError(message, file=self.source, key=key or None)
        mark = node.start_mark
        return SpecError(
            message, file=self.source, line=mark.line + 1, column=mark.column + 1, key=key or None
        )

    def location(self, node: Node, key: str) -> Location:
        return Location(self.source, node.start_mark.line + 1, node.start_mark.column + 1, key)

    # -- values
    def scalar(self, node: Node, path: str | None = None) -> Any:
        """The Python value of a scalar node (int, float, bool, None, str, ...)."""
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # e.g. an unknown tag such as !foo
            self._constructor.recursive_objects.clear()
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.error(node, path, f"unsupported YAML value: {problem}") from None
        except (ValueError, OverflowError):
            # An integer of thousands of digits (Python refuses to convert it), a timestamp
            # such as 2024-13-45: a value no key here could accept anyway.
            self._constructor.recursive_objects.clear()
            raise self.error(
                node, path, f"unsupported YAML value: cannot read {_abbreviate(node.value)}"
            ) from None

    def describe(self, node: Node) -> str:
        """What a node holds, for 'got ...' in messages."""
        if isinstance(node, MappingNode):
            return "an empty mapping" if not node.value else "a mapping"
        if isinstance(node, SequenceNode):
            return "an empty list" if not node.value else "a list"
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError:
            self._constructor.recursive_objects.clear()
            return f"a value tagged {node.tag}"
        except (ValueError, OverflowError):
            self._constructor.recursive_objects.clear()
            return f"an unreadable value ({_abbreviate(node.value)})"
        if value is None:
            return "null"
        if isinstance(value, bool):
            return f"a boolean ({node.value})"
        if isinstance(value, int):
            return f"an integer ({_show_int(value)})"
        if isinstance(value, float):
            return f"a number ({_clip(node.value)})"
        if isinstance(value, str):
            return f"a string ({_abbreviate(value)})"
        return f"a {type(value).__name__} ({_clip(node.value)})"

    def mapping(
        self,
        node: Node,
        path: str,
        allowed: tuple[str, ...],
        what: str = "a mapping",
        allowed_note: str | None = None,
    ) -> dict[str, tuple[Node, Node]]:
        """Check a mapping node: no duplicate or unknown keys. Returns key -> (key node, value node)."""
        if not isinstance(node, MappingNode):
            raise self.error(node, path, f"must be {what}, got {self.describe(node)}")
        out: dict[str, tuple[Node, Node]] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode):
                raise self.error(
                    knode, path, f"keys must be plain names, got {self.describe(knode)}"
                )
            key = knode.value
            shown = _key_text(key)
            if key in out:
                first = out[key][0].start_mark.line + 1
                raise self.error(
                    knode,
                    _join(path, shown),
                    f"duplicate key '{shown}' (first given on line {first})",
                )
            if key not in allowed:
                note = allowed_note or (
                    f"allowed keys: {', '.join(allowed)}" if allowed else "no keys are allowed"
                )
                raise self.error(knode, _join(path, shown), f"unknown key '{shown}'; {note}")
            out[key] = (knode, vnode)
        return out

    def require(self, node: Node, path: str, entries: dict, keys: tuple[str, ...]) -> None:
        for key in keys:
            if key not in entries:
                raise self.error(node, path, f"missing required key '{key}'")

    def integer(self, node: Node, path: str, minimum: int, maximum: int, limit: str) -> int:
        """An integer in [minimum, maximum]; ``limit`` names the maximum in the message
        (every integer is range-checked here, before any arithmetic sees it)."""
        desc = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        value = self.scalar(node, path) if isinstance(node, ScalarNode) else _MISSING
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(node, path, f"must be {desc}, got {self.describe(node)}")
        if value < minimum:
            raise self.error(node, path, f"must be {desc}, got {_show_int(value)}")
        if value > maximum:
            raise self.error(
                node, path, f"must be at most {maximum:,} ({limit}), got {_show_int(value)}"
            )
        return value

    def string(self, node: Node, path: str, what: str = "a string") -> str:
        value = self.scalar(node, path) if isinstance(node, ScalarNode) else _MISSING
        if not isinstance(value, str):
            raise self.error(node, path, f"must be {what}, got {self.describe(node)}")
        return value

    def choice(self, node: Node, path: str, choices: tuple) -> Any:
        value = self.scalar(node, path) if isinstance(node, ScalarNode) else _MISSING
        ok = any(type(value) is type(c) and value == c for c in choices)
        if not ok:
            listed = ", ".join(str(c) for c in choices)
            got = self.describe(node)
            if (
                isinstance(value, (str, int))
                and not isinstance(value, bool)
                and value is not _MISSING
            ):
                got = _abbreviate(value) if isinstance(value, str) else _show_int(value)
            raise self.error(node, path, f"must be one of {listed}, got {got}")
        return value

    def name(self, node: Node, path: str, what: str = "a name") -> str:
        must = f"{what} matching {NAME_PATTERN} of at most {MAX_NAME_LEN} characters"
        value = self.string(node, path, must)
        if not NAME_RE.match(value) or len(value) > MAX_NAME_LEN:
            raise self.error(node, path, f"must be {must}, got {_abbreviate(value)}")
        return value

    def unreserved(self, node: Node, path: str, name: str, becomes: str) -> str:
        """``name`` unless it is a keyword, builtin or module name (``becomes`` says why
        that matters for this name)."""
        reason = reserved_name_reason(name)
        if reason is not None:
            raise self.error(
                node,
                path,
                f"{name!r} is {reason}; {becomes}, so it may not be "
                f"a keyword, builtin or module name: choose another",
            )
        return name


def _show_int(value: int) -> str:
    """An integer for a message: in full unless it has more digits than any limit."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def _key_text(key: str, keep: int = 80) -> str:
    """A key as written, cut short for a key path (a key may be any length)."""
    return key if len(key) <= keep else f"{key[:keep]}..."


def _clip(text: str, keep: int = 80) -> str:
    """``text`` as written, cut short so that one hostile value cannot flood the message."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def _abbreviate(text: str, keep: int = 80) -> str:
    """``repr(text)``, cut short so that one hostile value cannot flood the message."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text)} characters)"


# ----------------------------------------------------------------------------- sections

TOP_KEYS = (
    "svgen",
    "name",
    "geometry",
    "attention",
    "layout",
    "mask",
    "heads",
    "patterns",
    "tiling",
    "gpu",
    "runtime",
    "select",
)
SELECT_KEYS = ("candidate", "top_k", "top_p", "sampled_rows")
#: The most query rows a select policy may sample per compute block row.
MAX_SAMPLED_ROWS = 64
TOP_K_KEYS = ("k", "min", "max")
TOP_P_KEYS = ("p", "min", "max")
#: The most blocks a select policy may keep per compute block row (the packed tables' side).
MAX_SELECT_BLOCKS = 32768
RUNTIME_KEYS = ("segments", "text_lengths", "per_video_frames", "kv_cache")
KV_CACHE_KEYS = ("chunk_frames", "sink_frames", "window_frames")
GEOMETRY_KEYS = ("frames", "height", "width", "text_tokens", "text_position")
#: The least value of each size in ``geometry`` (their most: MAX_SEQ_LEN, and so their total).
GEOMETRY_MINIMUMS = {"frames": 1, "height": 1, "width": 1, "text_tokens": 0}
ATTENTION_KEYS = ("heads", "head_dim", "dtype", "softmax")
ATTENTION_REQUIRED = ("heads", "head_dim", "dtype")
TILING_KEYS = ("block_q", "block_kv", "compute_q", "compute_kv", "align")
MAX_COMPUTE_BLOCKS = 16  # per tile: their kinds fit one int32 of SMEM (2 bits each)
HEADS_KEYS = ("candidates", "assign")
GPU_KEYS = ("block_q", "block_kv", "num_warps", "num_stages")
#: Triton tiles: powers of two (tensor shapes), at least 16 (tl.dot's smallest operand).
GPU_BLOCKS = (16, 32, 64, 128, 256)
GPU_WARPS = (1, 2, 4, 8, 16)
GPU_MAX_STAGES = 8
CANDIDATE_KEYS = ("pattern", "layout")
LAYOUT_KEYS = (TILED,)  # the mapping form of `layout:`
TILED_KEYS = ("frames", "rows", "cols")  # the cube, each at most the geometry's extent


def _read_geometry(r: _Reader, node: Node, path: str) -> TokenLayout:
    e = r.mapping(node, path, GEOMETRY_KEYS)
    r.require(node, path, e, ("frames", "height", "width"))
    sizes = {}
    for key, minimum in GEOMETRY_MINIMUMS.items():
        sizes[key] = 0
        if key in e:
            sizes[key] = r.integer(e[key][1], _join(path, key), minimum, MAX_SEQ_LEN, _SEQ_LIMIT)
    text_position = "last"
    if "text_position" in e:
        text_position = r.choice(
            e["text_position"][1], _join(path, "text_position"), TEXT_POSITIONS
        )
    geometry = TokenLayout(text_position=text_position, **sizes)
    if geometry.seq_len > MAX_SEQ_LEN:
        raise r.error(
            node,
            path,
            f"{geometry.frames:,} frames of {geometry.height:,} x "
            f"{geometry.width:,} plus {geometry.text_tokens:,} text tokens "
            f"make {geometry.seq_len:,} tokens, more than {MAX_SEQ_LEN:,} "
            f"({_SEQ_LIMIT})",
        )
    return geometry


_SEQ_LIMIT = "MAX_SEQ_LEN, the most tokens a sequence may have"


def _check_tile_grid(
    r: _Reader, node: Node, path: str, geometry: TokenLayout, tiling: Tiling, patterns: int
) -> None:
    """Refuse a geometry and tiling whose dense grids of compute-block pairs (one byte each,
    one grid per candidate pattern) would exceed MAX_TILE_PAIRS, before analysis allocates
    them; suggest square compute blocks that fit."""

    def pairs(cq: int, ckv: int) -> int:
        return -(-geometry.seq_len // cq) * -(-geometry.seq_len // ckv) * patterns

    need = pairs(tiling.cq, tiling.ckv)
    if need <= MAX_TILE_PAIRS:
        return
    block = BLOCK_MIN
    while block < BLOCK_MAX and pairs(block, block) > MAX_TILE_PAIRS:
        block *= 2
    hint = "use fewer tokens or fewer candidate patterns"
    if pairs(block, block) <= MAX_TILE_PAIRS:
        hint = f"tiling {{block_q: {block}, block_kv: {block}}} would fit"
    per = f" ({patterns} candidate patterns of {need // patterns:,})" if patterns > 1 else ""
    raise r.error(
        node,
        path,
        f"{geometry.seq_len:,} tokens in {tiling.cq} x {tiling.ckv} compute "
        f"blocks make {need:,} block pairs to classify{per}, more than "
        f"{MAX_TILE_PAIRS:,} (MAX_TILE_PAIRS: the analysis keeps one byte "
        f"per pair); {hint}",
    )


# sm_scale is a call's argument, not the kernel's: a spec that gives one (a string, NaN, a
# number alike) is refused, saying where the scale goes instead.
_ATTENTION_NOTE = (
    f"allowed keys: {', '.join(ATTENTION_KEYS)} (the softmax scale is not part of a spec: "
    "pass sm_scale=... to the generated attention())"
)


def _read_attention(r: _Reader, node: Node, path: str) -> Attention:
    e = r.mapping(node, path, ATTENTION_KEYS, allowed_note=_ATTENTION_NOTE)
    r.require(node, path, e, ATTENTION_REQUIRED)
    heads = r.integer(e["heads"][1], _join(path, "heads"), 1, MAX_HEADS, "MAX_HEADS")
    head_dim = r.choice(e["head_dim"][1], _join(path, "head_dim"), HEAD_DIMS)
    dtype = r.choice(e["dtype"][1], _join(path, "dtype"), DTYPES)
    softmax = SOFTMAX_MODES[0]
    if "softmax" in e:
        softmax = r.choice(e["softmax"][1], _join(path, "softmax"), SOFTMAX_MODES)
    return Attention(heads, head_dim, dtype, softmax)


def _read_block(r: _Reader, node: Node, path: str, key: str) -> int:
    value = r.scalar(node, path) if isinstance(node, ScalarNode) else _MISSING
    ok = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value % BLOCK_MULTIPLE == 0
        and BLOCK_MIN <= value <= BLOCK_MAX
    )
    if not ok:
        got = (
            _show_int(value)
            if isinstance(value, int) and not isinstance(value, bool)
            else r.describe(node)
        )
        raise r.error(
            node,
            path,
            f"{key} must be a multiple of {BLOCK_MULTIPLE} between {BLOCK_MIN} and {BLOCK_MAX} "
            f"(TPU tiles are 8x128 and the VMEM budget), got {got}",
        )
    return value


def _read_tiling(r: _Reader, node: Node, path: str) -> Tiling:
    if _is_null(r, node, path):
        return Tiling(DEFAULT_BLOCK, DEFAULT_BLOCK)
    e = r.mapping(node, path, TILING_KEYS)
    vals = {}
    for key in ("block_q", "block_kv"):
        vals[key] = _read_block(r, e[key][1], _join(path, key), key) if key in e else DEFAULT_BLOCK
    for key, block_key in (("compute_q", "block_q"), ("compute_kv", "block_kv")):
        if key not in e:
            continue
        knode = e[key][1]
        value = _read_block(r, knode, _join(path, key), key)
        if vals[block_key] % value:
            raise r.error(
                knode,
                _join(path, key),
                f"{key} must divide {block_key} ({vals[block_key]}): a tile is cut "
                f"into whole compute blocks, got {value}",
            )
        vals[key] = value
    if "align" in e:
        vals["align"] = r.choice(e["align"][1], _join(path, "align"), ALIGN_MODES)
    tiling = Tiling(**vals)
    if tiling.compute_blocks > MAX_COMPUTE_BLOCKS:
        key = "compute_kv" if "compute_kv" in e else "compute_q"
        raise r.error(
            e[key][1],
            _join(path, key),
            f"at most {MAX_COMPUTE_BLOCKS} compute blocks per tile (their kinds take "
            f"2 bits each of one SMEM word), got {tiling.block_q // tiling.cq} x "
            f"{tiling.block_kv // tiling.ckv} = {tiling.compute_blocks}",
        )
    return tiling


def _read_gpu(r: _Reader, node: Node, path: str) -> GpuTiling | None:
    """The `gpu` section: sizes checked here; what fits a GPU's shared memory is checked by
    the deviceless compile of `svgen compile --target h100|h200` (svgen.gpu_aot)."""
    if _is_null(r, node, path):
        return None
    e = r.mapping(node, path, GPU_KEYS)
    vals = {}
    choices_of = {"block_q": GPU_BLOCKS, "block_kv": GPU_BLOCKS, "num_warps": GPU_WARPS}
    for key, choices in choices_of.items():
        if key in e:
            vals[key] = r.choice(e[key][1], _join(path, key), choices)
    if "num_stages" in e:
        vals["num_stages"] = r.integer(
            e["num_stages"][1], _join(path, "num_stages"), 1, GPU_MAX_STAGES, "GPU_MAX_STAGES"
        )
    return GpuTiling(**vals)


def _read_runtime(r: _Reader, node: Node, path: str, geometry: TokenLayout) -> Runtime:
    """The `runtime` section: which run-time inputs the module takes (booleans), and the
    KV-cache chunks (`kv_cache: {chunk_frames: C}`)."""
    if _is_null(r, node, path):
        return Runtime()
    e = r.mapping(node, path, RUNTIME_KEYS)
    vals: dict[str, Any] = {}
    for key in ("segments", "text_lengths", "per_video_frames"):
        if key not in e:
            continue
        vnode = e[key][1]
        value = r.scalar(vnode, _join(path, key)) if isinstance(vnode, ScalarNode) else _MISSING
        if not isinstance(value, bool):
            raise r.error(
                vnode, _join(path, key), f"must be true or false, got {r.describe(vnode)}"
            )
        vals[key] = value
    if "per_video_frames" in e:
        key_path = _join(path, "per_video_frames")
        vals["frames_where"] = r.location(e["per_video_frames"][1], key_path)
    if "kv_cache" in e:
        vals.update(_read_kv_cache(r, e["kv_cache"][1], _join(path, "kv_cache"), geometry))
    runtime = Runtime(**vals)
    if runtime.per_video_frames and not runtime.segments:
        raise r.error(
            e["per_video_frames"][1],
            _join(path, "per_video_frames"),
            "needs `segments: true`: frames are numbered per video segment",
        )
    if runtime.text_lengths and geometry.text_tokens == 0:
        raise r.error(
            e["text_lengths"][1],
            _join(path, "text_lengths"),
            "needs text tokens: the geometry has none (geometry.text_tokens)",
        )
    if runtime.kv_cache and runtime.any:
        key = "segments" if runtime.segments else "text_lengths"
        raise r.error(
            e[key][1],
            _join(path, key),
            "cannot be combined with kv_cache yet: a chunked call takes no segment ids or "
            "text lengths",
        )
    return runtime


def _read_select(r: _Reader, node: Node, path: str, masks: "_MaskReader") -> Select:
    """select: {candidate: <mask>, top_k: {k, min, max} | top_p: {p, min, max}}."""
    e = r.mapping(node, path, SELECT_KEYS)
    r.require(node, path, e, ("candidate",))
    rules = [key for key in ("top_k", "top_p") if key in e]
    if len(rules) != 1:
        at = e[rules[1]][0] if rules else node
        raise r.error(at, path, "give exactly one of top_k and top_p")
    rule = rules[0]
    candidate = masks.read_mask(e["candidate"][1], _join(path, "candidate"))
    rpath = _join(path, rule)
    amount_key = "k" if rule == "top_k" else "p"
    rnode = e[rule][1]
    v = r.mapping(rnode, rpath, TOP_K_KEYS if rule == "top_k" else TOP_P_KEYS)
    r.require(rnode, rpath, v, (amount_key, "max"))
    limit = f"MAX_SELECT_BLOCKS, {MAX_SELECT_BLOCKS}"
    most = r.integer(v["max"][1], _join(rpath, "max"), 1, MAX_SELECT_BLOCKS, limit)
    least = 0
    if "min" in v:
        least = r.integer(v["min"][1], _join(rpath, "min"), 0, most, f"{rpath}.max")
    anode, apath = v[amount_key][1], _join(rpath, amount_key)
    if rule == "top_k":
        default = float(r.integer(anode, apath, 0, most, f"{rpath}.max"))
    else:
        value = r.scalar(anode, apath) if isinstance(anode, ScalarNode) else _MISSING
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not 0.0 <= float(value) <= 1.0:
            raise r.error(anode, apath, f"must be a number in 0 .. 1, got {r.describe(anode)}")
        default = float(value)
    sampled = 0
    if "sampled_rows" in e:
        limit = f"MAX_SAMPLED_ROWS, {MAX_SAMPLED_ROWS}"
        sampled = r.integer(
            e["sampled_rows"][1], _join(path, "sampled_rows"), 1, MAX_SAMPLED_ROWS, limit
        )
    return Select(candidate, rule, default, least, most, r.location(node, path), sampled)


def _check_select(r: _Reader, node: Node, heads, runtime: Runtime) -> None:
    """What a select policy does not combine with yet."""
    if heads is not None:
        raise r.error(node, "select", "needs one pattern for every head (mask:), not heads: yet")
    if runtime.any or runtime.kv_cache:
        raise r.error(
            node,
            "select",
            "cannot be combined with runtime: (segments, text_lengths, kv_cache) yet",
        )


def _read_kv_cache(r: _Reader, node: Node, path: str, geometry: TokenLayout) -> dict:
    """kv_cache: {chunk_frames: C, window_frames: W, sink_frames: S}: C divides the
    geometry's frames (the longest video, in chunks of C frames), and the tokens are video
    only (text belongs to cross-attention). W (optional): a rolling cache of S sink frames
    (default 0) and a ring of W >= C frames, S + W at most the video's frames."""
    e = r.mapping(node, path, KV_CACHE_KEYS, what="a mapping {chunk_frames: C}")
    r.require(node, path, e, ("chunk_frames",))
    cpath = _join(path, "chunk_frames")
    chunk = r.integer(e["chunk_frames"][1], cpath, 1, geometry.frames, "geometry.frames")
    if geometry.frames % chunk:
        raise r.error(
            e["chunk_frames"][1],
            cpath,
            f"must divide geometry.frames ({geometry.frames}): the video is generated in "
            f"chunks of {chunk} frames, got a last chunk of {geometry.frames % chunk}",
        )
    if geometry.text_tokens:
        raise r.error(
            node,
            path,
            "needs a video-only geometry (geometry.text_tokens is "
            f"{geometry.text_tokens}): the chunks and the cache are frames; attend text "
            "in a cross-attention of its own",
        )
    out = {"chunk_frames": chunk, "where": r.location(node, path)}
    if "sink_frames" in e and "window_frames" not in e:
        raise r.error(
            e["sink_frames"][1],
            _join(path, "sink_frames"),
            "needs window_frames: sink frames belong to a rolling cache (sink_frames plus a "
            "ring of window_frames)",
        )
    if "window_frames" in e:
        spath = _join(path, "sink_frames")
        sink = 0
        if "sink_frames" in e:
            sink = r.integer(
                e["sink_frames"][1],
                spath,
                0,
                geometry.frames - chunk,
                "geometry.frames - chunk_frames",
            )
        wpath = _join(path, "window_frames")
        window = r.integer(
            e["window_frames"][1], wpath, 1, geometry.frames - sink, "geometry.frames - sink_frames"
        )
        if window < chunk:
            raise r.error(
                e["window_frames"][1],
                wpath,
                f"must be at least chunk_frames ({chunk}): the ring holds the chunk being "
                f"generated, got {window}",
            )
        out.update(sink_frames=sink, window_frames=window)
    return out


def _check_kv_cache_layouts(r: _Reader, node: Node, layout, heads) -> None:
    """Chunked calls read the chunk's frames as one run of tokens: frame-major layouts only."""
    layouts = [("layout", layout)]
    if heads is not None:
        layouts += [
            (f"heads.candidates[{i}].layout", c.layout) for i, c in enumerate(heads.candidates)
        ]
    for key, order in layouts:
        if order != FRAME_MAJOR:
            raise r.error(
                node,
                "runtime.kv_cache",
                f"needs frame_major layouts, but {key} is {_layout_words(order)}: a chunk of "
                "frames must be one run of tokens",
            )


def _check_chunk_grain(
    r: _Reader, node: Node, geometry: TokenLayout, tiling: Tiling, runtime: Runtime, patterns: int
) -> None:
    """The chunks' tables come from one classification of the sequence in row blocks of
    gcd(compute_q, chunk tokens) (svgen.analysis.chunks): its grid must fit MAX_TILE_PAIRS,
    as the full sequence's does, before any of it is allocated. A rolling cache's come from
    every row against the cache's key pieces (its compute kv blocks, cut at the ring's two
    edges): rows x pieces must fit it too."""
    rows = runtime.chunk_frames * geometry.tokens_per_frame
    if runtime.rolling:
        cache = runtime.cache_frames(geometry.frames) * geometry.tokens_per_frame
        need = geometry.seq_len * (-(-cache // tiling.ckv) + 2) * patterns
        if need > MAX_TILE_PAIRS:
            raise r.error(
                node,
                "runtime.kv_cache",
                f"classifying every chunk position of the rolling cache ({cache:,} keys in "
                f"compute blocks of {tiling.ckv}) takes {need:,} row-block pairs, more than "
                f"{MAX_TILE_PAIRS:,} (MAX_TILE_PAIRS); use a larger compute_kv or a smaller "
                "window_frames",
            )
        return
    grain = math.gcd(tiling.cq, rows)
    need = -(-geometry.seq_len // grain) * -(-geometry.seq_len // tiling.ckv) * patterns
    if need > MAX_TILE_PAIRS:
        raise r.error(
            node,
            "runtime.kv_cache",
            f"chunks of {rows:,} tokens start {grain} row(s) apart from the compute_q of "
            f"{tiling.cq} (their gcd): classifying every chunk position takes "
            f"{need:,} block pairs, more than {MAX_TILE_PAIRS:,} (MAX_TILE_PAIRS); choose "
            "chunk_frames or compute_q so that chunk_frames x height x width shares a larger "
            "power of two with compute_q",
        )


def _layout_words(order) -> str:
    if isinstance(order, Tiled):
        return f"tiled {order.frames}x{order.rows}x{order.cols}"
    return str(order)


def _read_layout(r: _Reader, node: Node, path: str, geometry: TokenLayout) -> str | Tiled:
    """A layout: a name of LAYOUTS, or {tiled: {frames, rows, cols}} with a cube of positive
    sizes, each at most the geometry's frames, height and width."""
    if not isinstance(node, MappingNode):
        if isinstance(node, ScalarNode) and r.scalar(node, path) == TILED:
            raise r.error(
                node, path, "tiled needs its cube: write {tiled: {frames: A, rows: B, cols: C}}"
            )
        return r.choice(node, path, LAYOUTS)
    entries = r.mapping(node, path, LAYOUT_KEYS)
    r.require(node, path, entries, LAYOUT_KEYS)
    tpath, tnode = _join(path, TILED), entries[TILED][1]
    cube = r.mapping(tnode, tpath, TILED_KEYS, what="a mapping {frames: A, rows: B, cols: C}")
    r.require(tnode, tpath, cube, TILED_KEYS)
    extents = {"frames": "frames", "rows": "height", "cols": "width"}
    sizes = {
        key: r.integer(
            cube[key][1],
            _join(tpath, key),
            1,
            getattr(geometry, extents[key]),
            f"geometry.{extents[key]}: a cube fits in the video",
        )
        for key in TILED_KEYS
    }
    return Tiled(**sizes)


def _read_heads(
    r: _Reader,
    node: Node,
    path: str,
    patterns: tuple[str, ...],
    layout: str | Tiled,
    heads: int,
    geometry: TokenLayout,
) -> HeadPatterns:
    """The ``heads`` section; ``patterns`` are the defined pattern names, ``layout`` the default."""
    e = r.mapping(node, path, HEADS_KEYS)
    r.require(node, path, e, HEADS_KEYS)

    cpath = _join(path, "candidates")
    cnode = e["candidates"][1]
    if not isinstance(cnode, SequenceNode) or not cnode.value:
        raise r.error(
            cnode,
            cpath,
            f"must be a non-empty list of candidates "
            f"({{pattern: NAME, layout: LAYOUT}}), got {r.describe(cnode)}",
        )
    candidates: list[Candidate] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(cnode.value):
        ipath = f"{cpath}[{i}]"
        entries = r.mapping(
            item, ipath, CANDIDATE_KEYS, what="a mapping with a 'pattern' and an optional 'layout'"
        )
        r.require(item, ipath, entries, ("pattern",))
        pnode = entries["pattern"][1]
        ppath = _join(ipath, "pattern")
        pname = r.name(pnode, ppath, "a pattern name")
        if pname not in patterns:
            known = (
                f"known patterns: {', '.join(patterns)}"
                if patterns
                else "no patterns are defined (define them under 'patterns')"
            )
            raise r.error(pnode, ppath, f"unknown pattern '{pname}'; {known}")
        if pname in seen:
            raise r.error(
                pnode,
                ppath,
                f"pattern '{pname}' is already a candidate ({seen[pname]}); "
                f"each pattern may be a candidate only once",
            )
        seen[pname] = ipath
        clayout = layout
        if "layout" in entries:
            clayout = _read_layout(r, entries["layout"][1], _join(ipath, "layout"), geometry)
        candidates.append(Candidate(pname, clayout, r.location(item, ipath)))

    apath = _join(path, "assign")
    anode = e["assign"][1]
    names = tuple(c.pattern for c in candidates)
    if isinstance(anode, ScalarNode) and r.scalar(anode, apath) == "runtime":
        return HeadPatterns(tuple(candidates), None)
    if not isinstance(anode, SequenceNode):
        raise r.error(
            anode,
            apath,
            f"must be 'runtime' or a list of candidate pattern names, one per "
            f"head, got {r.describe(anode)}",
        )
    if len(anode.value) != heads:
        raise r.error(
            anode,
            apath,
            f"must name one candidate pattern per head: attention.heads is "
            f"{heads}, got {len(anode.value)} {'entry' if len(anode.value) == 1 else 'entries'}",
        )
    assign: list[str] = []
    for i, item in enumerate(anode.value):
        ipath = f"{apath}[{i}]"
        aname = r.name(item, ipath, "a candidate pattern name")
        if aname not in names:
            raise r.error(
                item, ipath, f"'{aname}' is not a candidate; candidates: {', '.join(names)}"
            )
        assign.append(aname)
    return HeadPatterns(tuple(candidates), tuple(assign))


# ----------------------------------------------------------------------------- masks


def _is_null(r: _Reader, node: Node, path: str | None = None) -> bool:
    return isinstance(node, ScalarNode) and r.scalar(node, path) is None


def _expr_error_position(
    r: _Reader, node: ScalarNode, value: str, offset: int
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


class _MaskReader:
    """Reads masks, bounding each one's size as it is written (before any expr is handed to
    sympy) and, once every pattern is read, its size and depth with refs expanded."""

    def __init__(self, r: _Reader):
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
        keys = [_key_text(k.value) if isinstance(k, ScalarNode) else "?" for k, _ in node.value]
        if len(keys) != 1:
            listed = f": {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}" if keys else ""
            raise r.error(node, path, f"a mask has exactly one key, got {len(keys)}{listed}")
        knode, vnode = node.value[0]
        if not isinstance(knode, ScalarNode):
            raise r.error(
                knode, path, f"a mask key must be a primitive name, got {r.describe(knode)}"
            )
        op = knode.value
        op_path = _join(path, _key_text(op))
        primitive = primitives.get(op)
        if primitive is None:
            raise r.error(
                knode,
                op_path,
                f"unknown mask primitive '{_key_text(op)}'; allowed: "
                f"{', '.join(primitives.keys())}",
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
            if _is_null(r, vnode, op_path):
                return MaskTerm(op, (), (), where)
            if not isinstance(vnode, MappingNode):
                raise r.error(
                    vnode,
                    op_path,
                    f"must be an empty mapping {{}} or null, got {r.describe(vnode)}",
                )
            r.mapping(vnode, op_path, (), allowed_note=f"'{op}' takes no parameters")
            return MaskTerm(op, (), (), where)
        if _is_null(r, vnode, op_path):
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
            p.name: _param_value(r, p, entries[p.name][1], _join(op_path, p.name))
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


def _param_value(r: _Reader, param: primitives.Param, node: Node, path: str) -> int | float:
    """One parameter's value, checked against its kind and range before anything uses it."""
    if param.kind == primitives.INTEGER:
        return r.integer(node, path, param.minimum, param.maximum, param.limit)
    assert param.kind == primitives.FRACTION, param.kind
    must = f"must be a number with 0 < {param.name} <= 1"
    value = r.scalar(node, path) if isinstance(node, ScalarNode) else _MISSING
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


# ----------------------------------------------------------------------------- entry points


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing nodes only, refusing what would blow up later.

    PyYAML's composer recurses once per nesting level, so the depth is checked before each
    level is entered. Aliases make shared nodes, cheap to compose but walked once per use
    by everything after: each node's expanded size (how many nodes it stands for once every
    alias is written out) is computed from its children's, each shared node once, and
    refused past MAX_YAML_NODES before anything walks it. The key path of the node being
    composed is kept for the messages.
    """

    def __init__(self, text: str, source: str):
        super().__init__(text)
        self.source = source
        self._path: list[str] = []
        self._expanded: dict[int, int] = {}  # id(node) -> nodes once aliases are expanded

    def _error(self, mark, message: str) -> SpecError:
        return SpecError(
            message,
            file=self.source,
            line=mark.line + 1,
            column=mark.column + 1,
            key=_short_path(self._path) or None,
        )

    def compose_node(self, parent, index):
        self._path.append(_segment(parent, index))
        try:
            if self.check_event(yaml.AliasEvent):
                return self._alias(parent, index)
            if len(self._path) > MAX_YAML_DEPTH:
                raise self._error(
                    self.peek_event().start_mark,
                    f"YAML nested more than {MAX_YAML_DEPTH} deep (MAX_YAML_DEPTH)",
                )
            node = super().compose_node(parent, index)
            self._count(node)
            return node
        finally:
            self._path.pop()

    def _alias(self, parent, index) -> Node:
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)
        if id(node) not in self._expanded:  # still being composed: it contains itself
            raise self._error(mark, "a YAML alias refers to a node that contains it")
        return node

    def _count(self, node: Node) -> None:
        size = 1
        if isinstance(node, SequenceNode):
            size += sum(self._expanded[id(item)] for item in node.value)
        elif isinstance(node, MappingNode):
            size += sum(self._expanded[id(k)] + self._expanded[id(v)] for k, v in node.value)
        if size > MAX_YAML_NODES:
            raise self._error(
                node.start_mark,
                f"this value is more than {MAX_YAML_NODES:,} YAML "
                f"nodes, aliases expanded (MAX_YAML_NODES)",
            )
        self._expanded[id(node)] = size


def _segment(parent, index) -> str:
    """The key-path part of the node PyYAML composes as child ``index`` of ``parent``."""
    if isinstance(index, int):
        return f"[{index}]"
    if isinstance(index, ScalarNode):  # a mapping value; its key node
        return (
            index.value if len(index.value) <= MAX_NAME_LEN else index.value[:MAX_NAME_LEN] + "..."
        )
    return ""  # the document, or a mapping key (its path is the mapping's)


def _short_path(parts: list[str]) -> str:
    """``mask.any_of[0].not``; past 8 parts, the first 4 and last 3 around ``...``."""
    names = [p if p.startswith("[") else f".{p}" for p in parts if p]
    if len(names) > 8:
        names = names[:4] + ["..."] + names[-3:]
    return "".join(names).lstrip(".")


def _compose(text: str, source: str) -> Node | None:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(
            f"the spec is {len(text):,} characters long, more than the "
            f"{MAX_SPEC_BYTES:,} of MAX_SPEC_BYTES",
            file=source,
        )
    loader = None
    try:
        # The reader refuses control characters (even in a comment) while the loader is
        # built: inside the try, so that they are a located error, not a traceback.
        loader = _BoundedLoader(text, source)
        return loader.get_single_node()
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise SpecError(
            f"YAML syntax error: special character U+{exc.character:04X} is not allowed in "
            f"YAML, not even in a comment (in a double-quoted string, write it as an escape)",
            file=source,
            line=line,
            column=column,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "invalid YAML"
        message = f"YAML syntax error: {problem}"
        if exc.context:
            message += f" ({exc.context})"
        if mark is None:
            raise SpecError(message, file=source) from None
        raise SpecError(message, file=source, line=mark.line + 1, column=mark.column + 1) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML syntax error: {exc}", file=source) from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_spec(text: str, *, source: str = "<string>") -> Spec:
    """Parse and validate a spec from YAML text; ``source`` names it in errors."""
    source = str(source)
    root = _compose(text, source)
    if root is None:
        raise SpecError(
            f"the spec is empty; expected a mapping with keys {', '.join(TOP_KEYS)}", file=source
        )
    r = _Reader(text, source)
    top = r.mapping(root, "", TOP_KEYS, what="a mapping at the top level")

    if "svgen" not in top:
        raise r.error(
            root, None, "missing required key 'svgen' (the spec format version; write 'svgen: 1')"
        )
    vnode = top["svgen"][1]
    version = r.scalar(vnode, "svgen") if isinstance(vnode, ScalarNode) else _MISSING
    if isinstance(version, bool) or version != SPEC_VERSION or not isinstance(version, int):
        got = (
            _show_int(version)
            if isinstance(version, int) and not isinstance(version, bool)
            else r.describe(vnode)
        )
        raise r.error(
            vnode,
            "svgen",
            f"must be {SPEC_VERSION} (the only spec format version this svgen "
            f"understands), got {got}",
        )
    r.require(root, "", top, ("name", "geometry", "attention"))
    if "mask" in top and "heads" in top:
        raise r.error(
            top["heads"][0],
            "heads",
            "give either mask (one pattern for every head) or heads (patterns per head), not both",
        )
    if "mask" not in top and "heads" not in top:
        raise r.error(root, None, "missing required key 'mask' (or 'heads')")

    name = r.unreserved(
        top["name"][1],
        "name",
        r.name(top["name"][1], "name", "a spec name"),
        "a spec name becomes the generated module's file name",
    )
    geometry = _read_geometry(r, top["geometry"][1], "geometry")
    attention = _read_attention(r, top["attention"][1], "attention")
    layout = FRAME_MAJOR
    if "layout" in top:
        layout = _read_layout(r, top["layout"][1], "layout", geometry)
    masks = _MaskReader(r)
    mask = masks.read_mask(top["mask"][1], "mask") if "mask" in top else None

    patterns: list[tuple[str, MaskTerm]] = []
    if "patterns" in top and not _is_null(r, top["patterns"][1], "patterns"):
        pnode = top["patterns"][1]
        if not isinstance(pnode, MappingNode):
            raise r.error(
                pnode,
                "patterns",
                f"must be a mapping from pattern names to masks, got {r.describe(pnode)}",
            )
        seen: dict[str, Node] = {}
        for knode, vnode in pnode.value:
            if not isinstance(knode, ScalarNode):
                raise r.error(
                    knode, "patterns", f"pattern names must be plain names, got {r.describe(knode)}"
                )
            pname = knode.value
            ppath = f"patterns.{_key_text(pname)}"
            if pname in seen:
                first = seen[pname].start_mark.line + 1
                raise r.error(
                    knode, ppath, f"duplicate key '{pname}' (first given on line {first})"
                )
            if not NAME_RE.match(pname) or len(pname) > MAX_NAME_LEN:
                raise r.error(
                    knode,
                    ppath,
                    f"pattern name must match {NAME_PATTERN} and be at most "
                    f"{MAX_NAME_LEN} characters, got {_abbreviate(pname)}",
                )
            r.unreserved(knode, ppath, pname, "pattern names become names in the generated module")
            if len(patterns) == MAX_PATTERNS:
                raise r.error(knode, ppath, f"more than {MAX_PATTERNS} patterns (MAX_PATTERNS)")
            seen[pname] = knode
            patterns.append((pname, masks.read_mask(vnode, ppath)))
    patterns.sort(key=lambda item: item[0])
    masks.check_expanded(mask, patterns)

    heads = None
    if "heads" in top:
        heads = _read_heads(
            r,
            top["heads"][1],
            "heads",
            tuple(n for n, _ in patterns),
            layout,
            attention.heads,
            geometry,
        )

    tiling = Tiling(DEFAULT_BLOCK, DEFAULT_BLOCK)
    if "tiling" in top:
        tiling = _read_tiling(r, top["tiling"][1], "tiling")
    _check_tile_grid(
        r,
        (top.get("tiling") or top["geometry"])[1],
        "tiling",
        geometry,
        tiling,
        len(heads.candidates) if heads is not None else 1,
    )

    gpu = _read_gpu(r, top["gpu"][1], "gpu") if "gpu" in top else None
    runtime = Runtime()
    if "runtime" in top:
        runtime = _read_runtime(r, top["runtime"][1], "runtime", geometry)
        if runtime.kv_cache:
            _check_kv_cache_layouts(r, top["runtime"][1], layout, heads)
            _check_chunk_grain(
                r, top["runtime"][1], geometry, tiling, runtime,
                len(heads.candidates) if heads is not None else 1,
            )  # fmt: skip
            if tiling.aligned:
                raise r.error(
                    top["runtime"][1],
                    "runtime.kv_cache",
                    f"needs tiling.align: exact (got {tiling.align}): the chunks' tiles are "
                    "not the full sequence's, so they would round other blocks",
                )

    select = None
    if "select" in top:
        select = _read_select(r, top["select"][1], "select", masks)
        masks.check_expanded(select.candidate, patterns)
        _check_select(r, top["select"][0], heads, runtime)

    pats = tuple(patterns)
    canonical = _canonical_obj(name, geometry, attention, layout, mask, pats, heads, tiling)
    canonical = _with_select(_with_runtime(_with_gpu(canonical, gpu), runtime), select)
    digest = hashlib.sha256(_dumps(canonical).encode("utf-8")).hexdigest()
    return Spec(
        name=name,
        geometry=geometry,
        attention=attention,
        layout=layout,
        mask=mask,
        patterns=pats,
        heads=heads,
        tiling=tiling,
        source=source,
        digest=digest,
        gpu=gpu,
        runtime=runtime,
        select=select,
    )


def load_spec(path: str | os.PathLike) -> Spec:
    """Read and parse the spec file at ``path``."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            raw = fh.read(MAX_SPEC_BYTES + 1)  # never more: the file may be endless
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SpecError(f"cannot read the spec file: {reason}", file=source) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"the spec file is larger than the {MAX_SPEC_BYTES:,} bytes of MAX_SPEC_BYTES",
            file=source,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"the spec file is not valid UTF-8 (byte {exc.start})", file=source
        ) from None
    return parse_spec(text, source=source)
