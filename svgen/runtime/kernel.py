"""The invariant part of every svgen kernel: block-sparse flash attention over a step list.

A generated module supplies only what depends on its spec: the step table, the layout
constants and `boundary_mask(q_pos, k_pos)`. Everything here is shared, so diffs between
generated files show only spec-dependent code.

Grid and tables
---------------
The grid is (batch*heads, num_steps). Step s visits one (q tile, kv tile) pair, read from one
packed int32 per step in SMEM (scalar prefetch):

    entry = q_block << 17 | kv_block << 2 | kind        (kind: TileKind)

Steps are sorted by q tile, so the q tile and output block stay resident while its kv tiles
stream past; a step is the first (last) of its q tile when the previous (next) entry names
another q tile. The step list holds only visited tiles, so EMPTY tiles cost no grid step at
all; a q tile with no visited tile at all gets a single EMPTY step that writes zeros.

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


def expand_runs(runs: tuple[tuple[int, int, int, int], ...] | np.ndarray) -> np.ndarray:
    """Packed step table from runs (q_block, kv_start, length, kind), in table order."""
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 4)
    lengths = runs[:, 2]
    run_of_step = np.repeat(np.arange(len(runs)), lengths)
    offset_in_run = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return pack_steps(
        runs[run_of_step, 0], runs[run_of_step, 1] + offset_in_run, runs[run_of_step, 3]
    )


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


def _attention_kernel(
    # prefetched scalars (SMEM)
    steps_ref,
    # inputs (VMEM blocks)
    q_ref,
    k_ref,
    v_ref,
    # outputs
    o_ref,
    # scratch, carried across the steps of one q tile
    m_scratch,
    l_scratch,
    acc_scratch,
    *,
    shape: KernelShape,
    num_steps: int,
    sm_scale: float,
    boundary_mask: BoundaryMask,
):
    step = pl.program_id(1)
    entry = steps_ref[step]
    kind = entry & KIND_MASK
    q_block = _q_block(entry)
    is_first = (step == 0) | (_q_block(steps_ref[jnp.maximum(step - 1, 0)]) != q_block)
    is_last = (step == num_steps - 1) | (
        _q_block(steps_ref[jnp.minimum(step + 1, num_steps - 1)]) != q_block
    )

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
            k_pos = _kv_block(entry) * shape.block_kv + lax.broadcasted_iota(
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

    @pl.when(kind == TileKind.FULL)
    def full():
        online_softmax_update(masked=False)

    @pl.when(kind == TileKind.BOUNDARY)
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


def _flat_attention(q, k, v, steps, *, shape, boundary_mask, interpret, sm_scale):
    """q, k, v: [batch*heads, padded_seq_len, head_dim] in kernel order."""
    num_steps = int(steps.shape[0])
    kernel = functools.partial(
        _attention_kernel,
        shape=shape,
        num_steps=num_steps,
        sm_scale=sm_scale,
        boundary_mask=boundary_mask,
    )

    def q_index_map(head, step, steps_ref):
        return head, _q_block(steps_ref[step]), 0

    def kv_index_map(head, step, steps_ref):
        return head, _kv_block(steps_ref[step]), 0

    d = shape.head_dim
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(q.shape[0], num_steps),
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
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(steps, q, k, v)


def make_attention(*, shape: KernelShape, steps: np.ndarray, boundary_mask: BoundaryMask):
    """The public `attention(q, k, v, *, interpret=False, sm_scale=None)` of a generated module.

    q, k, v are [heads, seq, head_dim] or [batch, heads, seq, head_dim] in the user's token
    order; the output has the shape and dtype of q.
    """
    steps = np.asarray(steps, dtype=np.int32)

    def attention(q, k, v, *, interpret: bool = False, sm_scale: float | None = None):
        _check_operands(q, k, v, shape)
        lead = q.shape[:-2]
        if sm_scale is None:
            sm_scale = 1.0 / math.sqrt(shape.head_dim)
        pad = shape.padded_seq_len - shape.seq_len

        def to_kernel(x):
            x = x.reshape((-1,) + x.shape[-2:])
            return jnp.pad(x, ((0, 0), (0, pad), (0, 0))) if pad else x

        out = _flat_attention(
            to_kernel(q), to_kernel(k), to_kernel(v), jnp.asarray(steps),
            shape=shape, boundary_mask=boundary_mask, interpret=interpret,
            sm_scale=float(sm_scale),
        )
        return out[:, : shape.seq_len].reshape(lead + (shape.seq_len, shape.head_dim))

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
