"""The forward kernel declared once: every static choice of one `svgen_attention` kernel as one
frozen object (NumPy only, so that the cost model reads it without JAX).

`ForwardVariant` names what used to be a row of keyword switches on the kernel body and its
call builder. From it follow

* the kernel's operands, in the order the pallas_call passes them (`operands`): the scalar
  tables prefetched into SMEM, the VMEM inputs, the outputs and the scratch, each by name.
  The kernel body unpacks its refs by these names (`unpack`); the call builder makes its
  BlockSpecs and scratch from the same list (svgen.runtime.tpu_call.KernelCall), so the
  two cannot drift apart;
* the kernel's branches, in the order the body emits them (`branches`): what the cost model
  reads in libtpu's schedule (svgen.estimate.paths) instead of a parallel list of flags.

A new kernel path is a field here, its operands or branches below, and its phase function in
svgen.runtime.forward.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

from svgen.core.layout import TokenLayout
from svgen.core.straight import StraightWord
from svgen.core.tables import BoundaryMask, KernelShape

# Where a call's tables come from: the module's static piece tables, a call's run-time
# segments (svgen.runtime.segments), a KV-cache chunk (svgen.runtime.chunks) or a selection
# (svgen.runtime.select). All but the first are read per row (batch x head).
Tables = Literal["static", "segments", "chunk", "selection"]

# How the forward kernel computes QK^T (svgen.runtime.quantize.QK_PRODUCTS): "float" in the
# operands' dtype, q scaled in init into the q_scaled scratch; "int8" (the spec's
# attention.qk: int8) from q and k quantized per compute block before the kernel, with their
# scales as two more inputs, and no q_scaled.
QkProduct = Literal["float", "int8"]


@dataclasses.dataclass(frozen=True)
class PatternCode:
    """What the kernel body needs of a pattern: its mask, layout and decoded query coords,
    and the residual masks its BOUNDARY blocks may run instead of the mask."""

    boundary_mask: BoundaryMask
    layout: TokenLayout
    query_coords: tuple[str, ...]
    residual_masks: tuple[BoundaryMask, ...] = ()
    # The blocks words whose BOUNDARY tiles run a straight-line body (static tables only).
    straight_words: tuple[StraightWord, ...] = ()
    # Block masks given as data (svgen.core.tables.Pattern.block_tables): (tag, table) pairs
    # the mask reads through its key coordinates; each a VMEM input of the kernels.
    block_tables: tuple = dataclasses.field(default=(), compare=False, hash=False)

    def variant(self, j: int) -> "PatternCode":
        """The pattern as its variant j runs it (0: the whole mask)."""
        mask = self.boundary_mask if j == 0 else self.residual_masks[j - 1]
        return PatternCode(mask, self.layout, self.query_coords, block_tables=self.block_tables)


def every_key(pattern: PatternCode) -> PatternCode:
    """The mask of a selected block (svgen.runtime.select): every key, the forward kernel's
    padding test dropping those past seq_len (and, across run-time segments, the segment
    test those of other segments)."""
    return PatternCode(_keep_every_key, pattern.layout, ())


def _keep_every_key(q, k):
    return k.pos >= 0


def or_chosen(pattern: PatternCode, chosen) -> PatternCode:
    """The pattern as a block of a selection across segments runs it: its mask, or every
    key where the block was chosen (chosen: a traced scalar bool, the piece's chosen bit)."""
    return dataclasses.replace(
        pattern,
        boundary_mask=functools.partial(_mask_or, pattern.boundary_mask, chosen),
        residual_masks=(),
        straight_words=(),
    )


def _mask_or(mask, chosen, q, k):
    return mask(q, k) | chosen


def unique_block_tables(patterns) -> dict:
    """tag -> table of every block table the patterns read, each once, in first-read order:
    the kernels' `blocks_<tag>` inputs, in this order."""
    tables: dict = {}
    for pattern in patterns:
        for tag, table, _, _ in pattern.block_tables:
            tables.setdefault(tag, table)
    return tables


def block_table_shapes(patterns) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(tag, shape) of `unique_block_tables`: what the kernels' operands declare."""
    return tuple((tag, tuple(t.shape)) for tag, t in unique_block_tables(patterns).items())


def block_table_bytes(shapes, blocks_per_tile: int) -> int:
    """VMEM the block tables take in a kernel: per tile its compute blocks' pieces, bf16
    in (16, 128) tiles, two buffers each (Pallas's pipeline)."""
    return sum(
        2 * blocks_per_tile * 2 * (-(-rq // 16) * 16) * (-(-ck // 128) * 128)
        for _, (_, _, rq, ck) in shapes
    )


def _block_table_operands(shapes, q_blocks: int, kv_blocks: int, index_map: str):
    """The `blocks_<tag>` inputs: per tile, the pieces of its q_blocks x kv_blocks compute
    blocks (in the table's own orientation: queries first)."""
    return [
        Operand(f"blocks_{tag}", "input", index_map, (q_blocks, kv_blocks, rq, ck))
        for tag, (_, _, rq, ck) in shapes
    ]


def _named_block_tables(named: dict) -> dict:
    """The block tables' refs by tag, taken out of `named` (named_refs' other refs)."""
    return {
        name[len("blocks_") :]: named.pop(name)
        for name in list(named)
        if name.startswith("blocks_")
    }


@dataclasses.dataclass(frozen=True)
class TableWalk:
    """How a grid step finds its entry in the SMEM tables (svgen.runtime.steps.StepView)."""

    heads: int
    # The piece count when there is one pattern: static, or EXACT_GRID (see StepView).
    single: int | None
    has_lengths: bool  # a piece-length table: pieces of several tiles (slots > 1)
    has_blocks: bool  # a blocks word per entry: tiles of several compute blocks
    flat: bool  # one global step list over every head (grid axis 0: the batch)
    per_row: bool  # tables per row (batch x head), not per head
    # A selection across run-time segments: a chosen word per piece, the last table.
    has_chosen: bool = False

    @classmethod
    def of(
        cls,
        tables,
        heads: int,
        single: int | None,
        flat: bool,
        per_row: bool,
        has_chosen: bool = False,
    ) -> "TableWalk":
        """The walk of a call over `tables` (svgen.core.tables.PieceTables: whether it has
        piece lengths and blocks words); has_chosen: the call's tables carry chosen words."""
        has_lengths, has_blocks = tables.lengths is not None, tables.blocks is not None
        return cls(heads, single, has_lengths, has_blocks, flat, per_row, has_chosen)


@dataclasses.dataclass(frozen=True)
class Operand:
    """One ref of the kernel, by name. role: scalar (prefetched into SMEM), input, output,
    scratch. index_map (inputs and outputs): which of the call builder's index maps places
    its block (svgen.runtime.tpu_call.IndexMaps; "any": left in HBM), and block: the block's
    shape (None: a squeezed dimension). shape and dtype: a scratch buffer's; memory: its
    space (vmem, smem). aliases (an input): the output whose buffer it is (pallas_call's
    input_output_aliases); the kernel body reads and writes that output's ref only."""

    name: str
    role: Literal["scalar", "input", "output", "scratch"]
    index_map: str = ""
    block: tuple[int | None, ...] = ()
    shape: tuple[int, ...] = ()
    dtype: str = ""
    memory: str = "vmem"
    aliases: str = ""


@dataclasses.dataclass(frozen=True)
class Branches:
    """The kernel's branches in the order the body emits them, as the cost model reads them
    (svgen.estimate.paths.read_paths, through their tree: svgen.runtime.branch_tree). Per step:

        init, full, mixed[0] (+ its segment twin), ..., mixed[P-1] (+ twin)[, padded], finalize

    with a bounded kernel's full..padded twice, each set in one branch on the q tile's mode
    (the bounded set first). Inside a mixed branch of a tile of several compute blocks: one
    branch per straight word, then (in one branch when there are words) per compute block
    its FULL and BOUNDARY branches and, in segment tables, a SEGMENT_BOUNDARY one, in
    selections a PADDED one on the padding column; inside a BOUNDARY block, one branch per
    residual variant (the whole mask first), and inside that the two padding twins on the
    padding column."""

    patterns: int
    compute_blocks: int
    q_blocks_per_tile: int
    segmented: bool  # SEGMENT_BOUNDARY blocks (and one-block tiles' twins)
    padded_column: int | None  # a selection's block column that can hold padding keys
    bounded: bool
    residuals: tuple[int, ...]  # per pattern, its residual masks
    straight: tuple[tuple[StraightWord, ...], ...]  # per pattern, its straight words
    # The block column whose masked bodies branch on the kv tile holding padding keys
    # (without, then with the padding test); None: no kv tile holds padding keys, or the
    # kernel never tests them (the backward kernels: their padding keys are zero rows).
    padding_column: int | None = None

    def phases(self) -> tuple[str, ...]:
        """The top-level phases of one set, by name (a bounded kernel has two such sets
        between init and finalize)."""
        twins = self.segmented and self.compute_blocks == 1
        mixed = []
        for p in range(self.patterns):
            mixed.append(f"mixed[{p}]")
            if twins:
                mixed.append(f"segment[{p}]")
        padded = ("padded",) if self.padded_column is not None and self.compute_blocks == 1 else ()
        return ("full", *mixed, *padded)


@dataclasses.dataclass(frozen=True)
class ForwardVariant:
    """Every static choice of one forward kernel: what its body traces and its call passes."""

    shape: KernelShape
    patterns: tuple[PatternCode, ...]
    walk: TableWalk
    tables: Tables
    # Scalar operands: the walk's and tables' own, then (static tables with residual masks)
    # the variants word per piece, or (a chunk) the per-row scalars: the kernel reads
    # either as the last scalar operand.
    num_tables: int
    dtype: str  # of the call's q, k, v and o (before int8 QK^T quantizes q and k)
    q_scale: float  # sm_scale * log2(e): q is scaled by it in init
    with_lse: bool = False  # an lse output (the backward pass's residual)
    with_modes: bool = False  # a softmax-mode output (attention.softmax_modes)
    q_rows: int = 0  # rows of q (bounded softmax: rows past them left out of the bound)
    chunk_rows: int = 0  # a chunk's call: its rows (batch x heads)
    ring_sink: int | None = None  # a chunk against a rolling cache whose sink ends here
    # Box DMA: q, k, v, o in the user's order ([rows, frames, height, width, d] for cubes,
    # [rows, frames, places, d] for place boxes), each q tile read as a box of this shape and
    # each kv tile of kv_cube (svgen.runtime.cube); None: [rows, seq, d] tiles.
    cube: tuple[int, ...] | None = None
    kv_cube: tuple[int, ...] | None = None
    # Place boxes: places per q box and per kv box (a tile's rows are frame-major in its box,
    # not in kernel order; svgen.runtime.cube.tile_positions).
    box_q_places: int = 0
    box_kv_places: int = 0
    id_rows: int = 0  # run-time ids: rows of each id block (2 with per-video frame shifts)
    # The static tables hold a residual-mask variants word per piece (their last operand).
    variants_table: bool = False
    # Block masks given as data: (tag, shape) of each table, a VMEM input read whole.
    block_tables: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # A head run's call (svgen.runtime.forward): o is written into the buffer of an input
    # left in HBM (aliased), whose other heads' rows keep what earlier calls wrote there.
    o_aliased: bool = False

    # ---------------------------------------------------------------- derived choices
    @property
    def bounded(self) -> bool:
        return self.shape.bounded_softmax

    @property
    def qk(self) -> QkProduct:
        return "int8" if self.shape.qk_int8 else "float"

    @property
    def segments(self) -> bool:
        """Run-time segments: the call's tables hold SEGMENT_BOUNDARY blocks (segment tables,
        or a selection's across segments) and the kernel reads the ids."""
        return self.tables == "segments" or (self.tables == "selection" and self.id_rows > 0)

    @property
    def selected(self) -> bool:
        return self.tables == "selection"

    @property
    def padded(self) -> bool:
        """A selection's kind 3 is PADDED (a chosen block holding the end of the keys); across
        segments it is SEGMENT_BOUNDARY, the piece's chosen word saying which mask."""
        return self.selected and not self.segments

    @property
    def chunked(self) -> int:
        """A chunk's rows (0: not a chunk's call)."""
        return self.chunk_rows if self.tables == "chunk" else 0

    @property
    def has_variants(self) -> bool:
        """Static tables with residual-mask variants (their last scalar operand)."""
        return reads_variants(self.tables, self.variants_table)

    @property
    def has_straight(self) -> bool:
        return runs_straight(self.tables)

    @property
    def query_coords(self) -> int:
        """Query coordinates decoded per q tile: the most any pattern needs."""
        return max(len(p.query_coords) for p in self.patterns)

    # ---------------------------------------------------------------- operands
    def operands(self) -> tuple[Operand, ...]:
        """Every ref of the kernel in pallas_call order: scalars, inputs, outputs, scratch."""
        shape, lanes, d = self.shape, 128, self.shape.head_dim
        q_block = (None, shape.block_q, d) if self.cube is None else (None, *self.cube, d)
        kv_block = (None, shape.block_kv, d) if self.kv_cube is None else (None, *self.kv_cube, d)
        scalars = [Operand(f"table{i}", "scalar") for i in range(self.num_tables)]
        inputs = [
            Operand("q", "input", "row", q_block),
            Operand("k", "input", "col", kv_block),
            Operand("v", "input", "col", kv_block),
        ]
        if self.bounded:
            inputs.append(Operand("key_bound", "input", "per_row", (None, 1, lanes)))
        if self.qk == "int8":  # per compute block, in its 128 lanes (svgen.runtime.quantize)
            inputs += [
                Operand("q_scales", "input", "row_vec", (None, 1, shape.q_blocks_per_tile * lanes)),
                Operand(
                    "k_scales", "input", "col_vec", (None, 1, shape.kv_blocks_per_tile * lanes)
                ),
            ]
        if self.segments:
            inputs += [
                Operand("q_ids", "input", "row_vec", (None, self.id_rows, shape.block_q)),
                Operand("kv_ids", "input", "col_vec", (None, self.id_rows, shape.block_kv)),
            ]
        inputs += _block_table_operands(
            self.block_tables, shape.q_blocks_per_tile, shape.kv_blocks_per_tile, "blocks"
        )
        if self.o_aliased:
            inputs.append(Operand("o_in", "input", "any", aliases="o"))
        outputs = [Operand("o", "output", "row", q_block)]
        if self.with_lse:  # lane-major [1, block_q]: what the backward kernels broadcast
            outputs.append(Operand("lse", "output", "row_vec", (None, 1, shape.block_q)))
        if self.with_modes:  # the q tile's mode in its 128 lanes
            outputs.append(Operand("modes", "output", "row_vec", (None, 1, lanes)))
        scratch = [
            Operand("m", "scratch", shape=(shape.block_q, lanes), dtype="float32"),
            Operand("acc", "scratch", shape=(shape.block_q, shape.acc_width), dtype="float32"),
        ]
        if not shape.row_sum_on_mxu:
            scratch.append(Operand("l", "scratch", shape=(shape.block_q, lanes), dtype="float32"))
        if self.qk == "float":  # the q tile scaled once, in init
            scratch.append(
                Operand(
                    "q_scaled", "scratch", shape=(shape.block_q, shape.head_dim), dtype=self.dtype
                )
            )
        if self.query_coords:
            coords = (self.query_coords, shape.block_q, lanes)
            scratch.append(Operand("coords", "scratch", shape=coords, dtype="int32"))
        if self.bounded:  # the q tile's softmax mode, set in init
            scratch.append(Operand("mode", "scratch", shape=(1,), dtype="int32", memory="smem"))
        return (*scalars, *inputs, *outputs, *scratch)

    def unpack(self, refs) -> "KernelRefs":
        """The kernel body's refs by name (KernelRefs), in the order of `operands`."""
        tables, named = named_refs("forward", self.operands(), refs)
        block_tables = _named_block_tables(named)
        return KernelRefs(tables=tables, block_tables=block_tables, **named)

    # ---------------------------------------------------------------- branches
    @property
    def branches(self) -> Branches:
        """The branch structure the body emits (see Branches)."""
        return forward_branches(
            self.shape, self.patterns, self.tables, self.variants_table, self.id_rows > 0
        )


def reads_variants(tables: Tables, variants_table: bool) -> bool:
    """Whether a call's BOUNDARY blocks pick residual-mask variants: static tables that hold
    them (a call's own tables carry no variants word)."""
    return tables == "static" and variants_table


def runs_straight(tables: Tables) -> bool:
    """Whether a call runs straight-line BOUNDARY bodies: static tables only (a call's own
    tables may hold any blocks word)."""
    return tables == "static"


def forward_branches(
    shape: KernelShape,
    patterns: tuple[PatternCode, ...],
    tables: Tables,
    variants_table: bool,
    ids: bool = False,
) -> Branches:
    """The forward kernel's branches for a call whose tables come from `tables`:
    variants_table, whether the module's static tables hold residual-mask variants; ids,
    whether it reads run-time ids. A module's cost model asks this of the call it compiles
    (svgen.estimate.measure; not of a selection across segments, whose SEGMENT_BOUNDARY blocks
    branch once more, on the chosen word)."""
    variants, straight = reads_variants(tables, variants_table), runs_straight(tables)
    segmented = tables == "segments" or (tables == "selection" and ids)
    padded = tables == "selection" and not ids and shape.padding_kv_tile is not None
    return Branches(
        patterns=len(patterns),
        compute_blocks=shape.compute_blocks,
        q_blocks_per_tile=shape.q_blocks_per_tile,
        segmented=segmented,
        padded_column=shape.padding_block_column if padded else None,
        bounded=shape.bounded_softmax,
        residuals=tuple(len(p.residual_masks) if variants else 0 for p in patterns),
        straight=tuple(p.straight_words if straight else () for p in patterns),
        padding_column=None if shape.padding_kv_tile is None else shape.padding_block_column,
    )


def backward_branches(shape: KernelShape, patterns: int) -> Branches:
    """The branches of the backward kernels (svgen.runtime.backward: the dq walk and the
    dk/dv walk): init, full, mixed per pattern, finalize, and in a mixed branch per compute
    block its FULL and BOUNDARY branches; no twins, no variants, no straight bodies."""
    return Branches(
        patterns=patterns,
        compute_blocks=shape.compute_blocks,
        q_blocks_per_tile=1,
        segmented=False,
        padded_column=None,
        bounded=False,
        residuals=(0,) * patterns,
        straight=((),) * patterns,
    )


def named_refs(kernel: str, operands: tuple[Operand, ...], refs) -> tuple[tuple, dict]:
    """(the scalar refs, the others by name) of a kernel whose refs are `operands`; a
    ValueError naming them all when the counts differ. An aliased input is left out: the
    body reads and writes its output's ref (Operand.aliases)."""
    if len(refs) != len(operands):
        raise ValueError(
            f"the {kernel} kernel got {len(refs)} refs, its variant declares "
            f"{len(operands)}: {[o.name for o in operands]}"
        )
    scalars = tuple(r for o, r in zip(operands, refs) if o.role == "scalar")
    named = {o.name: r for o, r in zip(operands, refs) if o.role != "scalar" and not o.aliases}
    return scalars, named


@dataclasses.dataclass(frozen=True)
class KernelRefs:
    """The forward kernel's refs by name (ForwardVariant.operands); those its variant does not
    declare are None."""

    tables: tuple
    q: object
    k: object
    v: object
    o: object
    m: object
    acc: object
    q_scaled: object = None
    key_bound: object = None
    q_scales: object = None  # int8 QK^T: q's and k's block scales (svgen.runtime.quantize)
    k_scales: object = None
    q_ids: object = None
    kv_ids: object = None
    lse: object = None
    modes: object = None
    l: object = None  # noqa: E741 (the softmax's row sum: its name in every paper)
    coords: object = None
    mode: object = None
    block_tables: dict = dataclasses.field(default_factory=dict)  # tag -> ref

    @property
    def last_scalar(self):
        """The last scalar operand: residual-mask variants, or a chunk's per-row scalars."""
        return self.tables[-1]

    @property
    def id_refs(self) -> tuple:
        """Run-time ids: (query ids, key ids), or () without them."""
        return () if self.q_ids is None else (self.q_ids, self.kv_ids)


# ------------------------------------------------------------------------------ backward


@dataclasses.dataclass(frozen=True)
class BackwardVariant:
    """Every static choice of one backward kernel (svgen.runtime.backward): the dq walk of
    the forward tables, or the dk/dv walk of the transposed ones (rows are keys there, and
    `shape` is the transposed shape it walks)."""

    kernel: Literal["dq", "dkv"]
    shape: KernelShape
    patterns: tuple[PatternCode, ...]
    walk: TableWalk
    num_tables: int
    sm_scale: float
    fused_dq: bool = False  # dk/dv: dq accumulated in an HBM buffer too
    id_rows: int = 0  # run-time segments' ids: rows of each id block (0: none)
    chunked: bool = False  # a chunk's walk: its last scalar operand holds per-row scalars
    ring: tuple[int, int] | None = None  # a rolling cache's chunk: (sink end, rows)
    # Place boxes (svgen.runtime.cube): the walk's row tiles and column tiles are boxes
    # (frames, n) of the user's [rows, frames, places, d] arrays, each tile's rows frame by
    # frame; None: [rows, seq, d] tiles in kernel order.
    row_box: tuple[int, int] | None = None
    col_box: tuple[int, int] | None = None
    # One call of several, one per pattern (ProgramLimits.pattern_calls): dk and dv come in
    # as aliased HBM buffers that the call writes its heads' rows of.
    rows_aliased: bool = False

    @property
    def row_places(self) -> int:
        """Places per row tile's box (0: rows in kernel order)."""
        return 0 if self.row_box is None else self.row_box[1]

    @property
    def col_places(self) -> int:
        return 0 if self.col_box is None else self.col_box[1]

    def operands(self) -> tuple[Operand, ...]:
        """Every ref in pallas_call order. Index maps: `row` / `col` tiles of the walk
        ([rows, tile, d] blocks), `row_vec` / `col_vec` lane-major vectors ([rows, 1 or 2,
        tile]), `any`: left in HBM for the kernel's own DMAs."""
        shape, lanes, d = self.shape, 128, self.shape.head_dim

        def tile(name, index_map, role="input", height=1):
            on_rows = index_map.startswith("row")
            size = shape.block_q if on_rows else shape.block_kv
            box = self.row_box if on_rows else self.col_box
            if index_map.endswith("vec"):
                return Operand(name, role, index_map, (None, height, size))
            return Operand(
                name, role, index_map, (None, size, d) if box is None else (None, *box, d)
            )

        scalars = [Operand(f"table{i}", "scalar") for i in range(self.num_tables)]
        if self.kernel == "dq":
            inputs = [tile("q", "row"), tile("k", "col"), tile("v", "col"), tile("do", "row")]
        else:
            inputs = [tile("k", "row"), tile("v", "row"), tile("q", "col"), tile("do", "col")]
        side = "row" if self.kernel == "dq" else "col"  # where the queries are
        inputs += [tile("lse", f"{side}_vec"), tile("delta", f"{side}_vec")]
        if self.id_rows:  # the ids of the walk's rows, then of its columns
            inputs += [
                tile("row_ids", "row_vec", height=self.id_rows),
                tile("col_ids", "col_vec", height=self.id_rows),
            ]
        tables = block_table_shapes(self.patterns)
        if self.kernel == "dq":
            qb, kb, index_map = shape.q_blocks_per_tile, shape.kv_blocks_per_tile, "blocks"
        else:  # the transposed walk: its rows are kv tiles, its compute rows keys
            qb, kb, index_map = shape.kv_blocks_per_tile, shape.q_blocks_per_tile, "blocks_t"
        inputs += _block_table_operands(tables, qb, kb, index_map)
        if self.kernel == "dq":
            outputs = [tile("dq", "row", "output")]
            scratch = [
                Operand("acc", "scratch", shape=(shape.block_q, d), dtype="float32"),
                Operand("lse_col", "scratch", shape=(shape.block_q, lanes), dtype="float32"),
                Operand("delta_col", "scratch", shape=(shape.block_q, lanes), dtype="float32"),
            ]
            return (*scalars, *inputs, *outputs, *scratch)
        outputs = [tile("dk", "row", "output"), tile("dv", "row", "output")]
        scratch = [
            Operand("dk_acc", "scratch", shape=(shape.block_q, d), dtype="float32"),
            Operand("dv_acc", "scratch", shape=(shape.block_q, d), dtype="float32"),
        ]
        if self.fused_dq:  # an f32 dq buffer in HBM, aliased from a zero input
            inputs.append(Operand("dq_zero", "input", "any", aliases="dq_hbm"))
            outputs.append(Operand("dq_hbm", "output", "any"))
            scratch += [
                # this step's dq contribution, and the q tile's dq read from HBM
                Operand("dq_step", "scratch", shape=(shape.block_kv, d), dtype="float32"),
                Operand(
                    "dq_buf",
                    "scratch",
                    shape=(shape.block_kv, d) if self.col_box is None else (*self.col_box, d),
                    dtype="float32",
                ),
                Operand("dq_sems", "scratch", shape=(2,), memory="dma_semaphore"),
            ]
        if self.rows_aliased:  # left in HBM, never read: the aliased outputs' buffers
            inputs += [
                Operand("dk_in", "input", "any", aliases="dk"),
                Operand("dv_in", "input", "any", aliases="dv"),
            ]
        return (*scalars, *inputs, *outputs, *scratch)

    def unpack(self, refs) -> "BackwardRefs":
        """The kernel body's refs by name (BackwardRefs), in the order of `operands`."""
        tables, named = named_refs(self.kernel, self.operands(), refs)
        block_tables = _named_block_tables(named)
        return BackwardRefs(tables=tables, block_tables=block_tables, **named)

    @property
    def branches(self) -> Branches:
        return backward_branches(self.shape, len(self.patterns))


@dataclasses.dataclass(frozen=True)
class BackwardRefs:
    """A backward kernel's refs by name (BackwardVariant.operands); those its variant does
    not declare are None. row_ids / col_ids: the ids of the walk's rows and columns (queries
    and keys in the dq walk, keys and queries in the dk/dv walk)."""

    tables: tuple
    q: object
    k: object
    v: object
    do: object
    lse: object
    delta: object
    row_ids: object = None
    col_ids: object = None
    dq: object = None
    acc: object = None
    lse_col: object = None
    delta_col: object = None
    dk: object = None
    dv: object = None
    dk_acc: object = None
    dv_acc: object = None
    dq_hbm: object = None
    dq_step: object = None
    dq_buf: object = None
    dq_sems: object = None
    block_tables: dict = dataclasses.field(default_factory=dict)  # tag -> ref

    @property
    def id_refs(self) -> tuple:
        """Run-time ids: (the rows', the columns'), or () without them."""
        return () if self.row_ids is None else (self.row_ids, self.col_ids)
