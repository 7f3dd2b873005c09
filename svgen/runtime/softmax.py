"""The softmax every svgen kernel shares: its numbers (the TPU forward and backward, the GPU
forward), and the TPU forward's update step, online or with a bounded max."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np
from jax import lax

from svgen.runtime.steps import lanes
from svgen.core.tables import LANES

if TYPE_CHECKING:
    from svgen.core.tables import KernelShape

LOG2_E = 1.4426950408889634
# Finite "minus infinity": exp2(MASK_VALUE - m) underflows to 0 without inf - inf = NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# The log-sum-exp saved for the backward pass of a row with no allowed key: exp2(s - it) = 0
# for every score, so the row gets no probability and no gradient.
EMPTY_ROW_LSE = -MASK_VALUE


# Bounded max (attention.softmax: bounded): a q tile runs without a running max when its
# bound R = max over its real rows of |q_row| * max_k |k| (in the kernel's base-2 score units)
# is at most this; every row of the tile subtracts that one R. A row's best score s* >=
# -|q_row| max|k| >= -R (Cauchy-Schwarz), so its largest probability exp2(s* - R) >= 2^-80: a
# normal f32 and bf16 number with 2^46 of range left below it for the products with v and
# the terms 2^-24 under it, so the row keeps the precision of the online softmax and never
# sums to 0 (which would read as a row with no key). Scores never exceed R by more than
# rounding (R's own is 2^-10 relative, bounded_init: exp2 of at most 0.04), so nothing
# overflows. Past the limit the tile runs online.
BOUND_LIMIT = 40.0


def key_bound(k):
    """f32 [rows, 1, 128]: per row (batch x head) of k [rows, seq, d] (or the cube DMA's
    [rows, frames, height, width, d]) the largest key norm, lane-replicated: what a bounded
    kernel reads per row. One XLA reduction over k, which reads it once."""
    k32 = k.astype(jnp.float32)
    norms = jnp.sqrt(jnp.sum(k32 * k32, axis=-1))
    largest = jnp.max(norms.reshape(norms.shape[0], -1), axis=1)
    return jnp.broadcast_to(largest[:, None, None], (k.shape[0], 1, LANES))


def bounded_init(q_scaled, key_bound_ref, mode_ref, q_block, q_rows: int, shape: "KernelShape"):
    """A bounded kernel's init: the tile's bound R (see `BOUND_LIMIT`) and its mode
    (mode_ref[0] = 1 when R is at most BOUND_LIMIT); returns the rows' initial m, lane-
    replicated [block_q, 128]: R in a bounded tile, MASK_VALUE (the online softmax's start)
    otherwise. Rows past q_rows (garbage past the array) count as 0.

    The rows' squared norms come from the MXU, lane-major (ones [8, d] x squares^T): a lane
    reduction of each row on the XLU cost 1,982 against 1,323 bundles for the whole init
    (v6e, the blog spec's 2048-row tiles). The squares go in as bf16, each within 2^-9 of
    its value, all positive: R is within 2^-10 of |q_row| max|k|, which the limit's margin
    covers (an exponent off by at most 0.04)."""
    q = q_scaled[...].astype(jnp.float32)
    squares = (q * q).astype(jnp.bfloat16)
    ones = jnp.ones((8, q.shape[1]), jnp.bfloat16)
    sums = lax.dot_general(
        ones, squares, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )  # [8, block_q]: every sublane the same
    assert sums.shape == (8, q.shape[0]), (sums.shape, q.shape)
    if q_rows:
        row = q_block * shape.block_q + lax.broadcasted_iota(jnp.int32, sums.shape, 1)
        sums = jnp.where(row < q_rows, sums, 0.0)
    # NaN or inf in q or k: not within the limit, so online (which shows them as it must),
    # whether or not the target's max propagates NaN.
    sums = jnp.where(sums == sums, sums, jnp.inf)
    largest = jnp.max(jnp.max(sums, axis=1, keepdims=True), axis=0, keepdims=True)  # [1, 1]
    bound = jnp.sqrt(largest) * key_bound_ref[...]  # [1, 128]
    within = jnp.max(bound) <= BOUND_LIMIT
    mode_ref[0] = within.astype(jnp.int32)
    return jnp.broadcast_to(jnp.where(within, bound, MASK_VALUE), (shape.block_q, LANES))


def softmax_step(state, scores, v, keep, shape: "KernelShape", bounded: bool = False):
    """One softmax update of (m, acc[, l]) with a compute block's keys.

    scores: f32 [cq, ckv], the block's QK^T in base 2 (svgen.runtime.quantize.QK_PRODUCTS:
    in the operands' dtype or int8); keep is None (FULL: no mask) or a bool [cq, ckv].
    bounded: m is the row's score bound, fixed for the q tile (see `BOUND_LIMIT`): no row
    max, no rescale of acc and l, and the next QK^T need not wait for this block's max.
    """
    m_prev, acc_prev, l_prev = state
    precision = lax.Precision.HIGHEST if v.dtype == jnp.float32 else None
    assert scores.shape == (shape.cq, shape.ckv), scores.shape
    if keep is not None:
        scores = jnp.where(keep, scores, MASK_VALUE)
    m_next = m_prev if bounded else jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
    # A row with no allowed key so far has m_next == MASK_VALUE and exp2(0) = 1 on its
    # masked entries; the first allowed key rescales that away (alpha = 0), and a row
    # that never gets one is zeroed in finalize. So no select on the probabilities.
    # (Bounded: m is a finite bound, so masked entries give exp2(MASK_VALUE - m) = 0.)
    probs = jnp.exp2(scores - lanes(m_next, shape.ckv))
    alpha = None if bounded else jnp.exp2(m_prev - m_next)
    if shape.row_sum_on_mxu:
        v = jnp.concatenate([v, jnp.ones((v.shape[0], LANES), v.dtype)], axis=1)
        l_next = None
    elif bounded:
        l_next = l_prev + jnp.sum(probs, axis=1, keepdims=True)
    else:
        l_next = alpha * l_prev + jnp.sum(probs, axis=1, keepdims=True)
    pv = lax.dot_general(
        probs.astype(v.dtype),
        v,
        (((1,), (0,)), ((), ())),
        preferred_element_type=jnp.float32,
        precision=precision,
    )
    assert pv.shape == acc_prev.shape, (pv.shape, acc_prev.shape)  # [cq, acc_width]
    if bounded:
        return m_next, acc_prev + pv, l_next
    acc_next = lanes(alpha, shape.acc_width) * acc_prev + pv
    return m_next, acc_next, l_next
