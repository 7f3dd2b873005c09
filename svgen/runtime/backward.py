"""The backward pass of svgen's block-sparse attention: dq, dk, dv from the same tables.

Scores are in base 2 (q arrives scaled by sm_scale * log2(e), as in the forward pass), the
forward saves each row's log-sum-exp `lse` of them (lane-major, [rows, 1, padded_seq_len]),
and with p = exp2(s - lse), D = rowsum(dO * o):

    dv = p^T dO      dp = dO v^T      ds = p * (dp - D)      dq = ds k * sm_scale
    dk = ds^T q * sm_scale  (= ds^T q_scaled / log2(e))

Two kernels, each a `pallas_call` over its own tables:
  dq    walks the forward tables (per q tile, its kv tiles), accumulating dq of the q tile;
  dkv   walks the *transposed* tables (per kv tile, the q tiles that visit it), computing
        p^T and ds^T directly in [keys, queries] orientation so that lse and D broadcast as
        lane-major rows, accumulating dk and dv of the kv tile.
Both run FULL compute blocks without a mask and BOUNDARY ones with the pattern's own
`boundary_mask` (evaluated with the key coordinates as columns in dkv: keep^T).

The operands are zero-padded to whole tiles here (the backward is not where the HBM passes
matter most), and padded query rows carry lse = EMPTY_ROW_LSE: their probabilities are 0, so
padding contributes nothing and needs no test; padded key rows of dk, dv are cut off.
Rows with no allowed key have that lse too: zero gradient, never NaN.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime import kernel as fwd
from svgen.runtime.coords import QueryCoords, TokenCoords
from svgen.runtime.kinds import TileKind

SMEM_BUDGET = 1 << 20  # bytes: one TPU TensorCore's SMEM, as the compiler assumes


# ----------------------------------------------------------------------------- tables
def compute_block_kinds(runs, num_q_tiles: int, num_kv_tiles: int, rq: int,
                        rk: int) -> np.ndarray:
    """int8 [num_q_tiles * rq, num_kv_tiles * rk]: each compute block's kind, read back from
    a pattern's runs (tile kinds and blocks words; zero-fill steps visit nothing)."""
    runs = fwd.as_runs(runs)
    kinds = np.zeros((num_q_tiles, num_kv_tiles, rq * rk), np.int8)
    shifts = fwd.BITS_PER_BLOCK * np.arange(rq * rk)
    for q_tile, start, length, kind, word in runs.tolist():
        if kind == TileKind.FULL:
            kinds[q_tile, start:start + length] = TileKind.FULL
        elif kind == TileKind.BOUNDARY:
            block = (word >> shifts) & fwd.KIND_MASK if rq * rk > 1 else [TileKind.BOUNDARY]
            kinds[q_tile, start:start + length] = np.asarray(block, np.int8)
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
    shifts = fwd.BITS_PER_BLOCK * np.arange(rq * rk, dtype=np.int64)
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
            if out and out[-1][0] == r and out[-1][1] + out[-1][2] == c and out[-1][3] == k \
                    and out[-1][4] == w:
                out[-1][2] += 1
            else:
                out.append([r, c, 1, k, w])
            last = c
    return np.asarray(out, np.int64).reshape(-1, fwd.RUN_COLUMNS)


def transposed_runs(runs, shape: fwd.KernelShape) -> np.ndarray:
    """The runs of the same visited compute blocks seen from the keys: per kv tile, the q
    tiles (and per tile, which of its [ckv x cq] blocks are FULL / BOUNDARY)."""
    num_q = -(-shape.seq_len // shape.block_q)
    num_kv = -(-shape.seq_len // shape.block_kv)
    rq, rk = shape.q_blocks_per_tile, shape.kv_blocks_per_tile
    blocks = compute_block_kinds(runs, num_q, num_kv, rq, rk)
    return runs_of_blocks(blocks.T, num_kv, num_q, rk, rq)


def transposed_shape(shape: fwd.KernelShape) -> fwd.KernelShape:
    """The dkv kernel's shape: rows are keys, columns queries."""
    return dataclasses.replace(shape, block_q=shape.block_kv, block_kv=shape.block_q,
                               compute_q=shape.ckv, compute_kv=shape.cq)


def transposed_tables(runs_per_pattern: Sequence, shape: fwd.KernelShape, heads: int,
                      smem_budget: int = SMEM_BUDGET) -> fwd.PieceTables:
    """The dkv kernel's SMEM tables: the smallest piece size that fits the budget (the same
    rule as the forward's); ValueError when none does."""
    runs = [transposed_runs(r, shape) for r in runs_per_pattern]
    flat = fwd.walks_flat(len(runs), shape.tensor_cores)
    slots = 1
    while True:
        tables = fwd.PieceTables.from_runs(runs, slots, shape.compute_blocks, flat)
        if tables.scalar_prefetch_bytes(heads) <= smem_budget:
            return tables
        if slots >= 256:
            raise ValueError(f"the backward (dk, dv) tables need "
                             f"{tables.scalar_prefetch_bytes(heads):,} bytes of SMEM, over "
                             f"{smem_budget:,}: use larger tiles")
        slots *= 2


# ----------------------------------------------------------------------------- kernels
def _dot(a, b, contract_a: int, contract_b: int):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                           preferred_element_type=jnp.float32, precision=precision)


def _walk(kernel_body, *, tables: fwd.PieceTables, head_pattern, static_pattern, shape,
          inputs, in_blocks, outputs, scratch, interpret, name):
    """One pallas_call over `tables` (forward or transposed) for every head: the grid and
    index maps of the forward kernel; `in_blocks` / `outputs` say per operand whether it is
    indexed by the step's row tile ("row"), column tile ("col") or is a lane-major
    [rows, 1, padded] row vector indexed by the row ("row_vec") or column ("col_vec") tile."""
    heads = int(head_pattern.shape[0])
    head_operands, steps = fwd._head_operands(tables, head_pattern, static_pattern)
    operands = head_operands + tuple(jnp.asarray(t) for t in tables.piece_operands())
    single = tables.max_pieces if tables.num_pieces.size == 1 else None
    has_lengths, has_blocks = tables.lengths is not None, tables.blocks is not None

    def view(outer, step, refs):
        return fwd._StepView(refs, heads, outer, step, single, has_lengths, has_blocks,
                             tables.flat)

    def spec(kind: str, d: int):
        def index_map(outer, step, slot, *refs):
            at = view(outer, step, refs)
            tile = at.q_block if kind.startswith("row") else at.kv_block(slot)
            return (at.row, 0, tile) if kind.endswith("vec") else (at.row, tile, 0)
        size = shape.block_q if kind.startswith("row") else shape.block_kv
        block = (None, 1, size) if kind.endswith("vec") else (None, size, d)
        return pl.BlockSpec(block, index_map)

    d = shape.head_dim
    body = functools.partial(kernel_body, shape=shape, heads=heads, num_tables=len(operands),
                             num_inputs=len(inputs), single=single, has_lengths=has_lengths,
                             has_blocks=has_blocks, flat=tables.flat)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(operands),
        grid=(inputs[0].shape[0] // heads if tables.flat else inputs[0].shape[0], steps,
              tables.slots),
        in_specs=[spec(kind, d) for kind in in_blocks],
        out_specs=[spec("row", d) for _ in outputs],
        scratch_shapes=scratch,
    )
    return pl.pallas_call(
        body, grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outputs],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=interpret, name=name,
    )(*operands, *inputs)


def _step(refs, shape, heads, num_tables, single, has_lengths, has_blocks, flat):
    """The tables' view of this grid step: (view, kind, row tile, column tile, active,
    first step of the row tile, last step of it)."""
    view = fwd._StepView(refs[:num_tables], heads, pl.program_id(0), pl.program_id(1), single,
                         has_lengths, has_blocks, flat)
    slot = pl.program_id(2)
    entry = view.entry()
    row_tile = fwd._q_block(entry)
    length = view.length
    active = view.in_range & (slot < length)
    is_first = active & (slot == 0) & (
        view.is_first_piece | (fwd._q_block(view.entry(-1)) != row_tile))
    is_last = active & (slot == length - 1) & (
        view.is_last_piece | (fwd._q_block(view.entry(+1)) != row_tile))
    return view, entry & fwd.KIND_MASK, row_tile, view.kv_block(slot), active, is_first, is_last


def _run_blocks(view, kind, active, blocks, shape, masks, update):
    """FULL tiles: every compute block unmasked; BOUNDARY tiles: each block by its kind,
    masked with the head's pattern's mask (update(block, mask_or_None))."""
    @pl.when(active & (kind == TileKind.FULL))
    def _():
        for block in blocks:
            update(block, None)

    for index, mask in enumerate(masks):
        is_pattern = True if len(masks) == 1 else view.pattern == index

        @pl.when(active & (kind == TileKind.BOUNDARY) & is_pattern)
        def _(mask=mask):
            if not view.has_blocks:
                update(blocks[0], mask)
                return
            word = view.blocks
            for block in blocks:
                block_kind = lax.shift_right_logical(word, block.bit) & fwd.KIND_MASK
                pl.when(block_kind == TileKind.FULL)(functools.partial(update, block, None))
                pl.when(block_kind == TileKind.BOUNDARY)(
                    functools.partial(update, block, mask))


def _dq_kernel(*refs, shape, heads, num_tables, num_inputs, single, has_lengths, has_blocks,
               flat, patterns, sm_scale):
    q_ref, k_ref, v_ref, do_ref, lse_ref, d_ref = refs[num_tables:num_tables + num_inputs]
    dq_ref = refs[num_tables + num_inputs]
    acc, lse_col, d_col = refs[num_tables + num_inputs + 1:]
    view, kind, q_tile, kv_tile, active, is_first, is_last = _step(
        refs, shape, heads, num_tables, single, has_lengths, has_blocks, flat)
    blocks = [fwd._Block(qi, ki, shape) for qi in range(shape.q_blocks_per_tile)
              for ki in range(shape.kv_blocks_per_tile)]

    @pl.when(is_first)
    def _():
        acc[...] = jnp.zeros(acc.shape, jnp.float32)
        # lse and D as lane-replicated columns, once per q tile.
        lse_col[...] = jnp.broadcast_to(jnp.transpose(lse_ref[...]), lse_col.shape)
        d_col[...] = jnp.broadcast_to(jnp.transpose(d_ref[...]), d_col.shape)

    def update(block, pattern):
        q, do = q_ref[block.rows, :], do_ref[block.rows, :]
        k, v = k_ref[block.cols, :], v_ref[block.cols, :]
        p = jnp.exp2(_dot(q, k, 1, 1) - fwd._lanes(lse_col[block.rows, :], shape.ckv))
        if pattern is not None:
            p = jnp.where(_keep(pattern, q_tile, kv_tile, block, shape), p, 0.0)
        ds = p * (_dot(do, v, 1, 1) - fwd._lanes(d_col[block.rows, :], shape.ckv))
        acc[block.rows, :] += _dot(ds.astype(k.dtype), k, 1, 0)

    _run_blocks(view, kind, active, blocks, shape, patterns, update)

    @pl.when(is_last)
    def _():
        dq_ref[...] = (acc[...] * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs, shape, heads, num_tables, num_inputs, single, has_lengths, has_blocks,
                flat, patterns, sm_scale):
    """shape is transposed: rows (block_q, cq) are keys, columns queries."""
    k_ref, v_ref, q_ref, do_ref, lse_ref, d_ref = refs[num_tables:num_tables + num_inputs]
    dk_ref, dv_ref = refs[num_tables + num_inputs:num_tables + num_inputs + 2]
    dk_acc, dv_acc = refs[num_tables + num_inputs + 2:]
    view, kind, kv_tile, q_tile, active, is_first, is_last = _step(
        refs, shape, heads, num_tables, single, has_lengths, has_blocks, flat)
    blocks = [fwd._Block(ki, qi, shape) for ki in range(shape.q_blocks_per_tile)
              for qi in range(shape.kv_blocks_per_tile)]

    @pl.when(is_first)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    def update(block, pattern):
        k, v = k_ref[block.rows, :], v_ref[block.rows, :]
        q, do = q_ref[block.cols, :], do_ref[block.cols, :]
        lse, dd = lse_ref[:, block.cols], d_ref[:, block.cols]  # [1, cq]: lane-major rows
        p_t = jnp.exp2(_dot(k, q, 1, 1) - lse)
        if pattern is not None:
            p_t = jnp.where(_keep_t(pattern, kv_tile, q_tile, block, shape), p_t, 0.0)
        dv_acc[block.rows, :] += _dot(p_t.astype(do.dtype), do, 1, 0)
        ds_t = p_t * (_dot(v, do, 1, 1) - dd)
        dk_acc[block.rows, :] += _dot(ds_t.astype(q.dtype), q, 1, 0)

    _run_blocks(view, kind, active, blocks, shape, patterns, update)

    @pl.when(is_last)
    def _():
        # q arrived scaled by sm_scale * log2(e): dk = ds^T q * sm_scale.
        dk_ref[...] = (dk_acc[...] * (1.0 / fwd.LOG2_E)).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _positions(tile, size: int, index: int, width: int):
    return tile * size + index * width + lax.broadcasted_iota(jnp.int32, (1, width), 1)


def _keep(pattern, q_tile, kv_tile, block, shape):
    """keep [cq, ckv] of a dq block (queries decoded in row form, read as columns)."""
    q = QueryCoords(_positions(q_tile, shape.block_q, block.qi, shape.cq), pattern.layout)
    k = TokenCoords(_positions(kv_tile, shape.block_kv, block.ki, shape.ckv), pattern.layout)
    return jnp.broadcast_to(pattern.boundary_mask(q, k), (shape.cq, shape.ckv))


def _keep_t(pattern, kv_tile, q_tile, block, shape):
    """keep^T [ckv, cq] of a dkv block: the same mask with keys as columns, queries as rows
    (shape is transposed: block.qi indexes keys)."""
    k = QueryCoords(_positions(kv_tile, shape.block_q, block.qi, shape.cq), pattern.layout)
    q = TokenCoords(_positions(q_tile, shape.block_kv, block.ki, shape.ckv), pattern.layout)
    return jnp.broadcast_to(pattern.boundary_mask(q, k), (shape.cq, shape.ckv))


# ----------------------------------------------------------------------------- the call
def backward(q_scaled, k, v, o, lse, do, head_pattern, static_pattern, *,
             forward_tables: fwd.PieceTables, dkv_tables: fwd.PieceTables, patterns,
             shape: fwd.KernelShape, sm_scale: float, interpret):
    """dq, dk, dv [rows, seq_len, d] (kernel order) of the forward call that gave o, lse."""
    pad = shape.padded_seq_len - shape.seq_len
    rows_pad = ((0, 0), (0, pad), (0, 0))
    zero = functools.partial(jnp.pad, pad_width=rows_pad)
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)  # D = rowsum
    delta = jnp.pad(delta, ((0, 0), (0, pad)))[:, None, :]
    qp, kp, vp, dop = zero(q_scaled), zero(k), zero(v), zero(do)
    d = shape.head_dim
    common = dict(head_pattern=head_pattern, static_pattern=static_pattern,
                  interpret=interpret)
    dq = _walk(
        functools.partial(_dq_kernel, patterns=patterns, sm_scale=sm_scale),
        tables=forward_tables, shape=shape, inputs=(qp, kp, vp, dop, lse, delta),
        in_blocks=("row", "col", "col", "row", "row_vec", "row_vec"), outputs=(qp,),
        scratch=[pltpu.VMEM((shape.block_q, d), jnp.float32),
                 pltpu.VMEM((shape.block_q, fwd.LANES), jnp.float32),
                 pltpu.VMEM((shape.block_q, fwd.LANES), jnp.float32)],
        name="svgen_attention_dq", **common)[0]
    t_shape = transposed_shape(shape)
    dk, dv = _walk(
        functools.partial(_dkv_kernel, patterns=patterns, sm_scale=sm_scale),
        tables=dkv_tables, shape=t_shape, inputs=(kp, vp, qp, dop, lse, delta),
        in_blocks=("row", "row", "col", "col", "col_vec", "col_vec"), outputs=(kp, vp),
        scratch=[pltpu.VMEM((t_shape.block_q, d), jnp.float32),
                 pltpu.VMEM((t_shape.block_q, d), jnp.float32)],
        name="svgen_attention_dkv", **common)
    cut = slice(0, shape.seq_len)
    return dq[:, cut], dk[:, cut], dv[:, cut]
