"""int8 QK^T (the spec's `attention.qk: int8`): what the wrapper does to q and k before the
forward kernel, and the kernel's two ways of computing a compute block's scores.

Before the kernel (one XLA pass over q and one over k, `quantized_operands`):

* k is smoothed: its per-row (batch x head) mean over the keys is subtracted
  (`smooth_keys`, done on the user's arrays before anything else, so the backward kernels
  see the same k). Every score of a query row moves by the same q·mean, which the softmax
  does not see; the keys' common offset, often most of their size, no longer takes up the
  int8 range (SageAttention's observation).
* q is quantized per compute block of queries and k per compute block of keys, in kernel
  order: one symmetric scale per block, scale = max |x| / 127, x_int8 = round(x / scale).
  q's scales carry the softmax scale (sm_scale * log2 e), so the rescaled scores come out
  in the kernel's base-2 units. The scales are f32, lane-major [rows, 1, blocks * 128]: each
  block's scale fills its own 128 lanes, and a tile's block is one VMEM input of the kernel
  ([1, blocks per tile * 128]), placed by the q tile and by the kv tile.

In the kernel (`QK_PRODUCTS`, by the variant's `qk`): "float" scales the q tile into VMEM in
init and multiplies in its dtype; "int8" multiplies int8 x int8 into int32 on the MXU and
rescales by q's block scale times k's (one full-block multiply, where "float" has none but
init's scaling of q). P·V is the same in both: probabilities in v's dtype.

The gradient (jax.grad) is the float backward's on the same mask: the backward kernels read
the unquantized q, the smoothed k and v, with the forward's o and lse (svgen.runtime.kernel).
The smoothing is differentiated by JAX (a mean), the quantization is not (a forward-only
approximation of the same function).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from svgen.core.tables import LANES, KernelShape
from svgen.runtime.steps import lanes

#: False quantizes k as it comes, unsmoothed: for measuring what the smoothing buys
#: (svgen.chip.int8_error; tests/test_int8_qk.py), and for timing the two on a chip
#: (`python -m svgen.chip.kernel_ab SPEC --runtime quantize.SMOOTH_KEYS=False`).
SMOOTH_KEYS = True
#: The largest int8 magnitude used (symmetric: -127..127).
INT8_MAX = 127.0
#: A block of zeros (padding past the sequence) gets this scale instead of 0.
_TINY = 1e-30


def smooth_keys(k):
    """k [..., seq, d] minus its mean over the keys (per leading index: per head), in k's
    dtype, the mean taken in f32. Softmax-invariant: every score of a row moves by q·mean."""
    k32 = k.astype(jnp.float32)
    return (k32 - jnp.mean(k32, axis=-2, keepdims=True)).astype(k.dtype)


def quantize_blocks(x, block: int, blocks: int, factor: float = 1.0):
    """(int8 x, f32 scales [rows, 1, blocks * 128]) of x [rows, n, d] quantized per run of
    `block` rows (n <= blocks * block: rows past n count as 0), each block's scale times
    `factor` in its own 128 lanes."""
    rows, n, d = x.shape
    x32 = x.astype(jnp.float32)
    padded = jnp.pad(x32, ((0, 0), (0, blocks * block - n), (0, 0)))
    amax = jnp.max(jnp.abs(padded.reshape(rows, blocks, block * d)), axis=2)  # [rows, blocks]
    scale = jnp.maximum(amax, _TINY) / INT8_MAX
    per_row = jnp.repeat(scale, block, axis=1, total_repeat_length=blocks * block)[:, :n]
    q8 = jnp.clip(jnp.round(x32 / per_row[:, :, None]), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    lanes_of = jnp.broadcast_to((scale * factor)[:, :, None], (rows, blocks, LANES))
    return q8, lanes_of.reshape(rows, 1, blocks * LANES)


def quantized_operands(q, k, shape: KernelShape, q_scale: float):
    """(q int8, k int8, q's scales, k's scales) for the int8 kernel: q [rows, n, d] (a chunk's
    n rows, or the sequence) per compute block of queries, its scales times q_scale; k
    [rows, m, d] (already smoothed) per compute block of keys; each scale array as long as
    whole tiles (the kernel's inputs; svgen.runtime.variant.ForwardVariant.operands)."""
    q_tiles = -(-q.shape[1] // shape.block_q)
    kv_tiles = -(-k.shape[1] // shape.block_kv)
    q8, q_scales = quantize_blocks(q, shape.cq, q_tiles * shape.q_blocks_per_tile, q_scale)
    k8, k_scales = quantize_blocks(k, shape.ckv, kv_tiles * shape.kv_blocks_per_tile)
    return q8, k8, q_scales, k_scales


# ------------------------------------------------------------------------------ the kernel
def _scores(q, k):
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    return lax.dot_general(
        q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32, precision=precision
    )


@dataclasses.dataclass(frozen=True)
class FloatQk:
    """QK^T in the operands' dtype: q scaled by sm_scale * log2(e) once per q tile, in init,
    into the q_scaled scratch (scores in base 2, no per-score multiply)."""

    name = "float"

    def init(self, refs, q_scale: float) -> None:
        refs.q_scaled[...] = (refs.q[...].astype(jnp.float32) * q_scale).astype(refs.q_scaled.dtype)

    def scores(self, refs, block):
        """f32 [cq, ckv]: the block's scores in base 2."""
        return _scores(refs.q_scaled[block.rows, :], refs.k[block.cols, :])


@dataclasses.dataclass(frozen=True)
class Int8Qk:
    """QK^T int8 x int8 -> int32, rescaled by the q block's scale (which carries sm_scale *
    log2(e)) times the k block's: q and k were quantized before the kernel."""

    name = "int8"

    def init(self, refs, q_scale: float) -> None:
        pass  # q's scales carry q_scale already

    def scores(self, refs, block):
        shape = block.shape
        products = lax.dot_general(
            refs.q[block.rows, :],
            refs.k[block.cols, :],
            (((1,), (1,)), ((), ())),
            preferred_element_type=jnp.int32,
        )
        # Each block's scale in its 128 lanes: [1, 128] rows of one value.
        q_scale = refs.q_scales[:, pl.ds(block.qi * LANES, LANES)]
        k_scale = refs.k_scales[:, pl.ds(block.ki * LANES, LANES)]
        return products.astype(jnp.float32) * lanes(q_scale * k_scale, shape.ckv)


#: The forward kernel's QK^T by svgen.runtime.variant.ForwardVariant.qk.
QK_PRODUCTS = {p.name: p for p in (FloatQk(), Int8Qk())}
