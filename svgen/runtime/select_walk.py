"""A selection's walk: how the blocks a call selects become the kernels' per-row tables.

A selection (svgen.runtime.select) may choose any candidate block, so each walk (the
forward's, the dq kernel's, the dk/dv kernel's transposed one) visits, statically, the tiles
of always-kept + every candidate block (svgen.runtime.refine's StaticVisits: the static
maxima of steps and SMEM). Per call, each row's (batch x head) selection raises the
always-kept kinds of its blocks (a selected block is FULL, or PADDED where it holds the end
of the keys), and refine() compacts the visits' words into that row's pieces, at the static
maximum; across run-time segments a selected block is refined by the segment ids as well.
`call_tables` lays the rows' pieces out as the kernels' CallTables (svgen.runtime.segments).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from svgen.core.kinds import TileKind
from svgen.core.tables import BITS_PER_BLOCK, KernelShape, runs_of_blocks, runtime_table_bytes
from svgen.runtime.refine import (
    SEGMENT_BOUNDARY,
    StaticVisits,
    block_segments,
    chosen_bits,
    pack_words,
    refine,
    segment_block_kinds,
)
from svgen.runtime.segments import CallTables

# A selected compute block holding the end of the keys (forward tables only): unmasked but
# for its keys past seq_len. The one value of 2 bits that static tables never use.
PADDED = SEGMENT_BOUNDARY


@dataclasses.dataclass(frozen=True, eq=False)
class SelectionWalk:
    """One walk's static side: the visits of always-kept + every candidate block, and per
    visit its blocks' rows, columns, always-kept kinds and the kind a selection gives."""

    visits: StaticVisits
    rows: np.ndarray  # int32 [V, rq, 1]: each block's row among the walk's block rows
    cols: np.ndarray  # int32 [V, 1, rk]
    always: np.ndarray  # int32 [V, rq, rk]: the always-kept kind
    chosen: np.ndarray  # int32 [V, rq, rk]: a selected block's kind (FULL or PADDED)
    slots: int
    transposed: bool  # rows are key blocks: the selection is read transposed
    shape: KernelShape  # the walk's (transposed for dk/dv)
    padded: np.ndarray  # bool [V, rq, rk]: blocks whose selection makes them PADDED

    @classmethod
    def build(
        cls, always, selectable, shape: KernelShape, slots: int, padded_col, transposed=False
    ) -> "SelectionWalk":
        """always: int8 [R, C] compute block kinds; selectable: bool [R, C] (both in the
        walk's orientation); padded_col: the block column a selection makes PADDED (None:
        none); transposed: the walk's rows are key blocks."""
        rq, rk = shape.q_blocks_per_tile, shape.kv_blocks_per_tile
        rows_t, cols_t = always.shape[0] // rq, always.shape[1] // rk
        superset = np.where(selectable, TileKind.FULL, always).astype(np.int8)
        visits = StaticVisits.from_runs(runs_of_blocks(superset, rows_t, cols_t, rq, rk), rq, rk)
        rows = (visits.q_tile[:, None] * rq + np.arange(rq))[:, :, None]
        cols = (visits.kv_tile[:, None] * rk + np.arange(rk))[:, None, :]
        padded = np.zeros((visits.num_visits, rq, rk), bool)
        if padded_col is not None:
            padded = np.broadcast_to(cols == padded_col, padded.shape)
        chosen = np.where(padded, PADDED, int(TileKind.FULL)).astype(np.int32)
        return cls(
            visits,
            rows.astype(np.int32),
            cols.astype(np.int32),
            always[rows, cols].astype(np.int32),
            chosen,
            slots,
            transposed,
            shape,
            padded,
        )

    @property
    def max_pieces(self) -> int:
        return self.visits.max_pieces

    def words(self, selected):
        """int32 [V]: each visit's word for one row's selection bool [R, C]."""
        blocks = jnp.where(selected[self.rows, self.cols], self.chosen, self.always)
        rq, rk = self.visits.q_blocks_per_tile, self.visits.kv_blocks_per_tile
        shifts = BITS_PER_BLOCK * np.arange(rq * rk, dtype=np.int32).reshape(rq, rk)
        return jnp.sum(blocks << shifts, axis=(1, 2), dtype=jnp.int32)

    def tables(self, selected, ids=None) -> CallTables:
        """Per-row tables for selected bool [rows, R, C] (each row its own pieces); ids: a
        call's run-time ids (query, key) int32 [rows, seq] in each row's kernel order."""
        return call_tables(self.pieces(selected, ids), self.max_pieces)

    def pieces(self, selected, ids=None):
        """RefinedPieces of every row ([rows, max_pieces] each) for selected bool [rows, R,
        C], refined by the rows' run-time ids (query, key) when given."""
        if self.transposed:
            selected = jnp.swapaxes(selected, 1, 2)
        if ids is None:
            return jax.vmap(lambda s: refine(self.visits, self.words(s), self.slots))(selected)
        # The walk's rows are keys in the transposed (dk/dv) walk.
        row_ids, col_ids = ids[::-1] if self.transposed else ids
        return jax.vmap(self._segment_pieces)(selected, row_ids, col_ids)

    def _segment_pieces(self, selected, row_ids, col_ids):
        """One row's pieces across run-time segments: a chosen block is FULL inside one
        segment, SEGMENT_BOUNDARY across segments or where it holds the end of the keys (its
        chosen bit then says to keep every key of the segment), EMPTY where the segments of
        its queries and keys are disjoint; the other blocks as segment tables refine them
        (svgen.runtime.refine.segment_block_kinds)."""
        shape, visits = self.shape, self.visits
        num_rows = visits.num_q_tiles * visits.q_blocks_per_tile
        num_cols = -(-shape.seq_len // shape.block_kv) * visits.kv_blocks_per_tile
        ranges = block_segments(row_ids, col_ids, shape.cq, shape.ckv, num_rows, num_cols)
        chosen = selected[self.rows, self.cols]
        kinds = segment_block_kinds(
            visits,
            *ranges,
            static_kinds=jnp.where(chosen, int(TileKind.FULL), self.always),
            across_anyway=chosen & self.padded,
        )
        bits = chosen_bits(visits, chosen & (kinds == SEGMENT_BOUNDARY))
        return refine(visits, pack_words(visits, kinds), self.slots, bits)

    def smem_bytes(self, rows: int) -> int:
        compute_blocks = self.visits.compute_blocks
        return runtime_table_bytes([self.max_pieces], self.slots, compute_blocks, rows, 1)


def call_tables(per_row, max_pieces: int) -> CallTables:
    """The kernels' CallTables of per-row pieces ([rows, max_pieces] arrays): row r's at
    r * max_pieces."""
    rows = per_row.entries.shape[0]
    first = jnp.arange(rows, dtype=jnp.int32) * max_pieces
    flat = [None if x is None else x.reshape(-1) for x in per_row[:3]]
    counts = per_row.num_pieces.astype(jnp.int32)
    chosen = None if per_row.chosen is None else per_row.chosen.reshape(-1)
    return CallTables(first, counts, *flat, jnp.max(counts).astype(jnp.int32), chosen)
