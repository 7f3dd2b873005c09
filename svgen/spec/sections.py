"""The spec's sections other than masks: geometry, attention, tiling, gpu, runtime (with
kv_cache), select, layout and heads, each read and checked against the others. This module
reads geometry, attention, tiling and gpu and names every section's keys; the others are
read in runtime_section (runtime, kv_cache), select_section and layout_section (layout,
heads).
"""

from __future__ import annotations

from yaml.nodes import MappingNode, Node, ScalarNode

from svgen.spec.limits import MAX_HEADS, MAX_SEQ_LEN, MAX_TILE_PAIRS
from svgen.core.layout import TEXT_POSITIONS, TokenLayout
from svgen.spec.masks import is_null
from svgen.spec.model import (
    ALIGN_MODES,
    Attention,
    BLOCK_MAX,
    BLOCK_MIN,
    BLOCK_MULTIPLE,
    DEFAULT_BLOCK,
    DTYPES,
    GpuTiling,
    HEAD_DIMS,
    SOFTMAX_MODES,
    QK_MODES,
    TPU_CHIPS,
    Tiling,
)
from svgen.spec.nodes import MISSING, Reader, join_path, show_int

# The runtime, select, layout and heads sections live in modules of their own; their keys,
# limits and readers keep their names here for svgen.spec and its loader.
from svgen.spec.layout_section import (  # noqa: F401
    CANDIDATE_KEYS,
    HEADS_KEYS,
    LAYOUT_KEYS,
    TILED_KEYS,
    read_heads,
    read_layout,
)
from svgen.spec.runtime_section import (  # noqa: F401
    KV_CACHE_KEYS,
    RUNTIME_KEYS,
    check_chunk_grain,
    check_kv_cache_layouts,
    read_runtime,
)
from svgen.spec.select_section import (  # noqa: F401
    MAX_SAMPLED_ROWS,
    MAX_SELECT_BLOCKS,
    SELECT_KEYS,
    TOP_K_KEYS,
    TOP_P_KEYS,
    check_select,
    read_select,
)

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
GPU_KEYS = ("block_q", "block_kv", "num_warps", "num_stages")
#: Triton tiles: powers of two (tensor shapes), at least 16 (tl.dot's smallest operand).
GPU_BLOCKS = (16, 32, 64, 128, 256)
GPU_WARPS = (1, 2, 4, 8, 16)
GPU_MAX_STAGES = 8


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
