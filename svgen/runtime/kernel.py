"""The invariant part of every svgen kernel: block-sparse flash attention over piece tables.

A generated module supplies only what depends on its spec: per candidate pattern its visited
tiles (runs), its token layout and `boundary_mask(q_pos, k_pos)`; and the default assignment
of heads to patterns. Everything here is shared, so diffs between generated files show only
spec-dependent code.

Grid and tables
---------------
The visited tiles of a pattern, sorted by q tile, are grouped into *pieces*: up to `slots`
consecutive kv tiles of one q tile and one kind. The grid is
(batch*heads, max pieces over patterns, slots); for head h, grid step (piece, slot) visits
kv tile kv_start + slot of piece `piece` of the head's pattern. Scalar prefetch (SMEM) holds:

    head_pattern[heads]          the pattern of each head (a traced argument)
    head_first_piece[heads]      where the head's pattern's pieces start in `entries`
    head_num_pieces[heads]       (both gathered from per-pattern tables by the wrapper)
    entries[all pieces]          q_block << 17 | kv_start << 2 | kind     (kind: TileKind)
    lengths[all pieces]          only when slots > 1 (int8, or int16 past 127)

One copy of each pattern's table, however many heads use it. Steps past a piece's length or
past the head's pattern's pieces are skipped and repeat the last blocks, so they fetch nothing.
slots = 1 is one entry per visited tile (no skipped steps for a single pattern); larger pieces
trade a few skipped steps for tables that fit the 1 MiB of SMEM (the compiler picks the
smallest slots that fit its budget).

A q tile's pieces are consecutive, so the q tile and output block stay resident while its kv
tiles stream past. EMPTY tiles cost no grid step; a q tile with no visited tile gets one EMPTY
piece that only writes zeros.

Per step (names of the phases as in the code):
  init      first step of a q tile: reset the running max, denominator and accumulator;
  full      kind FULL: online-softmax update with no mask;
  boundary  kind BOUNDARY: the same update with the head's pattern's keep(q, k) computed
            from coordinates (one branch per pattern);
  finalize  last step of a q tile: write acc / l, or 0 where no key was allowed (never NaN).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime.coords import KernelLayout
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
    """Packed int32 entries (see the module docstring)."""
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
class PieceTables:
    """The SMEM tables of all candidate patterns (see the module docstring)."""

    first_piece: np.ndarray  # int32 [patterns]
    num_pieces: np.ndarray  # int32 [patterns]
    entries: np.ndarray  # int32 [all pieces]
    lengths: np.ndarray | None  # int8/int16 [all pieces], None when slots == 1
    slots: int

    @classmethod
    def from_runs(cls, runs_per_pattern: Sequence, slots: int) -> "PieceTables":
        pieces = [split_runs(runs, slots) for runs in runs_per_pattern]
        counts = np.array([len(p) for p in pieces], np.int32)
        first = (np.cumsum(counts) - counts).astype(np.int32)
        allp = np.concatenate(pieces)
        entries = pack_steps(allp[:, 0], allp[:, 1], allp[:, 3])
        # The smallest integer type that holds a piece length (SMEM is 1 MiB).
        lengths = allp[:, 2].astype(np.int8 if slots < 128 else np.int16) if slots > 1 else None
        return cls(first, counts, entries, lengths, slots)

    @property
    def max_pieces(self) -> int:
        return int(self.num_pieces.max())

    def scalar_prefetch_bytes(self, heads: int) -> int:
        """Bytes of SMEM: per head its pattern, first piece and piece count; the pieces."""
        return int(12 * heads + self.entries.nbytes
                   + (0 if self.lengths is None else self.lengths.nbytes))

    def piece_operands(self) -> tuple[np.ndarray, ...]:
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


@dataclasses.dataclass(frozen=True)
class Pattern:
    """One candidate pattern of a generated module."""

    name: str
    runs: object  # (q_block, kv_start, length, kind) rows
    layout: KernelLayout
    boundary_mask: BoundaryMask


def _q_block(entry):
    return lax.shift_right_logical(entry, Q_BLOCK_SHIFT)


def _kv_block(entry):
    return lax.shift_right_logical(entry, KV_BLOCK_SHIFT) & KV_BLOCK_MASK


@dataclasses.dataclass(frozen=True)
class _TableView:
    """Reads of the SMEM tables for one head, inside the kernel and its index maps."""

    refs: tuple  # head_pattern, head_first_piece, head_num_pieces, entries[, lengths]
    heads: int
    head: object  # the flattened batch*head grid index
    single_pattern_pieces: int | None  # static piece count when there is one pattern

    @property
    def pattern(self):
        if self.single_pattern_pieces is not None:
            return 0
        return self.refs[0][self.head % self.heads]

    @property
    def count(self):
        if self.single_pattern_pieces is not None:
            return self.single_pattern_pieces
        return self.refs[2][self.head % self.heads]

    def piece(self, local):
        """Index into `entries` of the head's local piece (clamped to its last piece)."""
        if self.single_pattern_pieces is not None:  # static bounds: no table indirection
            return jnp.minimum(local, self.single_pattern_pieces - 1)
        return self.refs[1][self.head % self.heads] + jnp.minimum(local, self.count - 1)

    def entry(self, local):
        return self.refs[3][self.piece(local)]

    def length(self, local):
        return 1 if len(self.refs) < 5 else self.refs[4][self.piece(local)].astype(jnp.int32)

    def q_block(self, local):
        return _q_block(self.entry(local))

    def kv_block(self, local, slot):
        # Slots past the piece's end repeat its last kv tile: the pipeline fetches nothing.
        return _kv_block(self.entry(local)) + jnp.minimum(slot, self.length(local) - 1)


def _attention_kernel(*refs, shape: KernelShape, heads: int, num_tables: int, sm_scale: float,
                      boundary_masks: tuple[BoundaryMask, ...], single: int | None):
    (
        # prefetched scalars (SMEM): head_pattern, first_piece, num_pieces, entries[, lengths]
        table_refs,
        # inputs (VMEM blocks)
        (q_ref, k_ref, v_ref),
        # outputs
        o_ref,
        # scratch, carried across the steps of one q tile
        (m_scratch, l_scratch, acc_scratch),
    ) = refs[:num_tables], refs[num_tables:num_tables + 3], refs[num_tables + 3], refs[-3:]
    local, slot = pl.program_id(1), pl.program_id(2)
    view = _TableView(table_refs, heads, pl.program_id(0), single)
    count = view.count
    entry = view.entry(local)
    kind = entry & KIND_MASK
    q_block = _q_block(entry)
    length = view.length(local)
    active = (local < count) & (slot < length)
    is_first = active & (slot == 0) & (
        (local == 0) | (view.q_block(jnp.maximum(local - 1, 0)) != q_block))
    is_last = active & (slot == length - 1) & (
        (local == count - 1) | (view.q_block(local + 1) != q_block))
    kv_block = view.kv_block(local, slot)

    @pl.when(is_first)
    def init():
        m_scratch[...] = jnp.full(m_scratch.shape, MASK_VALUE, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

    def online_softmax_update(boundary_mask: BoundaryMask | None):
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
        if boundary_mask is not None:
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
        online_softmax_update(None)

    for index, mask in enumerate(boundary_masks):
        is_pattern = True if len(boundary_masks) == 1 else view.pattern == index

        @pl.when(active & (kind == TileKind.BOUNDARY) & is_pattern)
        def boundary():
            online_softmax_update(mask)

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


def _flat_attention(q, k, v, head_pattern, tables: PieceTables, boundary_masks, *, shape,
                    interpret, sm_scale):
    """q, k, v: [batch*heads, padded_seq_len, head_dim], each head in its pattern's order."""
    heads = int(head_pattern.shape[0])
    # Per head, where its pattern's pieces are: one SMEM read per lookup instead of two.
    head_first = jnp.asarray(tables.first_piece)[head_pattern]
    head_count = jnp.asarray(tables.num_pieces)[head_pattern]
    operands = (head_pattern, head_first, head_count) + tuple(
        jnp.asarray(t) for t in tables.piece_operands())
    single = tables.max_pieces if len(boundary_masks) == 1 else None
    kernel = functools.partial(
        _attention_kernel, shape=shape, heads=heads, num_tables=len(operands),
        sm_scale=sm_scale, boundary_masks=tuple(boundary_masks), single=single,
    )

    def q_index_map(head, local, slot, *table_refs):
        return head, _TableView(table_refs, heads, head, single).q_block(local), 0

    def kv_index_map(head, local, slot, *table_refs):
        return head, _TableView(table_refs, heads, head, single).kv_block(local, slot), 0

    d = shape.head_dim
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(operands),
        grid=(q.shape[0], tables.max_pieces, tables.slots),
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
        name="svgen_attention",  # the kernel's name in profiles and libtpu dumps
    )(*operands, q, k, v)


def _per_head_layout(x, layouts: list[KernelLayout], head_layout, to_kernel: bool):
    """Apply each head's layout permutation to x [..., heads, seq, d]."""
    move = (lambda lay, y: lay.to_kernel(y)) if to_kernel else (lambda lay, y: lay.from_kernel(y))
    if len(layouts) == 1:
        return move(layouts[0], x)
    out = move(layouts[0], x)
    for index, lay in enumerate(layouts[1:], start=1):
        out = jnp.where((head_layout == index)[:, None, None], move(lay, x), out)
    return out


def make_attention(*, shape: KernelShape, patterns: Sequence[Pattern], slots: int,
                   default_head_pattern: Sequence[int] | None):
    """The public `attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None)`.

    q, k, v are [heads, seq, head_dim] or [batch, heads, seq, head_dim] in the user's token
    order; the output has the shape and dtype of q. `head_pattern` (int [heads], may be traced)
    picks each head's pattern; it defaults to the spec's static assignment.
    """
    tables = PieceTables.from_runs([p.runs for p in patterns], slots)
    layouts: list[KernelLayout] = []
    for p in patterns:
        if p.layout not in layouts:
            layouts.append(p.layout)
    # NumPy here: importing a generated module must not start a JAX backend.
    layout_of_pattern = np.asarray([layouts.index(p.layout) for p in patterns], np.int32)
    boundary_masks = [p.boundary_mask for p in patterns]

    def attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None):
        _check_operands(q, k, v, shape)
        heads = q.shape[-3]
        if head_pattern is None:
            if default_head_pattern is None:
                raise ValueError("this kernel's patterns are assigned at run time: pass "
                                 "head_pattern (int [heads]), e.g. from profile()")
            if heads != shape.heads:
                raise ValueError(f"q has {heads} heads, the spec {shape.heads}: pass the "
                                 "head_pattern of these heads (e.g. its shard under shard_map)")
            head_pattern = default_head_pattern
        head_pattern = jnp.asarray(head_pattern, jnp.int32).reshape(heads)
        head_layout = jnp.asarray(layout_of_pattern)[head_pattern]
        lead = q.shape[:-2]
        if sm_scale is None:
            sm_scale = 1.0 / math.sqrt(shape.head_dim)
        pad = shape.padded_seq_len - shape.seq_len

        def to_kernel(x):
            x = _per_head_layout(x, layouts, head_layout, to_kernel=True)
            x = x.reshape((-1,) + x.shape[-2:])
            return jnp.pad(x, ((0, 0), (0, pad), (0, 0))) if pad else x

        out = _flat_attention(
            to_kernel(q), to_kernel(k), to_kernel(v), head_pattern, tables, boundary_masks,
            shape=shape, interpret=interpret, sm_scale=float(sm_scale),
        )
        out = out[:, : shape.seq_len].reshape(lead + (shape.seq_len, shape.head_dim))
        return _per_head_layout(out, layouts, head_layout, to_kernel=False)

    attention.tables = tables
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
