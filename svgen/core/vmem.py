"""The VMEM one svgen kernel needs, by part (it mirrors `svgen.runtime.forward`'s buffers).

The compiler checks it against the target's VMEM before generating anything (svgen.analysis.targets);
the generated module asks for the limit derived from it; the runtime asks for more when it is
called with a wider dtype than its spec's.

Buffers are counted as Mosaic lays them out in VMEM: a [rows, width] buffer takes whole
(8, 128) tiles, so a [block, 64] block takes 128 lanes (a head_dim of 64 costs what 128 does).
What the compiler keeps
on the kernel's stack (values it spills: scores, probabilities, f32 operand splits) is not a
buffer of the kernel but is counted against the same scoped limit; `_spills` models it from
libtpu's own figures (its CompileTimeScopedVmemOom reports the scoped size it needs, which
for a compiled kernel is these buffers plus the stack), see its docstring.
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20
LANES = 128
ITEMSIZE = {"bfloat16": 2, "float32": 4}
# Mosaic's internal scratch, allocated in every kernel's scoped VMEM (u32[144, 128] on v6e).
INTERNAL_SCRATCH = 144 * LANES * 4


@dataclasses.dataclass(frozen=True)
class VmemNeed:
    """What one kernel keeps in VMEM, in bytes, by part (see `kernel_vmem`)."""

    pipeline: int  # q, k, v and output blocks, each double-buffered
    scratch: int  # m, [acc | l] carried across a q tile's steps; scaled q; query coordinates
    temporaries: int  # what the compiler spills to the stack: scores, probabilities, splits

    @property
    def total(self) -> int:
        return self.pipeline + self.scratch + self.temporaries

    def limit(self) -> int:
        """The scoped VMEM limit to ask for: the need plus a margin, in whole MiB."""
        return -(-(self.total + self.total // 8 + 2 * MIB) // MIB) * MIB


def lanes(width: int) -> int:
    """The lanes a [rows, width] VMEM buffer takes per row: whole 128-lane tiles."""
    return -(-width // LANES) * LANES


def row_sum_on_mxu(head_dim: int, mxu_width: int = 256) -> bool:
    """True when the kernel gets the row sum l from the PV matmul ([V | 1]), else from a
    cross-lane sum: [V | 1] is free only where head_dim leaves a 128-lane gap in its last MXU
    pass (head_dim 128 on a 256-wide MXU); on a 128-wide MXU (v5e) the ones column is a pass
    of its own, which the chip showed costs more than the lane sum."""
    return mxu_width > LANES and head_dim % mxu_width == mxu_width - LANES


def kernel_vmem(
    block_q: int,
    block_kv: int,
    compute_q: int,
    compute_kv: int,
    head_dim: int,
    dtype: str,
    query_coords: int = 0,
    mxu_width: int = 256,
) -> VmemNeed:
    """The VMEM the generated kernel needs (mirrors `svgen.runtime.forward`'s buffers).

    `query_coords`: how many query coordinates a boundary mask reads (each kept
    lane-replicated, [block_q, 128] int32). `mxu_width`: the target's (row_sum_on_mxu). The
    tests AOT-compile tilings across head dims, dtypes and compute blocks at the limit derived
    from this (tests/test_aot_tpu.py).
    """
    item = ITEMSIZE[dtype]
    d = lanes(head_dim)
    on_mxu = row_sum_on_mxu(head_dim, mxu_width)
    # q, k, v, o blocks double-buffered. (The training forward's lse output, f32 [1, block_q]
    # in 8 sublanes, 128 KiB at block_q 2048, is left to the limit's margin.)
    pipeline = 2 * item * d * (2 * block_q + 2 * block_kv)
    acc = lanes(head_dim + (LANES if on_mxu else 0))
    scratch = (
        4 * block_q * (LANES + acc + (0 if on_mxu else LANES) + LANES * query_coords)
        + item * block_q * d  # the scaled q tile
        + INTERNAL_SCRATCH
    )
    spills = _spills(block_q, block_kv, compute_q, compute_kv, d, item, on_mxu, mxu_width)
    return VmemNeed(pipeline, scratch, spills)


def _spills(
    block_q, block_kv, compute_q, compute_kv, d: int, item: int, on_mxu: bool, mxu_width: int
) -> int:
    """The stack libtpu's v6e schedule needs, an envelope of what it reported (its scoped size
    less the buffers above) over 1-16 compute blocks a tile, and never less than one compute
    block's f32 scores:

    * row sum on the MXU (head_dim 128), bf16: one block at a time (1.39-2.95 MiB at 512 x 512
      to 1024 x 512 blocks, 5.6-6.4 bytes per element, the few percent over 6 within the
      limit's margin);
    * row sum across lanes (head_dim 64 and 256), bf16: the scheduler overlaps the blocks of
      a whole tile, so the stack grows with the tile, not the block: 0.56-2.80 bytes per tile
      element (2048 x 2048 tiles: 8.8 MiB at 1024 x 512 blocks, 11.1 at 512 x 512; 4096 x 4096
      in 1024 x 1024 blocks: 44.9), and a tile of one block 0-3.43 per element (none at
      512 x 512, 2.8 MiB at 1024 x 1024, 13.7 at 2048 x 2048);
    * f32: the HIGHEST-precision matmuls split q, k and v into bf16 parts, about 9 bytes per
      element of the tiles' operands, on top of 2.5 bytes per score element of a block (row
      sum on the MXU) or of the tile (across lanes): 3.5-8.8 MiB at head_dim 128, 3.2-14.3 at
      64 and 8.3 at 256, over 1024 x 1024 to 2048 x 2048 tiles;
    * v5e (128-wide MXUs), whose kernels sum rows across lanes at every head_dim: libtpu's
      v5e schedule keeps more of the tile, 3.7 bytes per tile element at 2048 x 4096 tiles of
      1024 x 512 blocks (bf16, head_dim 128: 41.01 MiB scoped against 41 asked for with 3),
      so 4 there.
    """
    block, tile = compute_q * compute_kv, block_q * block_kv
    if item == 4:  # (8 bytes a block element: what this model counted before, its floor)
        scores = block if on_mxu else tile
        return max(8 * block, int(9 * d * (block_q + 2 * block_kv) + 2.5 * scores))
    per_tile = 4 if mxu_width == LANES else 3
    return 6 * block if on_mxu else max(4 * block, per_tile * tile)
