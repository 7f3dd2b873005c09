"""The invariant part of every svgen kernel: block-sparse flash attention over a step list.

A generated module supplies only what depends on its spec: the step table, the layout
constants and `boundary_mask(q_pos, k_pos)`. Everything here is shared, so diffs between
generated files show only spec-dependent code.

Grid and tables
---------------
The visited tiles, sorted by q tile, are grouped into *pieces*: up to `slots` consecutive kv
tiles of one q tile and one kind. The grid is (batch*heads, num_pieces, slots); grid step
(piece, slot) visits kv tile kv_start + slot of its piece. Per piece, SMEM (scalar prefetch)
holds one packed int32

    entry = q_block << 17 | kv_start << 2 | kind        (kind: TileKind)

and, when slots > 1, its length. Slots past a piece's length are skipped and repeat the last
kv tile, so they fetch nothing. slots = 1 is one entry per visited tile (no skipped steps);
larger pieces trade a few skipped steps for tables that fit the 1 MiB of SMEM when long runs
of FULL tiles would not (the compiler picks the smallest slots that fit its budget).

A q tile's pieces are consecutive, so the q tile and output block stay resident while its kv
tiles stream past; a step is the first (last) of its q tile when it opens (closes) its piece
and the previous (next) piece names another q tile. EMPTY tiles cost no grid step; a q tile
with no visited tile gets one EMPTY piece that only writes zeros.

Per step (names of the phases as in the code):
  init      first step of a q tile: reset the running max, denominator and accumulator;
  full      kind FULL: online-softmax update with no mask;
  boundary  kind BOUNDARY: the same update with keep(q, k) computed from coordinates;
  finalize  last step of a q tile: write acc / l, or 0 where no key was allowed (never NaN).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime.kinds import TileKind

Q_BLOCK_SHIFT = 17
KV_BLOCK_SHIFT = 2
KV_BLOCK_MASK = (1 << (Q_BLOCK_SHIFT - KV_BLOCK_SHIFT)) - 1
KIND_MASK = (1 << KV_BLOCK_SHIFT) - 1
MAX_BLOCKS = 1 << (Q_BLOCK_SHIFT - KV_BLOCK_SHIFT)  # 32768 tiles per side
LANES = 128

# Finite "minus infinity": exp(MASK_VALUE - m) underflows to 0 without inf - inf = NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)

BoundaryMask = Callable[[jax.Array, jax.Array], jax.Array]


def pack_steps(q_block: np.ndarray, kv_block: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The packed int32 step table (see the module docstring)."""
    q_block = np.asarray(q_block, dtype=np.int64)
    kv_block = np.asarray(kv_block, dtype=np.int64)
    kind = np.asarray(kind, dtype=np.int64)
    if q_block.size and (q_block.max() >= MAX_BLOCKS or kv_block.max() >= MAX_BLOCKS):
        raise ValueError(f"at most {MAX_BLOCKS} tiles per side fit the packed step table")
    packed = (q_block << Q_BLOCK_SHIFT) | (kv_block << KV_BLOCK_SHIFT) | kind
    # Bit 31 may be set (q_block >= 16384): keep the bits, reinterpret as int32.
    return packed.astype(np.uint32).view(np.int32)


def split_runs(runs, slots: int) -> np.ndarray:
    """Runs (q_block, kv_start, length, kind) cut into pieces of at most `slots` kv tiles."""
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 4)
    pieces_per_run = -(-runs[:, 2] // slots)
    run = np.repeat(np.arange(len(runs)), pieces_per_run)
    index = np.arange(int(pieces_per_run.sum())) - np.repeat(
        np.cumsum(pieces_per_run) - pieces_per_run, pieces_per_run)
    start = runs[run, 1] + index * slots
    length = np.minimum(runs[run, 2] - index * slots, slots)
    return np.stack([runs[run, 0], start, length, runs[run, 3]], axis=1)


@dataclasses.dataclass(frozen=True)
class PieceTable:
    """What the kernel's scalar prefetch holds (see the module docstring)."""

    entries: np.ndarray  # int32 [num_pieces]
    lengths: np.ndarray | None  # int32 [num_pieces], None when slots == 1
    slots: int

    @classmethod
    def from_runs(cls, runs, slots: int) -> "PieceTable":
        pieces = split_runs(runs, slots)
        entries = pack_steps(pieces[:, 0], pieces[:, 1], pieces[:, 3])
        lengths = pieces[:, 2].astype(np.int32) if slots > 1 else None
        return cls(entries, lengths, slots)

    @property
    def num_pieces(self) -> int:
        return int(self.entries.size)

    @property
    def scalar_prefetch_bytes(self) -> int:
        return int(self.entries.nbytes + (0 if self.lengths is None else self.lengths.nbytes))

    def operands(self) -> tuple[np.ndarray, ...]:
        return (self.entries,) if self.lengths is None else (self.entries, self.lengths)


@dataclasses.dataclass(frozen=True)
class KernelShape:
    """The static sizes one generated kernel was specialized for."""

    seq_len: int
    padded_seq_len: int
    block_q: int
    block_kv: int
    head_dim: int
    heads: int


def _q_block(entry):
    return lax.shift_right_logical(entry, Q_BLOCK_SHIFT)


def _kv_block(entry):
    return lax.shift_right_logical(entry, KV_BLOCK_SHIFT) & KV_BLOCK_MASK


@dataclasses.dataclass(frozen=True)
class _Pieces:
    """Reads of the piece table inside the kernel and its index maps (scalar code)."""

    entries: object  # SMEM ref, int32 [num_pieces]
    lengths: object | None  # SMEM ref, int32 [num_pieces], or None when slots == 1
    num_pieces: int

    def length(self, piece):
        return 1 if self.lengths is None else self.lengths[piece]

    def kv_block(self, piece, slot):
        # Slots past the piece's end repeat its last kv tile: the pipeline fetches nothing.
        last = self.length(piece) - 1
        return _kv_block(self.entries[piece]) + jnp.minimum(slot, last)

    def q_block(self, piece):
        return _q_block(self.entries[piece])


def _pieces(refs, num_pieces: int) -> _Pieces:
    return _Pieces(refs[0], refs[1] if len(refs) > 1 else None, num_pieces)


def _attention_kernel(*refs, shape: KernelShape, num_pieces: int, num_tables: int,
                      sm_scale: float, boundary_mask: BoundaryMask):
    (
        # prefetched scalars (SMEM): the piece table
        table_refs,
        # inputs (VMEM blocks)
        (q_ref, k_ref, v_ref),
        # outputs
        o_ref,
        # scratch, carried across the steps of one q tile
        (m_scratch, l_scratch, acc_scratch),
    ) = refs[:num_tables], refs[num_tables:num_tables + 3], refs[num_tables + 3], refs[-3:]
    pieces = _pieces(table_refs, num_pieces)
    piece, slot = pl.program_id(1), pl.program_id(2)
    entry = pieces.entries[piece]
    kind = entry & KIND_MASK
    q_block = _q_block(entry)
    length = pieces.length(piece)
    active = slot < length
    is_first = (slot == 0) & (
        (piece == 0) | (pieces.q_block(jnp.maximum(piece - 1, 0)) != q_block))
    is_last = (slot == length - 1) & (
        (piece == num_pieces - 1)
        | (pieces.q_block(jnp.minimum(piece + 1, num_pieces - 1)) != q_block))
    kv_block = pieces.kv_block(piece, slot)

    @pl.when(is_first)
    def init():
        m_scratch[...] = jnp.full(m_scratch.shape, MASK_VALUE, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    def online_softmax_update(masked: bool):
        q = q_ref[...]
        k = k_ref[...]
        v = v_ref[...]
        precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
        # Scaling q ([block_q, d]) is cheaper than scaling the [block_q, block_kv] scores.
        q = (q.astype(jnp.float32) * sm_scale).astype(q.dtype)
        scores = lax.dot_general(
            q, k, (((1,), (1,)), ((), ())),
            preferred_element_type=jnp.float32, precision=precision,
        )
        assert scores.shape == (shape.block_q, shape.block_kv)
        if masked:
            q_pos = q_block * shape.block_q + lax.broadcasted_iota(
                jnp.int32, (shape.block_q, 1), 0
            )
            k_pos = kv_block * shape.block_kv + lax.broadcasted_iota(
                jnp.int32, (1, shape.block_kv), 1
            )
            # Padding keys are never attended, whatever the predicate says about them.
            keep = boundary_mask(q_pos, k_pos) & (k_pos < shape.seq_len)
            scores = jnp.where(keep, scores, MASK_VALUE)
        # m and l are kept lane-replicated ([block_q, 128]): full vregs, no relayouts.
        m_prev = m_scratch[...]
        m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        # A row with no allowed key so far has m_next == MASK_VALUE and exp(0) = 1 on its
        # masked entries; the first allowed key rescales that away (alpha = 0), and a row
        # that never gets one is zeroed in finalize. So no select on the probabilities.
        probs = jnp.exp(scores - _lanes(m_next, shape.block_kv))
        alpha = jnp.exp(m_prev - m_next)
        l_scratch[...] = alpha * l_scratch[...] + jnp.sum(probs, axis=1, keepdims=True)
        pv = lax.dot_general(
            probs.astype(v.dtype), v, (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32, precision=precision,
        )
        acc_scratch[...] = _lanes(alpha, shape.head_dim) * acc_scratch[...] + pv
        m_scratch[...] = m_next

    @pl.when(active & (kind == TileKind.FULL))
    def full():
        online_softmax_update(masked=False)

    @pl.when(active & (kind == TileKind.BOUNDARY))
    def boundary():
        online_softmax_update(masked=True)

    @pl.when(is_last)
    def finalize():
        # Rows that saw no allowed key (m still MASK_VALUE) are 0, never NaN.
        seen = m_scratch[...] > 0.5 * MASK_VALUE
        inv = jnp.where(seen, 1.0 / jnp.where(seen, l_scratch[...], 1.0), 0.0)
        o_ref[...] = (acc_scratch[...] * _lanes(inv, shape.head_dim)).astype(o_ref.dtype)


def _lanes(x, width: int):
    """A lane-replicated [rows, 128] array as [rows, width] (width a multiple of 128, or less)."""
    if width <= LANES:
        return x[:, :width]
    return jnp.tile(x, (1, width // LANES))


def _flat_attention(q, k, v, table: PieceTable, *, shape, boundary_mask, interpret, sm_scale):
    """q, k, v: [batch*heads, padded_seq_len, head_dim] in kernel order."""
    operands = table.operands()
    kernel = functools.partial(
        _attention_kernel,
        shape=shape,
        num_pieces=table.num_pieces,
        num_tables=len(operands),
        sm_scale=sm_scale,
        boundary_mask=boundary_mask,
    )

    def q_index_map(head, piece, slot, *table_refs):
        return head, _pieces(table_refs, table.num_pieces).q_block(piece), 0

    def kv_index_map(head, piece, slot, *table_refs):
        return head, _pieces(table_refs, table.num_pieces).kv_block(piece, slot), 0

    d = shape.head_dim
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(operands),
        grid=(q.shape[0], table.num_pieces, table.slots),
        in_specs=[
            pl.BlockSpec((None, shape.block_q, d), q_index_map),
            pl.BlockSpec((None, shape.block_kv, d), kv_index_map),
            pl.BlockSpec((None, shape.block_kv, d), kv_index_map),
        ],
        out_specs=pl.BlockSpec((None, shape.block_q, d), q_index_map),
        scratch_shapes=[
            pltpu.VMEM((shape.block_q, LANES), jnp.float32),
            pltpu.VMEM((shape.block_q, LANES), jnp.float32),
            pltpu.VMEM((shape.block_q, d), jnp.float32),
        ],
    )
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
    )(*(jnp.asarray(t) for t in operands), q, k, v)


def make_attention(*, shape: KernelShape, runs, slots: int, boundary_mask: BoundaryMask):
    """The public `attention(q, k, v, *, interpret=False, sm_scale=None)` of a generated module.

    `runs` are the visited tiles as (q_block, kv_start, length, kind), cut into pieces of at
    most `slots` tiles. q, k, v are [heads, seq, head_dim] or [batch, heads, seq, head_dim] in
    the user's token order; the output has the shape and dtype of q.
    """
    table = PieceTable.from_runs(runs, slots)

    def attention(q, k, v, *, interpret=False, sm_scale: float | None = None):
        _check_operands(q, k, v, shape)
        lead = q.shape[:-2]
        if sm_scale is None:
            sm_scale = 1.0 / math.sqrt(shape.head_dim)
        pad = shape.padded_seq_len - shape.seq_len

        def to_kernel(x):
            x = x.reshape((-1,) + x.shape[-2:])
            return jnp.pad(x, ((0, 0), (0, pad), (0, 0))) if pad else x

        out = _flat_attention(
            to_kernel(q), to_kernel(k), to_kernel(v), table,
            shape=shape, boundary_mask=boundary_mask, interpret=interpret,
            sm_scale=float(sm_scale),
        )
        return out[:, : shape.seq_len].reshape(lead + (shape.seq_len, shape.head_dim))

    attention.table = table
    return attention


def _check_operands(q, k, v, shape: KernelShape) -> None:
    if q.ndim not in (3, 4):
        raise ValueError(
            f"q must be [heads, seq, head_dim] or [batch, heads, seq, head_dim], got {q.shape}"
        )
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v shapes differ: {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-2:] != (shape.seq_len, shape.head_dim):
        raise ValueError(
            f"this kernel was compiled for seq_len={shape.seq_len}, head_dim={shape.head_dim};"
            f" got q of shape {q.shape}"
        )
