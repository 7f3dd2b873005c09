"""The spec's sections other than masks: geometry, attention, tiling, gpu, runtime (with
kv_cache), select, layout and heads, each read and checked against the others.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from svgen.spec.limits import (
    MAX_HEADS,
    MAX_SEQ_LEN,
    MAX_TILE_PAIRS,
)
from svgen.core.curves import CURVE_SCOPES, CURVES, FRAME
from svgen.core.layout import (
    AXES,
    AxisOrder,
    Curve,
    FRAME_MAJOR,
    TEXT_POSITIONS,
    TILED,
    Tiled,
    TokenLayout,
)
from svgen.spec.masks import MaskReader, is_null
from svgen.spec.model import (
    ALIGN_MODES,
    Attention,
    BLOCK_MAX,
    BLOCK_MIN,
    BLOCK_MULTIPLE,
    Candidate,
    DEFAULT_BLOCK,
    DTYPES,
    GpuTiling,
    HEAD_DIMS,
    HeadPatterns,
    LAYOUTS,
    Runtime,
    SOFTMAX_MODES,
    QK_MODES,
    PatternSelect,
    Select,
    TPU_CHIPS,
    Tiling,
)
from svgen.spec.nodes import MISSING, Reader, join_path, show_int

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
SELECT_KEYS = ("candidate", "top_k", "top_p", "sampled_rows", "patterns")
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
ATTENTION_KEYS = ("heads", "head_dim", "dtype", "softmax", "qk")
ATTENTION_REQUIRED = ("heads", "head_dim", "dtype")
TILING_KEYS = ("block_q", "block_kv", "compute_q", "compute_kv", "align")
#: The keys of a chip's own tiling (`tiling: {v5e: {...}}`): align is every chip's (it
#: changes the mask, which must not depend on the chip).
CHIP_TILING_KEYS = ("block_q", "block_kv", "compute_q", "compute_kv")
MAX_COMPUTE_BLOCKS = 16  # per tile: their kinds fit one int32 of SMEM (2 bits each)
HEADS_KEYS = ("candidates", "assign")
GPU_KEYS = ("block_q", "block_kv", "num_warps", "num_stages")
#: Triton tiles: powers of two (tensor shapes), at least 16 (tl.dot's smallest operand).
GPU_BLOCKS = (16, 32, 64, 128, 256)
GPU_WARPS = (1, 2, 4, 8, 16)
GPU_MAX_STAGES = 8
CANDIDATE_KEYS = ("pattern", "layout")
# The mapping form of `layout:`: exactly one of the first three (`over` goes with `curve`).
LAYOUT_KEYS = (TILED, "order", "curve", "over")
TILED_KEYS = ("frames", "rows", "cols")  # the cube, each at most the geometry's extent


def read_geometry(r: Reader, node: Node, path: str) -> TokenLayout:
    e = r.mapping(node, path, GEOMETRY_KEYS)
    r.require(node, path, e, ("frames", "height", "width"))
    sizes = {}
    for key, minimum in GEOMETRY_MINIMUMS.items():
        sizes[key] = 0
        if key in e:
            sizes[key] = r.integer(
                e[key][1], join_path(path, key), minimum, MAX_SEQ_LEN, _SEQ_LIMIT
            )
    text_position = "last"
    if "text_position" in e:
        text_position = r.choice(
            e["text_position"][1], join_path(path, "text_position"), TEXT_POSITIONS
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


def check_tile_grid(
    r: Reader, node: Node, path: str, geometry: TokenLayout, tiling: Tiling, patterns: int
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


def read_attention(r: Reader, node: Node, path: str) -> Attention:
    e = r.mapping(node, path, ATTENTION_KEYS, allowed_note=_ATTENTION_NOTE)
    r.require(node, path, e, ATTENTION_REQUIRED)
    heads = r.integer(e["heads"][1], join_path(path, "heads"), 1, MAX_HEADS, "MAX_HEADS")
    head_dim = r.choice(e["head_dim"][1], join_path(path, "head_dim"), HEAD_DIMS)
    dtype = r.choice(e["dtype"][1], join_path(path, "dtype"), DTYPES)
    softmax = SOFTMAX_MODES[0]
    if "softmax" in e:
        softmax = r.choice(e["softmax"][1], join_path(path, "softmax"), SOFTMAX_MODES)
    qk, qk_where = QK_MODES[0], None
    if "qk" in e:
        qk_node = e["qk"][1]
        qk = r.choice(qk_node, join_path(path, "qk"), QK_MODES)
        qk_where = r.location(qk_node, join_path(path, "qk"))
        if qk == "int8" and softmax == "bounded":
            raise r.error(
                qk_node,
                join_path(path, "qk"),
                "qk: int8 does not run with softmax: bounded yet (the bound is of the float "
                "scores); leave one of them out",
            )
    return Attention(heads, head_dim, dtype, softmax, qk, qk_where)


def _read_block(r: Reader, node: Node, path: str, key: str) -> int:
    value = r.scalar(node, path) if isinstance(node, ScalarNode) else MISSING
    ok = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value % BLOCK_MULTIPLE == 0
        and BLOCK_MIN <= value <= BLOCK_MAX
    )
    if not ok:
        got = (
            show_int(value)
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


def read_tiling(r: Reader, node: Node, path: str) -> Tiling:
    """The plain keys' tiling (the whole of a `tiling` that names no chip)."""
    return read_tilings(r, node, path)[0]


def read_tilings(r: Reader, node: Node, path: str) -> tuple[Tiling, tuple[tuple[str, Tiling], ...]]:
    """The plain keys' tiling (every chip not named), and each named chip's own
    (`tiling.<chip>`: block and compute sizes only, the plain align), in TPU_CHIPS order."""
    if is_null(r, node, path):
        return Tiling(DEFAULT_BLOCK, DEFAULT_BLOCK), ()
    e = r.mapping(node, path, TILING_KEYS + TPU_CHIPS)
    sizes = _tiling_sizes(r, e, path)
    align = "exact"
    if "align" in e:
        align = r.choice(e["align"][1], join_path(path, "align"), ALIGN_MODES)
    plain = _checked_tiling(r, e, path, Tiling(**sizes, align=align))
    chips = []
    for chip in TPU_CHIPS:
        if chip in e:
            chips.append((chip, _read_chip_tiling(r, e[chip][1], join_path(path, chip), align)))
    return plain, tuple(chips)


def _read_chip_tiling(r: Reader, node: Node, path: str, align: str) -> Tiling:
    """`tiling.<chip>`: a mapping of block and compute sizes (read_tiling's checks and
    defaults; none inherited from the plain keys), with the plain ``align``."""
    chip = path.rpartition(".")[2]
    what = f"a mapping {{block_q, block_kv, compute_q, compute_kv}} ({chip}'s own tiling)"
    if not isinstance(node, MappingNode):
        raise r.error(node, path, f"must be {what}, got {r.describe(node)}")
    for knode, _ in node.value:
        if isinstance(knode, ScalarNode) and knode.value == "align":
            raise r.error(
                knode,
                join_path(path, "align"),
                "align is set once for all chips, at tiling.align: it changes the mask, which "
                "must not depend on the chip",
            )
    e = r.mapping(node, path, CHIP_TILING_KEYS)
    return _checked_tiling(r, e, path, Tiling(**_tiling_sizes(r, e, path), align=align))


def _tiling_sizes(r: Reader, e: dict, path: str) -> dict[str, int]:
    """A tiling's block and compute sizes from its mapping's entries (defaults filled in)."""
    vals = {}
    for key in ("block_q", "block_kv"):
        vals[key] = (
            _read_block(r, e[key][1], join_path(path, key), key) if key in e else DEFAULT_BLOCK
        )
    for key, block_key in (("compute_q", "block_q"), ("compute_kv", "block_kv")):
        if key not in e:
            continue
        knode = e[key][1]
        value = _read_block(r, knode, join_path(path, key), key)
        if vals[block_key] % value:
            raise r.error(
                knode,
                join_path(path, key),
                f"{key} must divide {block_key} ({vals[block_key]}): a tile is cut "
                f"into whole compute blocks, got {value}",
            )
        vals[key] = value
    return vals


def _checked_tiling(r: Reader, e: dict, path: str, tiling: Tiling) -> Tiling:
    """``tiling``, refused past MAX_COMPUTE_BLOCKS compute blocks per tile."""
    if tiling.compute_blocks > MAX_COMPUTE_BLOCKS:
        key = "compute_kv" if "compute_kv" in e else "compute_q"
        raise r.error(
            e[key][1],
            join_path(path, key),
            f"at most {MAX_COMPUTE_BLOCKS} compute blocks per tile (their kinds take "
            f"2 bits each of one SMEM word), got {tiling.block_q // tiling.cq} x "
            f"{tiling.block_kv // tiling.ckv} = {tiling.compute_blocks}",
        )
    return tiling


def read_gpu(r: Reader, node: Node, path: str) -> GpuTiling | None:
    """The `gpu` section: sizes checked here; what fits a GPU's shared memory is checked by
    the deviceless compile of `svgen compile --target h100|h200` (svgen.gpu_aot)."""
    if is_null(r, node, path):
        return None
    e = r.mapping(node, path, GPU_KEYS)
    vals = {}
    choices_of = {"block_q": GPU_BLOCKS, "block_kv": GPU_BLOCKS, "num_warps": GPU_WARPS}
    for key, choices in choices_of.items():
        if key in e:
            vals[key] = r.choice(e[key][1], join_path(path, key), choices)
    if "num_stages" in e:
        vals["num_stages"] = r.integer(
            e["num_stages"][1], join_path(path, "num_stages"), 1, GPU_MAX_STAGES, "GPU_MAX_STAGES"
        )
    return GpuTiling(**vals)


def read_runtime(r: Reader, node: Node, path: str, geometry: TokenLayout) -> Runtime:
    """The `runtime` section: which run-time inputs the module takes (booleans), and the
    KV-cache chunks (`kv_cache: {chunk_frames: C}`)."""
    if is_null(r, node, path):
        return Runtime()
    e = r.mapping(node, path, RUNTIME_KEYS)
    vals: dict[str, Any] = {}
    for key in ("segments", "text_lengths", "per_video_frames"):
        if key not in e:
            continue
        vnode = e[key][1]
        value = r.scalar(vnode, join_path(path, key)) if isinstance(vnode, ScalarNode) else MISSING
        if not isinstance(value, bool):
            raise r.error(
                vnode, join_path(path, key), f"must be true or false, got {r.describe(vnode)}"
            )
        vals[key] = value
    if "per_video_frames" in e:
        key_path = join_path(path, "per_video_frames")
        vals["frames_where"] = r.location(e["per_video_frames"][1], key_path)
    if "kv_cache" in e:
        vals.update(_read_kv_cache(r, e["kv_cache"][1], join_path(path, "kv_cache"), geometry))
    runtime = Runtime(**vals)
    if runtime.per_video_frames and not runtime.segments:
        raise r.error(
            e["per_video_frames"][1],
            join_path(path, "per_video_frames"),
            "needs `segments: true`: frames are numbered per video segment",
        )
    if runtime.text_lengths and geometry.text_tokens == 0:
        raise r.error(
            e["text_lengths"][1],
            join_path(path, "text_lengths"),
            "needs text tokens: the geometry has none (geometry.text_tokens)",
        )
    if runtime.kv_cache and runtime.any:
        key = "segments" if runtime.segments else "text_lengths"
        raise r.error(
            e[key][1],
            join_path(path, key),
            "cannot be combined with kv_cache yet: a chunked call takes no segment ids or "
            "text lengths",
        )
    return runtime


def read_select(
    r: Reader, node: Node, path: str, masks: "MaskReader", heads: HeadPatterns | None
) -> Select:
    """select: {candidate: <mask>, top_k: {k, min, max} | top_p: {p, min, max},
    sampled_rows, patterns: {<pattern>: {candidate, top_k | top_p}}} (patterns: with heads)."""
    e = r.mapping(node, path, SELECT_KEYS)
    r.require(node, path, e, ("candidate",))
    rules = [key for key in ("top_k", "top_p") if key in e]
    if len(rules) != 1:
        at = e[rules[1]][0] if rules else node
        raise r.error(at, path, "give exactly one of top_k and top_p")
    rule = rules[0]
    candidate = masks.read_mask(e["candidate"][1], join_path(path, "candidate"))
    default, least, most = _read_amounts(r, e[rule][1], join_path(path, rule), rule)
    sampled = 0
    if "sampled_rows" in e:
        limit = f"MAX_SAMPLED_ROWS, {MAX_SAMPLED_ROWS}"
        sampled = r.integer(
            e["sampled_rows"][1], join_path(path, "sampled_rows"), 1, MAX_SAMPLED_ROWS, limit
        )
    select = Select(candidate, rule, default, least, most, r.location(node, path), sampled)
    if "patterns" in e:
        select = replace(
            select,
            patterns=_read_pattern_selects(
                r, e["patterns"], join_path(path, "patterns"), masks, heads, select
            ),
        )
    return select


def _read_pattern_selects(
    r: Reader,
    entry: tuple[Node, Node],
    path: str,
    masks: "MaskReader",
    heads: HeadPatterns | None,
    select: Select,
) -> tuple[PatternSelect, ...]:
    """select.patterns: {<pattern>: {candidate: <mask>, <the section's rule>: {...}}}: per
    pattern of heads.candidates, what its heads choose from and how many; what an entry
    leaves out is the section's (a rule's block is taken whole: k or p, min and max)."""
    knode, node = entry
    if heads is None:
        raise r.error(
            knode,
            path,
            "needs heads: (patterns per head); with one mask for every head, give the "
            "candidate and amounts in select itself",
        )
    names = tuple(c.pattern for c in heads.candidates)
    given = r.mapping(
        node,
        path,
        names,
        what="a mapping {<pattern>: {candidate, " + select.rule + "}}",
        allowed_note=f"the patterns of heads.candidates are: {', '.join(names)}",
    )
    if not given:
        raise r.error(node, path, "is empty: name at least one pattern of heads.candidates")
    other = "top_p" if select.rule == "top_k" else "top_k"
    out = []
    for name in names:  # heads.candidates' order: the generated module's
        if name not in given:
            continue
        epath = join_path(path, name)
        e = r.mapping(given[name][1], epath, ("candidate", "top_k", "top_p"))
        if other in e:
            raise r.error(
                e[other][0],
                join_path(epath, other),
                f"the rule is every head's (the call takes one {select.rule}= argument): "
                f"give {select.rule} here, as select does",
            )
        if not e:
            raise r.error(given[name][1], epath, f"is empty: give candidate or {select.rule}")
        candidate = select.candidate
        if "candidate" in e:
            candidate = masks.read_mask(e["candidate"][1], join_path(epath, "candidate"))
        amounts = (select.default, select.min_blocks, select.max_blocks)
        if select.rule in e:
            rpath = join_path(epath, select.rule)
            amounts = _read_amounts(r, e[select.rule][1], rpath, select.rule)
        out.append(PatternSelect(name, candidate, *amounts, r.location(given[name][1], epath)))
    return tuple(out)


def _read_amounts(r: Reader, node: Node, path: str, rule: str) -> tuple[float, int, int | None]:
    """top_k: {k, min, max} / top_p: {p, min, max} -> (k or p, min, max). Without `max`
    (None) the candidate bounds the selection (the analysis resolves it), so `k` and `min`
    are measured against MAX_SELECT_BLOCKS instead."""
    amount_key = "k" if rule == "top_k" else "p"
    v = r.mapping(node, path, TOP_K_KEYS if rule == "top_k" else TOP_P_KEYS)
    r.require(node, path, v, (amount_key,))
    most, bound = None, (MAX_SELECT_BLOCKS, f"MAX_SELECT_BLOCKS, {MAX_SELECT_BLOCKS}")
    if "max" in v:
        most = r.integer(v["max"][1], join_path(path, "max"), 1, *bound)
        bound = (most, f"{path}.max")
    least = 0
    if "min" in v:
        least = r.integer(v["min"][1], join_path(path, "min"), 0, *bound)
    anode, apath = v[amount_key][1], join_path(path, amount_key)
    if rule == "top_k":
        return float(r.integer(anode, apath, 0, *bound)), least, most
    value = r.scalar(anode, apath) if isinstance(anode, ScalarNode) else MISSING
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0.0 <= float(value) <= 1.0:
        raise r.error(anode, apath, f"must be a number in 0 .. 1, got {r.describe(anode)}")
    return float(value), least, most


def check_select(r: Reader, node: Node, heads, runtime: Runtime) -> None:
    """What a select policy does not combine with yet. With `heads:` each head chooses
    among its own pattern's blocks in its own layout (svgen.runtime.select.HeadSelections);
    with segments and text lengths a chosen block keeps the keys of its queries' segment."""
    for key, given, why in (
        ("kv_cache", runtime.kv_cache, "a chunked call chooses no blocks"),
        (
            "per_video_frames",
            runtime.per_video_frames,
            "its per-video tables have no chosen blocks",
        ),
    ):
        if given:
            raise r.error(
                node,
                "select",
                f"cannot be combined with runtime.{key} yet ({why}); segments and "
                "text_lengths are taken",
            )


def _read_kv_cache(r: Reader, node: Node, path: str, geometry: TokenLayout) -> dict:
    """kv_cache: {chunk_frames: C, window_frames: W, sink_frames: S}: C divides the
    geometry's frames (the longest video, in chunks of C frames), and the tokens are video
    only (text belongs to cross-attention). W (optional): a rolling cache of S sink frames
    (default 0) and a ring of W >= C frames, S + W at most the video's frames."""
    e = r.mapping(node, path, KV_CACHE_KEYS, what="a mapping {chunk_frames: C}")
    r.require(node, path, e, ("chunk_frames",))
    cpath = join_path(path, "chunk_frames")
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
            join_path(path, "sink_frames"),
            "needs window_frames: sink frames belong to a rolling cache (sink_frames plus a "
            "ring of window_frames)",
        )
    if "window_frames" in e:
        spath = join_path(path, "sink_frames")
        sink = 0
        if "sink_frames" in e:
            sink = r.integer(
                e["sink_frames"][1],
                spath,
                0,
                geometry.frames - chunk,
                "geometry.frames - chunk_frames",
            )
        wpath = join_path(path, "window_frames")
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


def check_kv_cache_layouts(r: Reader, node: Node, layout, heads) -> None:
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


def check_chunk_grain(
    r: Reader,
    node: Node,
    geometry: TokenLayout,
    tiling: Tiling,
    runtime: Runtime,
    patterns: int,
    tiling_path: str = "tiling",
) -> None:
    """The chunks' tables come from one classification of the sequence in row blocks of
    gcd(compute_q, chunk tokens) (svgen.analysis.chunks): its grid must fit MAX_TILE_PAIRS,
    as the full sequence's does, before any of it is allocated. A rolling cache's come from
    every row against the cache's key pieces (its compute kv blocks, cut at the ring's two
    edges): rows x pieces must fit it too. ``tiling_path``: where ``tiling`` is written (a
    chip's own, `tiling.<chip>`, is named in the message)."""
    which = "" if tiling_path == "tiling" else f"with {tiling_path}: "
    rows = runtime.chunk_frames * geometry.tokens_per_frame
    if runtime.rolling:
        cache = runtime.cache_frames(geometry.frames) * geometry.tokens_per_frame
        need = geometry.seq_len * (-(-cache // tiling.ckv) + 2) * patterns
        if need > MAX_TILE_PAIRS:
            raise r.error(
                node,
                "runtime.kv_cache",
                f"{which}classifying every chunk position of the rolling cache ({cache:,} keys in "
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
            f"{which}chunks of {rows:,} tokens start {grain} row(s) apart from the compute_q of "
            f"{tiling.cq} (their gcd): classifying every chunk position takes "
            f"{need:,} block pairs, more than {MAX_TILE_PAIRS:,} (MAX_TILE_PAIRS); choose "
            "chunk_frames or compute_q so that chunk_frames x height x width shares a larger "
            "power of two with compute_q",
        )


def _layout_words(order) -> str:
    if isinstance(order, Tiled):
        return f"tiled {order.frames}x{order.rows}x{order.cols}"
    if isinstance(order, AxisOrder):
        return f"order {order.words()}"
    if isinstance(order, Curve):
        return f"curve {order.kind}" + (f" over {order.over}" if order.over != FRAME else "")
    return str(order)


def read_layout(
    r: Reader, node: Node, path: str, geometry: TokenLayout
) -> str | Tiled | AxisOrder | Curve:
    """A layout: a name of LAYOUTS, {tiled: {frames, rows, cols}} with a cube of positive
    sizes, each at most the geometry's frames, height and width, {order: [a, b, c]}, an
    order of the axes f, h, w (svgen.core.layout.AxisOrder), or {curve: hilbert|morton}
    (svgen.core.curves)."""
    if not isinstance(node, MappingNode):
        if isinstance(node, ScalarNode) and r.scalar(node, path) == TILED:
            raise r.error(
                node, path, "tiled needs its cube: write {tiled: {frames: A, rows: B, cols: C}}"
            )
        return r.choice(node, path, LAYOUTS)
    entries = r.mapping(node, path, LAYOUT_KEYS)
    if "over" in entries and "curve" not in entries:
        raise r.error(
            entries["over"][0],
            join_path(path, "over"),
            "goes with curve: write {curve: hilbert, over: video}",
        )
    if len([key for key in entries if key != "over"]) != 1:
        raise r.error(
            node,
            path,
            "give one of {tiled: {frames: A, rows: B, cols: C}}, {order: [f, h, w]} "
            f"(the axes in any order) and {{curve: hilbert}}, got {r.describe(node)}",
        )
    if "order" in entries:
        return _read_axis_order(r, entries["order"][1], join_path(path, "order"))
    if "curve" in entries:
        kind = r.choice(entries["curve"][1], join_path(path, "curve"), CURVES)
        over = FRAME
        if "over" in entries:
            over = r.choice(entries["over"][1], join_path(path, "over"), CURVE_SCOPES)
        return Curve(kind, over)
    tpath, tnode = join_path(path, TILED), entries[TILED][1]
    cube = r.mapping(tnode, tpath, TILED_KEYS, what="a mapping {frames: A, rows: B, cols: C}")
    r.require(tnode, tpath, cube, TILED_KEYS)
    extents = {"frames": "frames", "rows": "height", "cols": "width"}
    sizes = {
        key: r.integer(
            cube[key][1],
            join_path(tpath, key),
            1,
            getattr(geometry, extents[key]),
            f"geometry.{extents[key]}: a cube fits in the video",
        )
        for key in TILED_KEYS
    }
    return Tiled(**sizes)


def _read_axis_order(r: Reader, node: Node, path: str) -> AxisOrder:
    """[a, b, c]: the axes f (frame), h (row), w (column), each once, outermost first."""
    wanted = "a list of the axes f, h and w, each once, outermost first (such as [w, h, f])"
    if not isinstance(node, SequenceNode):
        raise r.error(node, path, f"must be {wanted}, got {r.describe(node)}")
    if len(node.value) != len(AXES):
        raise r.error(node, path, f"must be {wanted}, got {len(node.value)} items")
    axes = tuple(r.choice(item, f"{path}[{i}]", AXES) for i, item in enumerate(node.value))
    if len(set(axes)) != len(AXES):
        raise r.error(node, path, f"must be {wanted}, got [{', '.join(axes)}]")
    return AxisOrder(axes)


def read_heads(
    r: Reader,
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

    cpath = join_path(path, "candidates")
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
        ppath = join_path(ipath, "pattern")
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
            clayout = read_layout(r, entries["layout"][1], join_path(ipath, "layout"), geometry)
        candidates.append(Candidate(pname, clayout, r.location(item, ipath)))

    apath = join_path(path, "assign")
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
