"""The kernels' table format, NumPy only: compiling a spec never imports Pallas.

What a generated module hands the kernels (`Pattern`: one candidate pattern's runs, layout
and masks), runs, pieces and the SMEM tables of the forward kernel (`PieceTables`, see
svgen.runtime.steps for how the kernels read them), the transposed tables of the backward
pass's dk/dv kernel, the static sizes a kernel is specialized for (`KernelShape`), and the
loading of runs a generated module keeps in a .npy file beside itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from typing import Callable, Sequence

import numpy as np

from svgen.core.kinds import TileKind
from svgen.core.layout import ComputeBlocks, TokenLayout
from svgen.core.vmem import row_sum_on_mxu

SMEM_BUDGET = 1 << 20  # bytes: one TPU TensorCore's SMEM, as the compiler assumes
Q_BLOCK_SHIFT = 17
KV_BLOCK_SHIFT = 2
KV_BLOCK_MASK = (1 << (Q_BLOCK_SHIFT - KV_BLOCK_SHIFT)) - 1
KIND_MASK = (1 << KV_BLOCK_SHIFT) - 1
MAX_BLOCKS = 1 << (Q_BLOCK_SHIFT - KV_BLOCK_SHIFT)  # 32768 tiles per side
BITS_PER_BLOCK = 2  # a compute block's TileKind in a tile's `blocks` word
# A BOUNDARY compute block's residual mask in a tile's `variants` word (0: the whole mask;
# svgen.analysis.residuals): VARIANT_BITS per block, at most 3 variants, or WIDE_VARIANT_BITS
# (15) where a tile has at most WIDE_VARIANT_BLOCKS compute blocks (see variant_bits).
VARIANT_BITS = 2
WIDE_VARIANT_BITS = 4
WIDE_VARIANT_BLOCKS = 32 // WIDE_VARIANT_BITS


def variant_bits(compute_blocks: int) -> int:
    """Bits per compute block in a variants word: 4 where the tile's compute blocks leave
    room in 32 bits (a radial mask at one block per tile has more band residuals than 3),
    else 2."""
    return WIDE_VARIANT_BITS if compute_blocks <= WIDE_VARIANT_BLOCKS else VARIANT_BITS


def variant_mask(compute_blocks: int) -> int:
    """A block's field of a variants word (variant_bits ones): also the most variants a
    pattern can have besides its whole mask (3 or 15)."""
    return (1 << variant_bits(compute_blocks)) - 1


LANES = 128
RUN_COLUMNS = 5  # q_block, kv_start, length, kind, blocks


# keep(q, k) -> bool array, from coordinates (coords.TokenCoords attributes)
BoundaryMask = Callable[[object, object], object]


@dataclasses.dataclass(frozen=True)
class Pattern:
    """One candidate pattern of a generated module."""

    name: str
    runs: object  # (q_block, kv_start, length, kind[, blocks]) rows
    layout: TokenLayout
    boundary_mask: BoundaryMask  # keep(q, k) from coordinates (coords.TokenCoords attributes)
    query_coords: tuple[str, ...] = ()  # the attributes of q that boundary_mask reads
    # runtime.per_video_frames: the superset and frame tree (svgen.runtime.video_frames)
    video_frames: object = None
    # Residual masks (svgen.analysis.residuals): variant j + 1 of a BOUNDARY compute block
    # runs residual_masks[j]; run_variants holds per run its VARIANT_BITS per compute block.
    residual_masks: tuple[BoundaryMask, ...] = ()
    run_variants: object = None
    # Block masks given as data (the `blocks` primitive): (tag, table) pairs, each table a
    # 0/1 array [R, C] over blocks of the layout order, zero-padded, that boundary_mask reads
    # through coords.block_bits (a VMEM input of the kernels).
    block_tables: tuple = ()


def pack_pieces(q_block: np.ndarray, kv_block: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Packed int32 entries: q_block << 17 | kv_start << 2 | kind (svgen.runtime.steps)."""
    q_block = np.asarray(q_block, dtype=np.int64)
    kv_block = np.asarray(kv_block, dtype=np.int64)
    kind = np.asarray(kind, dtype=np.int64)
    if q_block.size and (q_block.max() >= MAX_BLOCKS or kv_block.max() >= MAX_BLOCKS):
        raise ValueError(f"at most {MAX_BLOCKS} tiles per side fit the packed step table")
    packed = (q_block << Q_BLOCK_SHIFT) | (kv_block << KV_BLOCK_SHIFT) | kind
    # Bit 31 may be set (q_block >= 16384): keep the bits, reinterpret as int32.
    return packed.astype(np.uint32).view(np.int32)


def as_runs(runs) -> np.ndarray:
    """Runs as int64 [n, 5]; 4-column runs (one compute block per tile) get blocks = 0."""
    runs = np.asarray(runs, dtype=np.int64)
    if runs.ndim == 2 and runs.shape[1] == RUN_COLUMNS - 1:
        runs = np.concatenate([runs, np.zeros((len(runs), 1), np.int64)], axis=1)
    return runs.reshape(-1, RUN_COLUMNS)


def split_runs(runs, slots: int) -> np.ndarray:
    """Runs (q_block, kv_start, length, kind, blocks) cut into pieces of at most `slots` tiles."""
    return _split(runs, slots)[0]


def _split(runs, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(pieces as `split_runs`, the run of each piece)."""
    runs = as_runs(runs)
    pieces_per_run = -(-runs[:, 2] // slots)
    run = np.repeat(np.arange(len(runs)), pieces_per_run)
    index = np.arange(int(pieces_per_run.sum())) - np.repeat(
        np.cumsum(pieces_per_run) - pieces_per_run, pieces_per_run
    )
    start = runs[run, 1] + index * slots
    length = np.minimum(runs[run, 2] - index * slots, slots)
    return np.stack([runs[run, 0], start, length, runs[run, 3], runs[run, 4]], axis=1), run


def blocks_dtype(compute_blocks: int, bits_per_block: int = BITS_PER_BLOCK):
    """The smallest integer type holding `bits_per_block` bits per compute block (a blocks
    word's kinds; with VARIANT_BITS, a variants word), read back masked."""
    bits = bits_per_block * compute_blocks
    return np.int8 if bits <= 8 else np.int16 if bits <= 16 else np.int32


def _packed_words(words: np.ndarray, dtype) -> np.ndarray:
    """Words in the signed `dtype`, keeping their low bits (wrapping into the sign bit); the
    kernel masks the sign extension away when it reads them back."""
    signed = np.dtype(dtype)
    return np.asarray(words).astype(f"u{signed.itemsize}").view(signed)


def step_head_dtype(heads: int):
    """The smallest integer type of a flat walk's per-step head index."""
    return np.int8 if heads <= 127 else np.int16 if heads <= 32767 else np.int32


def piece_index_dtype(tables: "PieceTables"):
    """The smallest integer type of a flat walk's per-step piece index."""
    return np.int16 if tables.entries.shape[0] <= 32767 else np.int32


def walks_flat(patterns: int, tensor_cores: int) -> bool:
    """Flat walk: several patterns, one TensorCore (see the module docstring)."""
    return patterns > 1 and tensor_cores == 1


def runtime_table_bytes(
    pieces_per_pattern: Sequence[int], slots: int, compute_blocks: int, batch: int, heads: int
) -> int:
    """SMEM of the tables a call with run-time inputs builds (svgen.runtime.segments): per
    row (batch * heads) its pattern, first piece and piece count; per batch element every
    pattern's pieces at their static maximum (the pattern's static step count), each an
    entry, a length when slots > 1 and a blocks word with several compute blocks a tile."""
    per_piece = 4 + (1 if slots < 128 else 2) * (slots > 1)
    if compute_blocks > 1:
        per_piece += np.dtype(blocks_dtype(compute_blocks)).itemsize
    return 12 * batch * heads + batch * int(sum(pieces_per_pattern)) * per_piece


def static_steps(runs) -> int:
    """A pattern's static step count: its runs' tiles, one zero-fill step per q tile that
    visits nothing (the most pieces run-time refinement can give it)."""
    return int(as_runs(runs)[:, 2].sum())


@dataclasses.dataclass(frozen=True)
class PieceTables:
    """The SMEM tables of all candidate patterns (see the module docstring)."""

    first_piece: np.ndarray  # int32 [patterns]
    num_pieces: np.ndarray  # int32 [patterns]
    entries: np.ndarray  # int32 [all pieces]
    lengths: np.ndarray | None  # int8/int16 [all pieces], None when slots == 1
    blocks: np.ndarray | None  # int8/16/32 [all pieces], None with one compute block per tile
    slots: int
    flat: bool = False  # walk the heads' pieces one after another (see the module docstring)
    # int8/16/32 [all pieces]: the residual-mask variant of each compute block (variant_bits
    # each), read by the forward kernel only (the backward runs whole masks); None: no
    # pattern has variants. Not among `piece_operands`: the forward kernel appends it.
    variants: np.ndarray | None = None

    @classmethod
    def from_runs(
        cls,
        runs_per_pattern: Sequence,
        slots: int,
        compute_blocks: int = 1,
        flat: bool = False,
        variants_per_pattern: Sequence | None = None,
    ) -> "PieceTables":
        """variants_per_pattern: per pattern, its runs' variant words (None for a pattern
        without variants); None: no pattern has any."""
        split = [_split(runs, slots) for runs in runs_per_pattern]
        pieces = [p for p, _ in split]
        counts = np.array([len(p) for p in pieces], np.int32)
        first = (np.cumsum(counts) - counts).astype(np.int32)
        allp = np.concatenate(pieces)
        entries = pack_pieces(allp[:, 0], allp[:, 1], allp[:, 3])
        # The smallest integer type that holds a piece length (SMEM is 1 MiB).
        lengths = allp[:, 2].astype(np.int8 if slots < 128 else np.int16) if slots > 1 else None
        blocks = None
        if compute_blocks > 1:
            blocks = _packed_words(allp[:, 4], blocks_dtype(compute_blocks))
        variants = None
        if variants_per_pattern is not None and any(v is not None for v in variants_per_pattern):
            words = np.concatenate(
                [
                    np.zeros(len(run), np.int64) if v is None else np.asarray(v, np.int64)[run]
                    for (_, run), v in zip(split, variants_per_pattern)
                ]
            )
            bits = variant_bits(compute_blocks)
            variants = _packed_words(words, blocks_dtype(compute_blocks, bits))
        return cls(first, counts, entries, lengths, blocks, slots, flat, variants)

    @property
    def max_pieces(self) -> int:
        return int(self.num_pieces.max())

    @property
    def bytes_per_piece(self) -> int:
        return sum(
            t.itemsize
            for t in (self.entries, self.lengths, self.blocks, self.variants)
            if t is not None
        )

    def scalar_prefetch_bytes(self, heads: int) -> int:
        """Bytes of SMEM: per head its pattern, first piece and piece count (flat: and first
        step, and the head of every possible step); the pieces."""
        per_head = 12 * heads
        if self.flat:  # head_first_step; step_head and step_piece for every possible step
            per_step = (
                np.dtype(step_head_dtype(heads)).itemsize
                + np.dtype(piece_index_dtype(self)).itemsize
            )
            per_head += 4 * heads + heads * self.max_pieces * per_step
        variants = 0 if self.variants is None else self.variants.nbytes
        return int(per_head + sum(t.nbytes for t in self.piece_operands()) + variants)

    def piece_operands(self) -> tuple[np.ndarray, ...]:
        return tuple(t for t in (self.entries, self.lengths, self.blocks) if t is not None)


@dataclasses.dataclass(frozen=True)
class KernelShape(ComputeBlocks):
    """The static sizes one generated kernel was specialized for (`cq`, `ckv` and the compute
    blocks per tile: ComputeBlocks)."""

    seq_len: int
    padded_seq_len: int
    block_q: int
    block_kv: int
    head_dim: int
    heads: int
    compute_q: int | None = None  # None: the whole tile is one compute block
    compute_kv: int | None = None
    vmem_limit_bytes: int | None = None  # None: the compiler's default scoped limit
    tensor_cores: int = 1  # of the target chip: 2 keeps the per-head walk (see above)
    # The spec's `attention.softmax: bounded`: each q tile whose score bound is small enough
    # runs without a running max (svgen.runtime.forward, "bounded max"); the others online.
    bounded_softmax: bool = False
    mxu_width: int = 256  # of the target chip: decides where the row sum comes from
    # The spec's `attention.qk: int8`: the forward kernel's QK^T in int8, q and k (smoothed)
    # quantized per compute block before it (svgen.runtime.quantize); P·V in the dtype.
    qk_int8: bool = False

    @property
    def padding_kv_tile(self) -> int | None:
        """The kv tile whose compute block `padding_block_column` holds both real and padding
        keys (None when the sequence fills its last compute block: no block needs the test)."""
        return None if self.seq_len % self.ckv == 0 else (self.seq_len - 1) // self.block_kv

    @property
    def padding_block_column(self) -> int:
        return (self.seq_len - 1) % self.block_kv // self.ckv

    @property
    def row_sum_on_mxu(self) -> bool:
        """True when [V | 1] costs no extra MXU pass (svgen.core.vmem.row_sum_on_mxu)."""
        return row_sum_on_mxu(self.head_dim, self.mxu_width)

    @property
    def acc_width(self) -> int:
        return self.head_dim + (LANES if self.row_sum_on_mxu else 0)


def compute_block_kinds(runs, num_q_tiles: int, num_kv_tiles: int, rq: int, rk: int) -> np.ndarray:
    """int8 [num_q_tiles * rq, num_kv_tiles * rk]: each compute block's kind, read back from
    a pattern's runs (tile kinds and blocks words; zero-fill steps visit nothing)."""
    runs = as_runs(runs)
    kinds = np.zeros((num_q_tiles, num_kv_tiles, rq * rk), np.int8)
    shifts = BITS_PER_BLOCK * np.arange(rq * rk)
    for q_tile, start, length, kind, word in runs.tolist():
        if kind == TileKind.FULL:
            kinds[q_tile, start : start + length] = TileKind.FULL
        elif kind == TileKind.BOUNDARY:
            block = (word >> shifts) & KIND_MASK if rq * rk > 1 else [TileKind.BOUNDARY]
            kinds[q_tile, start : start + length] = np.asarray(block, np.int8)
    per_tile = kinds.reshape(num_q_tiles, num_kv_tiles, rq, rk)
    return per_tile.transpose(0, 2, 1, 3).reshape(num_q_tiles * rq, num_kv_tiles * rk)


def runs_of_blocks(blocks: np.ndarray, rows: int, cols: int, rq: int, rk: int) -> np.ndarray:
    """Runs (row tile, col start, length, kind, blocks word) of a compute-block kind matrix
    cut into rows x cols tiles of rq x rk blocks, row-major, with a zero-fill step for each
    row tile that visits nothing (it names the previous step's column tile)."""
    per_tile = blocks.reshape(rows, rq, cols, rk).transpose(0, 2, 1, 3).reshape(rows, cols, -1)
    full = np.all(per_tile == TileKind.FULL, axis=2)
    empty = np.all(per_tile == TileKind.EMPTY, axis=2)
    kind = np.where(full, TileKind.FULL, np.where(empty, TileKind.EMPTY, TileKind.BOUNDARY))
    shifts = BITS_PER_BLOCK * np.arange(rq * rk, dtype=np.int64)
    word = np.where(kind == TileKind.BOUNDARY, (per_tile.astype(np.int64) << shifts).sum(2), 0)
    if rq * rk == 1:
        word = np.zeros_like(word)
    out, last = [], None
    for r in range(rows):
        visited = np.flatnonzero(kind[r] != TileKind.EMPTY)
        if visited.size == 0:
            column = 0 if last is None else last
            out.append([r, column, 1, TileKind.EMPTY, 0])
            continue
        for c in visited.tolist():
            k, w = int(kind[r, c]), int(word[r, c])
            if (
                out
                and out[-1][0] == r
                and out[-1][1] + out[-1][2] == c
                and out[-1][3] == k
                and out[-1][4] == w
            ):
                out[-1][2] += 1
            else:
                out.append([r, c, 1, k, w])
            last = c
    return np.asarray(out, np.int64).reshape(-1, RUN_COLUMNS)


def transposed_runs(runs, shape: KernelShape, q_len: int | None = None) -> np.ndarray:
    """The runs of the same visited compute blocks seen from the keys: per kv tile, the q
    tiles (and per tile, which of its [ckv x cq] blocks are FULL / BOUNDARY). q_len: the
    rows when they are not seq_len (a KV-cache chunk's, svgen.runtime.chunks)."""
    num_q = -(-(q_len or shape.seq_len) // shape.block_q)
    num_kv = -(-shape.seq_len // shape.block_kv)
    rq, rk = shape.q_blocks_per_tile, shape.kv_blocks_per_tile
    blocks = compute_block_kinds(runs, num_q, num_kv, rq, rk)
    return runs_of_blocks(blocks.T, num_kv, num_q, rk, rq)


def transposed_shape(shape: KernelShape) -> KernelShape:
    """The dkv kernel's shape: rows are keys, columns queries."""
    return dataclasses.replace(
        shape,
        block_q=shape.block_kv,
        block_kv=shape.block_q,
        compute_q=shape.ckv,
        compute_kv=shape.cq,
    )


def transposed_tables(
    runs_per_pattern: Sequence,
    shape: KernelShape,
    heads: int,
    smem_budget: int = SMEM_BUDGET,
    q_len: int | None = None,
) -> PieceTables:
    """The dkv kernel's SMEM tables: the smallest piece size that fits the budget (the same
    rule as the forward's); ValueError when none does. q_len: as for transposed_runs (the
    per-head walk then, as every chunked call's)."""
    runs = [transposed_runs(r, shape, q_len) for r in runs_per_pattern]
    flat = q_len is None and walks_flat(len(runs), shape.tensor_cores)
    slots = 1
    while True:
        tables = PieceTables.from_runs(runs, slots, shape.compute_blocks, flat)
        if tables.scalar_prefetch_bytes(heads) <= smem_budget:
            return tables
        if slots >= 256:
            raise ValueError(
                f"the backward (dk, dv and dq) tables need "
                f"{tables.scalar_prefetch_bytes(heads):,} bytes of SMEM, over "
                f"{smem_budget:,}: use larger tiles"
            )
        slots *= 2


def block_table_shape(
    block: int, cq: int, ckv: int, q_tiles: int, kv_tiles: int, block_q: int, block_kv: int
) -> tuple[int, int, int, int]:
    """[R, C, rq, ck] of a block mask given as data as the kernels read it (one tile more
    each way than the grid's, past any padding tile): per compute block of cq x ckv tokens,
    the rq x ck data blocks of `block` tokens its rows and keys can fall in, each at least 8
    (Mosaic lowers one-hot matmuls of inner dimension 1 to a broadcast it rejects)."""
    rows = (q_tiles + 1) * (block_q // cq)
    cols = (kv_tiles + 1) * (block_kv // ckv)
    return rows, cols, _spanned(rows, cq, block), _spanned(cols, ckv, block)


def _spanned(count: int, size: int, block: int) -> int:
    """The most data blocks one of `count` runs of `size` tokens (from 0) falls in, rounded
    up to a multiple of 8."""
    first = np.arange(count) * size // block
    last = (np.arange(1, count + 1) * size - 1) // block
    return -(-(int(np.max(last - first)) + 1) // 8) * 8


def load_runs(path: pathlib.Path, *, sha256: str) -> np.ndarray:
    """The (q_block, kv_start, length, kind) runs in `path`, checked against the module's hash."""
    data = pathlib.Path(path).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise RuntimeError(
            f"{path} does not match the module that loads it (sha256 {actual}, expected "
            f"{sha256}); regenerate with `svgen compile`"
        )
    return np.load(path, allow_pickle=False)


def check_curve(layout, *, sha256: str) -> None:
    """A curve layout's order is the one the module was generated with (svgen.core.curves
    computes it from the curve and the sizes; the module pins its digest)."""
    actual = layout.curve_digest
    if actual != sha256:
        raise RuntimeError(
            f"this svgen orders the tokens of a {layout.frames} x {layout.height} x "
            f"{layout.width} video along the {layout.curve} curve differently from the svgen "
            f"that generated the module (sha256 {actual}, expected {sha256}); regenerate with "
            "`svgen compile`"
        )


def selectable_blocks(always: np.ndarray, candidate: np.ndarray, shape: KernelShape) -> np.ndarray:
    """bool [R, C]: the compute blocks a selection policy may choose (svgen.runtime.select):
    real blocks the candidate region touches (candidate: kinds [R, C]) that the always-kept
    kinds (always [R, C]) do not already keep whole."""
    real_rows = np.arange(candidate.shape[0]) * shape.cq < shape.seq_len
    real_cols = np.arange(candidate.shape[1]) * shape.ckv < shape.seq_len
    touched = (candidate != TileKind.EMPTY) & real_rows[:, None] & real_cols[None, :]
    return touched & (always != TileKind.FULL)


def tile_grid(shape: KernelShape) -> tuple[int, int, int, int]:
    """(q tiles, kv tiles, compute blocks per tile down, across): what compute_block_kinds
    and runs_of_blocks take after the runs or blocks."""
    return (
        -(-shape.seq_len // shape.block_q),
        -(-shape.seq_len // shape.block_kv),
        shape.q_blocks_per_tile,
        shape.kv_blocks_per_tile,
    )


def selection_superset_runs(always_runs, candidate_runs, shape: KernelShape) -> np.ndarray:
    """The runs of always-kept + every selectable block (FULL): what a selection's tables
    hold at most (their static maximum: `static_steps` of these runs)."""
    grid = tile_grid(shape)
    always = compute_block_kinds(always_runs, *grid)
    selectable = selectable_blocks(always, compute_block_kinds(candidate_runs, *grid), shape)
    superset = np.where(selectable, TileKind.FULL, always).astype(np.int8)
    return runs_of_blocks(superset, grid[0], grid[1], grid[2], grid[3])
