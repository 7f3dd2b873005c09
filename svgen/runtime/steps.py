"""The SMEM step reader every svgen kernel shares (TPU forward and backward, GPU): what a grid
step works on, read from the piece tables.

Grid and tables
---------------
The visited tiles of a pattern, sorted by q tile, are grouped into *pieces*: up to `slots`
consecutive kv tiles of one q tile, one kind and one `blocks` word. A grid step (.., piece,
slot) visits kv tile kv_start + slot of a piece. Two ways to walk the heads:

  per head  grid (batch*heads, max pieces over patterns, slots): head h walks local pieces
            0..max; with one pattern every head has exactly that many;
  flat      grid (batch, total pieces of all heads, slots), with several patterns on a chip
            of one TensorCore: the heads' pieces one after another, so each head walks only
            its own pattern's pieces (per head, a head with a shorter pattern would step
            through the longest one's count, doing nothing). The grid's middle size is
            dynamic when head_pattern is traced. On chips with two TensorCores (v7x) the
            per-head walk stays: its head axis is what the cores split.

Scalar prefetch (SMEM) holds:

    head_pattern[heads]          the pattern of each head (a traced argument)
    head_first_piece[heads]      where the head's pattern's pieces start in `entries`
    head_num_pieces[heads]       (both gathered from per-pattern tables by the wrapper)
    head_first_step[heads]       flat: the head's first grid step (exclusive cumsum of counts)
    step_head[heads * max]       flat: the head of each grid step (int8, int16 past 127 heads)
    step_piece[heads * max]      flat: the piece of each grid step (int16, int32 past 32767)
    entries[all pieces]          q_block << 17 | kv_start << 2 | kind     (kind: TileKind)
    lengths[all pieces]          only when slots > 1 (int8, or int16 past 127)
    blocks[all pieces]           only with several compute blocks per tile (int8/16/32)
    chosen[all pieces]           only for a selection across run-time segments: which of
                                 the piece's SEGMENT_BOUNDARY blocks were chosen (int32)

One copy of each pattern's table, however many heads use it. Steps past a piece's length (or,
per head, past the head's pattern's pieces) are skipped and repeat the last blocks, so they
fetch nothing.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from svgen.core.tables import (
    BITS_PER_BLOCK,
    KV_BLOCK_MASK,
    KV_BLOCK_SHIFT,
    KIND_MASK,
    LANES,
    Q_BLOCK_SHIFT,
    KernelShape,
    PieceTables,
    piece_index_dtype,
    step_head_dtype,
)

# StepView.single_pattern_pieces of a grid exactly as long as every row's pieces.
EXACT_GRID = -1


def q_block_of(entry):
    return lax.shift_right_logical(entry, Q_BLOCK_SHIFT)


def kv_block_of(entry):
    return lax.shift_right_logical(entry, KV_BLOCK_SHIFT) & KV_BLOCK_MASK


@dataclasses.dataclass(frozen=True)
class StepView:
    """Reads of the SMEM tables for one grid step, in the kernel body and the index maps.

    refs: head_pattern, head_first_piece, head_num_pieces[, head_first_step, step_head,
    step_piece], entries[, lengths][, blocks] (see the module docstring). Every read is a
    short chain of SMEM loads from the grid indices: the scalar work of a step.
    """

    refs: tuple
    heads: int
    outer: object  # grid index 0: batch*heads (per head) or batch (flat)
    step: object  # grid index 1: the head's local piece (per head) or the global step (flat)
    # The piece count when there is one pattern: static, or EXACT_GRID (every row walks the
    # same pieces, from the first, and the grid is exactly as long: a one-pattern chunked
    # call), where no SMEM read is needed for it.
    single_pattern_pieces: int | None
    has_lengths: bool
    has_blocks: bool
    flat: bool
    # Run-time tables (svgen.runtime.segments): first piece and piece count per row (batch *
    # heads) instead of per head, and no static piece count.
    per_row: bool = False
    # A selection across run-time segments: the last table is each piece's chosen word.
    has_chosen: bool = False

    @property
    def head(self):
        """The head (0..heads-1) this step works for."""
        if self.flat:
            return self.refs[4][self.step].astype(jnp.int32)
        return self.outer % self.heads

    @property
    def row(self):
        """The step's row of the [batch*heads, seq, d] operands."""
        return self.outer * self.heads + self.head if self.flat else self.outer

    @property
    def pattern(self):
        if self.single_pattern_pieces is not None:
            return 0
        return self.refs[0][self.head]

    @property
    def count(self):
        if self.single_pattern_pieces == EXACT_GRID:
            return pl.num_programs(1)
        if self.single_pattern_pieces is not None:
            return self.single_pattern_pieces
        return self.refs[2][self.outer if self.per_row else self.head]

    @property
    def first_piece(self):
        if self.single_pattern_pieces is not None:
            return 0
        return self.refs[1][self.outer if self.per_row else self.head]

    @property
    def piece(self):
        """Index into `entries` of this step's piece (per head: clamped to the head's last)."""
        if self.flat:  # one load: the wrapper resolved (head, local piece) per step
            return self.refs[5][self.step].astype(jnp.int32)
        if self.single_pattern_pieces == EXACT_GRID:
            return self.step
        return self.first_piece + jnp.minimum(self.step, self.count - 1)

    @property
    def in_range(self):
        """The step is one of the head's pieces (per head: past them it only repeats)."""
        return (
            True
            if self.flat or self.single_pattern_pieces == EXACT_GRID
            else self.step < self.count
        )

    @property
    def is_first_piece(self):
        """The head's first piece."""
        return self.step == (self.refs[3][self.head] if self.flat else 0)

    @property
    def is_last_piece(self):
        if self.flat:
            return self.step == self.refs[3][self.head] + self.count - 1
        return self.step == self.count - 1

    @property
    def _entries_at(self) -> int:
        return 6 if self.flat else 3

    def entry(self, offset: int = 0):
        """The entry of this step's piece, or of the one `offset` pieces away (clamped to
        the table; read only where the head has such a piece)."""
        entries = self.refs[self._entries_at]
        piece = self.piece + offset
        if offset < 0:
            piece = jnp.maximum(piece, 0)
        elif offset > 0:
            piece = jnp.minimum(piece, entries.shape[0] - 1)
        return entries[piece]

    @property
    def length(self):
        if not self.has_lengths:
            return 1
        return self.refs[self._entries_at + 1][self.piece].astype(jnp.int32)

    @property
    def blocks(self):
        """The tile's `blocks` word (2 bits per compute block), sign extension masked off."""
        word = self.refs[self._entries_at + 1 + self.has_lengths][self.piece]
        bits = 8 * word.dtype.itemsize
        word = word.astype(jnp.int32)
        return word if bits == 32 else word & ((1 << bits) - 1)

    def chosen(self, block_index: int):
        """Whether the selection chose compute block `block_index` (row-major) of this
        step's piece: read only at its SEGMENT_BOUNDARY blocks."""
        word = self.refs[-1][self.piece]
        return (lax.shift_right_logical(word, block_index) & 1) == 1

    @property
    def q_block(self):
        return q_block_of(self.entry())

    def kv_block(self, slot):
        # Slots past the piece's end repeat its last kv tile: the pipeline fetches nothing.
        if not self.has_lengths:
            return kv_block_of(self.entry())
        return kv_block_of(self.entry()) + jnp.minimum(slot, self.length - 1)


def grid_step(
    table_refs,
    heads: int,
    single: int | None,
    has_lengths: bool,
    has_blocks: bool,
    flat: bool,
    per_row: bool = False,
    has_chosen: bool = False,
):
    """This grid step as the tables say, for the forward and the backward kernels alike:
    (view, kind, row tile, column tile, active, first step of the row tile, last step of
    it). Steps past a piece's length are inactive; the row tile's first step initializes
    its accumulators and its last writes them out."""
    view = StepView(
        table_refs,
        heads,
        pl.program_id(0),
        pl.program_id(1),
        single,
        has_lengths,
        has_blocks,
        flat,
        per_row,
        has_chosen,
    )
    slot = pl.program_id(2)
    entry = view.entry()
    row_tile = q_block_of(entry)
    length = view.length
    active = view.in_range & (slot < length)
    is_first = (
        active & (slot == 0) & (view.is_first_piece | (q_block_of(view.entry(-1)) != row_tile))
    )
    is_last = (
        active
        & (slot == length - 1)
        & (view.is_last_piece | (q_block_of(view.entry(+1)) != row_tile))
    )
    return view, entry & KIND_MASK, row_tile, view.kv_block(slot), active, is_first, is_last


def lanes(x, width: int):
    """A lane-replicated [rows, 128] array as [rows, width] (a multiple of 128, or less)."""
    if width <= LANES:
        return x[:, :width]
    return jnp.tile(x, (1, width // LANES))


@dataclasses.dataclass(frozen=True)
class Block:
    """One compute block of the current tile: its rows and columns inside the VMEM blocks."""

    qi: int
    ki: int
    shape: KernelShape

    @property
    def rows(self):
        return pl.ds(self.qi * self.shape.cq, self.shape.cq)

    @property
    def cols(self):
        return pl.ds(self.ki * self.shape.ckv, self.shape.ckv)

    @property
    def index(self) -> int:
        """The block's place in the tile, row-major (as in a blocks word)."""
        return self.qi * self.shape.kv_blocks_per_tile + self.ki

    @property
    def bit(self) -> int:
        return BITS_PER_BLOCK * self.index


def head_operands(tables: PieceTables, head_pattern, static_pattern, only_pattern=None):
    """The per-head scalar-prefetch operands and the grid's middle size (see the module
    docstring); static_pattern: head_pattern as NumPy when it is not traced. only_pattern:
    the flat walk of that pattern's heads only (one kernel call per pattern): every other
    head has no pieces, so its rows are neither read nor written."""
    heads = int(head_pattern.shape[0])
    # Per head, where its pattern's pieces are: one SMEM read per lookup instead of two.
    head_first = jnp.asarray(tables.first_piece)[head_pattern]
    head_count = jnp.asarray(tables.num_pieces)[head_pattern]
    if only_pattern is not None:
        assert tables.flat, "one call per pattern walks the heads flat"
        head_count = jnp.where(head_pattern == only_pattern, head_count, 0).astype(jnp.int32)
        if static_pattern is not None:
            static_pattern = np.where(static_pattern == only_pattern, only_pattern, -1)
    operands = (head_pattern, head_first, head_count)
    if not tables.flat:
        return operands, tables.max_pieces
    first_step = (jnp.cumsum(head_count) - head_count).astype(jnp.int32)
    bound = heads * tables.max_pieces  # the most steps any assignment can have
    step_head = jnp.repeat(
        jnp.arange(heads, dtype=jnp.int32), head_count, total_repeat_length=bound
    )
    # Per step, its piece in `entries`: one SMEM load instead of a chain of them.
    step_piece = head_first[step_head] + jnp.arange(bound, dtype=jnp.int32) - first_step[step_head]
    step_piece = jnp.clip(step_piece, 0, tables.entries.shape[0] - 1)
    if static_pattern is not None:
        chosen = static_pattern[static_pattern >= 0]
        steps = int(tables.num_pieces[chosen].sum())
    else:  # a dynamic grid size: Mosaic reads it at run time
        steps = jnp.sum(head_count)
    return operands + (
        first_step,
        step_head.astype(step_head_dtype(heads)),
        step_piece.astype(piece_index_dtype(tables)),
    ), steps


def scratch_buffer(operand):
    """A kernel's scratch buffer as its variant declares it (svgen.runtime.variant.Operand)."""
    from jax.experimental.pallas import tpu as pltpu

    if operand.memory == "dma_semaphore":
        return pltpu.SemaphoreType.DMA(operand.shape)
    memory = pltpu.SMEM if operand.memory == "smem" else pltpu.VMEM
    return memory(operand.shape, jnp.dtype(operand.dtype))


def walk_view(table_refs, walk, outer, step) -> StepView:
    """The StepView of a kernel's walk (svgen.runtime.variant.TableWalk) at grid indices
    (outer, step): what its index maps read."""
    return StepView(
        table_refs,
        walk.heads,
        outer,
        step,
        walk.single,
        walk.has_lengths,
        walk.has_blocks,
        walk.flat,
        walk.per_row,
        walk.has_chosen,
    )


def walk_step(table_refs, walk):
    """grid_step for a kernel's walk (svgen.runtime.variant.TableWalk)."""
    return grid_step(
        table_refs,
        walk.heads,
        walk.single,
        walk.has_lengths,
        walk.has_blocks,
        walk.flat,
        walk.per_row,
        walk.has_chosen,
    )
