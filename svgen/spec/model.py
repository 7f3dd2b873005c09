"""The spec as frozen dataclasses (what every later stage reads), and the constants of the
spec language: names, layouts, dtypes, block sizes.
"""

from __future__ import annotations

import builtins
import keyword
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Iterator


from svgen.spec import primitives
from svgen.core.layout import (
    AxisOrder,
    Curve,
    FRAME_MAJOR,
    ComputeBlocks,
    TEMPORAL_MAJOR,
    Tiled,
    TokenLayout,
)


NAME_PATTERN = "[a-z][a-z0-9_]*"
NAME_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
SPEC_VERSION = 1
LAYOUTS = (FRAME_MAJOR, TEMPORAL_MAJOR)  # the `layout:` names; tiled is {tiled: {...}}
DTYPES = ("bfloat16", "float32")
#: attention.softmax: the online softmax (a running row max), or a bound of each q tile's
#: scores from the norms of q and k where it is small enough, online elsewhere
#: (svgen.runtime.softmax).
SOFTMAX_MODES = ("online", "bounded")
#: attention.qk: how the kernel computes QK^T. "dtype", in the spec's dtype; "int8", q and
#: k (k smoothed by its mean over the keys) quantized to int8 per compute block, multiplied
#: int8 x int8 -> int32 and rescaled (svgen.runtime.quantize); P·V stays in the dtype.
QK_MODES = ("dtype", "int8")
HEAD_DIMS = (64, 128, 256)
#: How `tiling.align` rounds the mask to whole compute blocks (svgen.analysis.align says how
#: each mode decides); "exact" keeps the mask as written.
ALIGN_MODES = ("exact", "superset", "subset", "nearest", "balanced")
#: The TPU chips a spec may give a tiling of their own (`tiling: {v5e: {...}}`): the names
#: of svgen.analysis.targets.TARGETS, in its order (a test keeps them equal; the spec reader
#: imports no later stage).
TPU_CHIPS = ("v5e", "v6e", "v7x")
BLOCK_MULTIPLE = 128
BLOCK_MIN = 128
BLOCK_MAX = 8192
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
    qk: str = "dtype"  # one of QK_MODES
    # Where `qk` was written (None: not written), for errors a later stage raises about it.
    qk_where: Location | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class Tiling(ComputeBlocks):
    """Tiles (what one grid step brings into VMEM) and the compute blocks inside them (what
    one matmul pair works on; None: the whole tile; `cq`, `ckv`: ComputeBlocks)."""

    block_q: int
    block_kv: int
    compute_q: int | None = None
    compute_kv: int | None = None
    align: str = "exact"  # one of ALIGN_MODES: BOUNDARY compute blocks rounded to FULL/EMPTY

    @property
    def aligned(self) -> bool:
        return self.align != "exact"


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
    the mass p), each clamped to [min_blocks, max_blocks] per row. max_blocks None: the
    spec gave no `max`, and the candidate bounds the selection (svgen.analysis.plan's
    Plan.select_max_blocks resolves it)."""

    candidate: MaskTerm
    rule: str
    default: float
    min_blocks: int
    max_blocks: int | None
    where: Location | None = field(default=None, compare=False, hash=False)
    # Block scores from this many sampled query rows per compute block row (their attention
    # mass per block); 0: mean pooling of q and k (svgen.runtime.select).
    sampled_rows: int = 0
    # With heads of several patterns: the patterns whose heads choose otherwise
    # (`select.patterns.<name>`), by name, in the order of heads.candidates.
    patterns: tuple["PatternSelect", ...] = ()

    def own(self, name: str) -> "PatternSelect | None":
        """Pattern `name`'s entry of `select.patterns`, or None when it has none."""
        return next((own for own in self.patterns if own.pattern == name), None)

    def for_pattern(self, name: str) -> "Select":
        """The policy a head of pattern `name` follows: the section's own, with that
        pattern's candidate and amounts where `select.patterns` gives them."""
        own = self.own(name)
        if own is None:
            return replace(self, patterns=())
        return replace(
            self,
            candidate=own.candidate,
            default=own.default,
            min_blocks=own.min_blocks,
            max_blocks=own.max_blocks,
            where=own.where or self.where,
            patterns=(),
        )


@dataclass(frozen=True)
class PatternSelect:
    """One entry of `select.patterns`: the candidate region and amounts of the heads of one
    pattern (the rule and the scores are every head's: one call argument, one scoring).
    What the entry leaves out is the section's own, already filled in here."""

    pattern: str
    candidate: MaskTerm
    default: float
    min_blocks: int
    max_blocks: int | None
    where: Location | None = field(default=None, compare=False, hash=False)


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
    # a name of LAYOUTS, a tiled cube, an axis order or a curve; the spec's layout when not
    # given
    layout: str | Tiled | AxisOrder | Curve
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
    # a name of LAYOUTS, a tiled cube, an axis order or a curve; the default of head candidates
    layout: str | Tiled | AxisOrder | Curve
    mask: MaskTerm | None  # one pattern for every head; None when ``heads`` is given
    patterns: tuple[tuple[str, MaskTerm], ...]  # sorted by name
    heads: HeadPatterns | None  # patterns per head; None when ``mask`` is given
    tiling: Tiling  # the tiling in effect: the chip's own (tiling.<chip>) or the plain one
    source: str  # the path string as given
    digest: str  # sha256 hex of canonical_json(spec)
    gpu: GpuTiling | None = None  # the `gpu` section; None: not given (GpuTiling's defaults)
    runtime: Runtime = Runtime()  # the `runtime` section (all False: not given)
    select: Select | None = None  # the `select` section; None: a static mask
    # The chips' own tilings (tiling.<chip>), in TPU_CHIPS order, each with the plain align;
    # (): the spec names no chip.
    tilings: tuple[tuple[str, Tiling], ...] = ()
    # The chip whose own tiling `tiling` is (the spec was read for that chip and names it);
    # None: `tiling` is the plain keys' (the tiling of every chip not named).
    tiling_chip: str | None = None
    # The plain keys' tiling when `tiling` is a chip's own; None: it is `tiling`.
    plain_tiling: Tiling | None = None
    # False: the spec has no `tiling` section (the compiler may pick one for a chip it has
    # measured: svgen.chip.program_size.chip_free). Not part of the digest.
    tiling_given: bool = True

    @property
    def gpu_tiling(self) -> GpuTiling:
        return self.gpu or GpuTiling()

    def tiling_for(self, chip: str | None) -> Tiling:
        """The tiling the spec gives ``chip``: its own (tiling.<chip>) if the spec names it,
        else the plain keys' (None: the plain keys')."""
        for name, tiling in self.tilings:
            if name == chip:
                return tiling
        return self.tiling if self.plain_tiling is None else self.plain_tiling

    def tiling_source(self, chip: str | None) -> str:
        """Where ``chip``'s tiling is written: ``tiling.<chip>`` or ``tiling`` (the plain keys)."""
        return f"tiling.{chip}" if chip in dict(self.tilings) else "tiling"

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
