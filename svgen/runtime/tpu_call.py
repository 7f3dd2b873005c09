"""One pallas_call builder for svgen's TPU kernels: the forward kernel (svgen.runtime.forward)
and the backward pass's dq and dk/dv walks (svgen.runtime.backward).

Each of them walks piece tables on the grid (rows, steps, slots): the tables are prefetched
into SMEM, and every input's and output's block at a grid step is placed by an index map
that reads the step's entry from them (svgen.runtime.steps.StepView). What differs between
the kernels, their variants declare (svgen.runtime.variant): their operands by name, each
with its block and the name of the index map that places it. This module turns such a
declaration into the call:

* `TableSource` says where a call's tables come from (the module's compiled-in tables, a
  KV-cache chunk's, run-time segments', a selection's); `decode` is the one place that
  makes them into the kernels' scalar operands and walk (`ScalarTables`);
* `IndexMaps` holds the index maps the operands name;
* `KernelCall` makes the BlockSpecs, scratch, compiler parameters and the pallas_call, and
  passes the operands' values by name.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.core.tables import PieceTables
from svgen.runtime.interpret import settled
from svgen.runtime.steps import EXACT_GRID, head_operands, scratch_buffer, walk_view
from svgen.runtime.variant import Tables, TableWalk


# ------------------------------------------------------------------------ table sources
@dataclasses.dataclass(frozen=True)
class ScalarTables:
    """A decoded TableSource: the scalar-prefetch operands in the kernels' order, the grid's
    middle size (an int, or traced: a dynamic grid), the walk a step reads them with, and
    the slots of the grid's last axis."""

    kind: Tables
    operands: tuple
    steps: object
    walk: TableWalk
    slots: int


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: `own` holds traced arrays
class TableSource:
    """Where a call's tables come from (kind, svgen.runtime.variant.Tables):

    static     the module's compiled-in piece tables (only_pattern: the flat walk of that
               pattern's heads only, one call per pattern);
    segments   run-time segments' own tables (svgen.runtime.segments);
    selection  a selection's (svgen.runtime.select; across segments, a chosen word per piece);
    chunk      a KV-cache chunk's (svgen.runtime.chunks), with its per-row scalars.

    Every kind but static brings `own` tables (a segments.CallTables), read per row (batch x
    head). The module's PieceTables still say the slots, piece lengths and blocks words."""

    kind: Tables = "static"
    own: object = None
    # A chunk: per row its first query token, defined flag and ring shifts (the last scalar
    # operand), and whether the grid is exactly as long as every row's pieces (EXACT_GRID).
    row_scalars: object = None
    exact: bool = False
    only_pattern: int | None = None

    def for_pattern(self, index: int) -> "TableSource":
        """The same tables walked for pattern `index`'s heads only (static tables)."""
        return dataclasses.replace(self, only_pattern=index)

    def decode(
        self, tables: PieceTables, head_pattern, static_pattern, *, variants: bool = False
    ) -> ScalarTables:
        """The call's ScalarTables over the module's `tables`. static_pattern: head_pattern
        as NumPy when it is not traced. variants: the static tables' residual-mask variants
        word per piece as the last operand (the forward kernel reads it; the backward's run
        whole masks)."""
        heads = int(head_pattern.shape[0])
        if self.kind == "static":
            return self._static(tables, head_pattern, static_pattern, variants, heads)
        operands = self.own.scalar_operands(head_pattern)
        single, has_chosen = None, self.own.chosen is not None
        if self.kind == "chunk":
            operands += (self.row_scalars,)
            single, has_chosen = (EXACT_GRID if self.exact else None), False
        walk = TableWalk.of(tables, heads, single, False, True, has_chosen)
        return ScalarTables(self.kind, operands, self.own.steps, walk, tables.slots)

    def _static(self, tables, head_pattern, static_pattern, variants: bool, heads: int):
        per_head, steps = head_operands(tables, head_pattern, static_pattern, self.only_pattern)
        operands = per_head + tuple(jnp.asarray(t) for t in tables.piece_operands())
        if variants and tables.variants is not None:
            operands += (jnp.asarray(tables.variants),)
        single = tables.max_pieces if tables.num_pieces.size == 1 else None
        if self.only_pattern is not None:  # every head the call walks has this pattern's pieces
            single = int(tables.num_pieces[self.only_pattern])
        walk = TableWalk.of(tables, heads, single, tables.flat, False)
        return ScalarTables(self.kind, operands, steps, walk, tables.slots)


# ------------------------------------------------------------------------ index maps
@dataclasses.dataclass(frozen=True)
class IndexMaps:
    """The index maps a kernel's operands name (svgen.runtime.variant.Operand.index_map),
    for a walk whose row tiles are its entries' q_block and whose column tiles their
    kv_block (the dk/dv walk's transposed tables: kv tiles, then q tiles). They read the
    step's entry from the prefetched tables, in the grid's scalar prologue:

    row, col            the row or column tile's [rows, tile, d] block, or its box in the
                        user's order (`box`);
    row_vec, col_vec    lane-major vectors of the tile ([rows, n, tile]: lse, ids, scales);
    per_row             one block per row (the bounded softmax's key bound);
    blocks, blocks_t    a tile's block-table pieces, queries first (blocks_t: the walk is
                        transposed).
    """

    walk: TableWalk
    # A tile's box of the user's array (svgen.runtime.cube: CubeDma.box, PlaceBoxes.box);
    # None: [rows, seq, d] tiles in kernel order.
    box: Callable | None = None
    # A head run's call (svgen.runtime.forward): its row of q, k, v and o, as the tile maps
    # place them (row, col), and of the key bound (per_row); None: the rows are the
    # operands'. The vector maps place the call's own rows: its lse and modes (a head run
    # has no int8 scales and no run-time ids: svgen.runtime.kernel._head_runs).
    row_of: Callable | None = None
    # Whether a map reads the step's row before its tile (the forward's maps) or after (the
    # backward's). Both orders are in the kernels' lowered programs; each kernel keeps its
    # own, so that this builder changed none of them.
    row_first: bool = True

    def __getitem__(self, name: str) -> Callable:
        if name.startswith("blocks"):
            return functools.partial(self._blocks, name == "blocks_t")
        if name == "per_row":
            return self._per_row
        side, vector = name.removesuffix("_vec"), name.endswith("_vec")
        if side not in ("row", "col"):
            raise KeyError(f"no index map {name!r}")
        return functools.partial(self._tile, side == "row", vector)

    def _view(self, outer, step, table_refs):
        return walk_view(table_refs, self.walk, outer, step)

    def _tile(self, on_rows: bool, vector: bool, outer, step, slot, *table_refs):
        at = self._view(outer, step, table_refs)
        if self.row_first:
            row = at.row
            tile = at.q_block if on_rows else at.kv_block(slot)
        else:
            tile = at.q_block if on_rows else at.kv_block(slot)
            row = at.row
        if vector:
            return row, 0, tile
        if self.row_of is not None:
            row = self.row_of(row)
        return (row, tile, 0) if self.box is None else (row, *self.box(tile), 0)

    def _per_row(self, outer, step, slot, *table_refs):
        row = self._view(outer, step, table_refs).row
        # A head run's row of the key bound, which is every row's (the call's k's).
        return (row if self.row_of is None else self.row_of(row)), 0, 0

    def _blocks(self, transposed: bool, outer, step, slot, *table_refs):
        at = self._view(outer, step, table_refs)
        tiles = (at.q_block, at.kv_block(slot))
        return (*(tiles[::-1] if transposed else tiles), 0, 0)


# ------------------------------------------------------------------------ the call
@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One pallas_call of a TPU kernel as its variant declares it (variant.operands(): the
    scalar tables, inputs, outputs and scratch, by name)."""

    body: Callable  # the kernel: body(*refs, variant=variant)
    variant: object  # a ForwardVariant or BackwardVariant (svgen.runtime.variant)
    tables: ScalarTables
    maps: IndexMaps
    vmem_limit_bytes: int | None
    name: str  # the kernel's name in profiles and libtpu dumps
    interpret: object

    def __call__(self, rows: int, inputs: dict, out_shapes: dict) -> list:
        """The kernel's outputs, in its declared order. rows: the operands' rows (batch x
        heads; a flat walk's grid has one row per batch element). inputs: the value of every
        declared input, out_shapes: the jax.ShapeDtypeStruct of every output, by name."""
        declared = self.variant.operands()
        _check_names("input", declared, inputs)
        _check_names("output", declared, out_shapes)
        walk = self.tables.walk
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(self.tables.operands),
            grid=(rows // walk.heads if walk.flat else rows, self.tables.steps, self.tables.slots),
            in_specs=[self._spec(o) for o in declared if o.role == "input"],
            out_specs=[self._spec(o) for o in declared if o.role == "output"],
            scratch_shapes=[scratch_buffer(o) for o in declared if o.role == "scratch"],
        )
        outputs = pl.pallas_call(
            functools.partial(self.body, variant=self.variant),
            grid_spec=grid_spec,
            out_shape=[out_shapes[o.name] for o in declared if o.role == "output"],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                vmem_limit_bytes=self.vmem_limit_bytes,
            ),
            interpret=self.interpret,
            name=self.name,
            input_output_aliases=_aliases(declared),
        )(*self.tables.operands, *(inputs[o.name] for o in declared if o.role == "input"))
        return [settled(x, self.interpret) for x in outputs]

    def _spec(self, operand):
        if operand.index_map == "any":  # left in HBM: the kernel's own DMAs, or aliased
            return pl.BlockSpec(memory_space=pl.ANY)
        return pl.BlockSpec(operand.block, self.maps[operand.index_map])


def shape_of(x) -> jax.ShapeDtypeStruct:
    """An output of x's shape and dtype."""
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _check_names(role: str, declared, given: dict) -> None:
    names = [o.name for o in declared if o.role == role]
    if sorted(names) != sorted(given):
        raise ValueError(f"the kernel declares the {role}s {names}, the call gives {list(given)}")


def _aliases(declared) -> dict:
    """pallas_call's input_output_aliases: each input that is an output's buffer
    (Operand.aliases), by its place among the scalar tables and inputs, to that output's."""
    operands = [o for o in declared if o.role in ("scalar", "input")]
    outputs = [o.name for o in declared if o.role == "output"]
    return {i: outputs.index(o.aliases) for i, o in enumerate(operands) if o.aliases}
