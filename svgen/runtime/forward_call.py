"""One call of the forward kernel as svgen.runtime.kernel asks for it (`ForwardCall`), and what
follows from the call alone before svgen.runtime.forward.flat_attention builds the kernel:
the kernel's variant over the call's decoded tables, a head run's row map, the outputs'
shapes, and an aliased output padded to whole tiles for Pallas's interpreter."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from svgen.core.tables import LANES, KernelShape, PieceTables
from svgen.runtime.cube import CubeDma, PlaceBoxes
from svgen.runtime.tpu_call import ScalarTables, TableSource
from svgen.runtime.variant import ForwardVariant, PatternCode, block_table_shapes


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: its source and ids may be traced
class ForwardCall:
    """One call of the forward kernel as svgen.runtime.kernel asks for it (besides q, k, v,
    the heads' patterns and an aliased o: see svgen.runtime.forward.flat_attention).

    tables      the module's piece tables: they say the slots and the walk, and are the
                call's pieces where `source` is static;
    patterns    the patterns' code (a pattern's call: that pattern's only);
    source      where the call's tables come from (svgen.runtime.tpu_call.TableSource):
                the module's, run-time segments', a selection's, or a KV-cache chunk's (q
                then holds the chunk's rows only, k and v the whole sequence's, or with
                ring_sink a rolling cache's, shape.seq_len its length);
    ids         run-time (query ids, key ids) [batch*heads, id rows, seq_len] in kernel
                order: segment tables, or a selection across segments;
    cubes       box DMA (svgen.runtime.cube): q, k, v and o in the user's order, read and
                written as boxes;
    head_run    (first head, heads of q): the call works for the run of len(head_pattern)
                heads from that first one only (static tables), reading and writing their
                rows of q, k, v and o in place (and reading theirs of the key bound:
                row_map); its lse and modes hold those heads' rows only;
    with_lse    also return each row's log-sum-exp of its base-2 scores, f32 [rows, 1,
                padded_seq_len] (what the backward pass needs);
    with_modes  (shape.bounded_softmax) also return int32 [rows, 1, q tiles * 128], each q
                tile's softmax mode (1: it ran with the bound) in its 128 lanes.
    """

    tables: PieceTables
    patterns: tuple[PatternCode, ...]
    shape: KernelShape
    q_scale: float  # sm_scale * log2(e): q is scaled by it in init
    interpret: object
    source: TableSource = TableSource()
    ids: tuple = ()
    cubes: CubeDma | PlaceBoxes | None = None
    ring_sink: int | None = None
    head_run: tuple[int, int] | None = None
    with_lse: bool = False
    with_modes: bool = False

    @property
    def name(self) -> str:
        """The kernel's name in profiles and libtpu dumps (a pattern's call: its index)."""
        only = self.source.only_pattern
        return "svgen_attention" + ("" if only is None else f"_pattern{only}")

    def variant(self, tables: ScalarTables, q, o_aliased: bool) -> ForwardVariant:
        """The kernel's variant over the call's decoded tables; q: the call's as given (int8
        QK^T quantizes it later), whose dtype o has."""
        cubes = self.cubes
        return ForwardVariant(
            shape=self.shape,
            patterns=tuple(self.patterns),
            walk=tables.walk,
            tables=tables.kind,
            num_tables=len(tables.operands),
            dtype=jnp.dtype(q.dtype).name,
            q_scale=self.q_scale,
            with_lse=self.with_lse,
            with_modes=self.with_modes,
            q_rows=q.shape[1] if q.ndim == 3 else 0,
            chunk_rows=q.shape[0] if tables.kind == "chunk" else 0,
            ring_sink=self.ring_sink,
            cube=None if cubes is None else cubes.block,
            kv_cube=None if cubes is None else cubes.kv_block,
            box_q_places=0 if cubes is None else cubes.q_places,
            box_kv_places=0 if cubes is None else cubes.kv_places,
            id_rows=self.ids[0].shape[1] if self.ids else 0,  # 2: ids and frame shifts
            variants_table=self.tables.variants is not None,
            block_tables=block_table_shapes(self.patterns),
            o_aliased=o_aliased,
        )

    def row_map(self, heads: int):
        """A run of `heads` heads from head_run[0] among head_run[1]: its row b * heads + j
        is row b * head_run[1] + head_run[0] + j of q, k, v and o (and of the key bound,
        which is computed over every row). None: the rows are q's."""
        if self.head_run is None:
            return None
        first, all_heads = self.head_run

        def row_of(row):
            return lax.div(row, heads) * all_heads + first + lax.rem(row, heads)

        return row_of

    def whole_blocks(self, out):
        """`out` zero-padded to whole q tiles (interpret mode only: on a TPU the last block's
        DMA is cut at the array's end, aliased or not): its sequence, or a place box view's
        places (cubes divide the video: no partial block)."""
        cubes, shape = self.cubes, self.shape
        if isinstance(cubes, CubeDma):
            return out
        if cubes is None:
            extra, axis = shape.padded_seq_len - out.shape[1], 1
        else:
            extra, axis = shape.padded_seq_len // cubes.frames - out.shape[2], 2
        pad = [(0, 0)] * out.ndim
        pad[axis] = (0, extra)
        return jnp.pad(out, pad)

    def out_shapes(self, q, rows: int) -> dict:
        """o (of q's dtype), then the lse (the backward's residual) and the q tiles' softmax
        modes if asked (rows: the call's own, fewer than q's in a head run's call)."""
        out_shapes = {"o": jax.ShapeDtypeStruct(q.shape, q.dtype)}
        if self.with_lse:
            lse_length = _lse_length(q, self.shape, chunked=self.source.kind == "chunk")
            out_shapes["lse"] = jax.ShapeDtypeStruct((rows, 1, lse_length), jnp.float32)
        if self.with_modes:
            q_tiles = -(-q.shape[1] // self.shape.block_q)
            out_shapes["modes"] = jax.ShapeDtypeStruct((rows, 1, q_tiles * LANES), jnp.int32)
        return out_shapes


def _lse_length(q, shape: KernelShape, chunked: bool) -> int:
    """The lse rows: the padded sequence, or whole q tiles of a chunked call's rows (q is
    [rows, chunk tokens, d] then; with cube DMA it is 5-D, never chunked)."""
    if not chunked:
        return shape.padded_seq_len
    return -(-q.shape[1] // shape.block_q) * shape.block_q
