"""The VMEM one svgen kernel needs, by part (it mirrors `svgen.runtime.kernel`'s buffers).

The compiler checks it against the target's VMEM before generating anything (svgen.targets);
the generated module asks for the limit derived from it; the runtime asks for more when it is
called with a wider dtype than its spec's.
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20
LANES = 128
ITEMSIZE = {"bfloat16": 2, "float32": 4}


@dataclasses.dataclass(frozen=True)
class VmemNeed:
    """What one kernel keeps in VMEM, in bytes, by part (see `kernel_vmem`)."""

    pipeline: int  # q, k, v and output blocks, each double-buffered
    scratch: int  # m, [acc | l] carried across a q tile's steps; scaled q; query coordinates
    temporaries: int  # score and probability tiles of the compute blocks in flight

    @property
    def total(self) -> int:
        return self.pipeline + self.scratch + self.temporaries

    def limit(self) -> int:
        """The scoped VMEM limit to ask for: the need plus a margin, in whole MiB."""
        return -(-(self.total + self.total // 8 + 2 * MIB) // MIB) * MIB


def kernel_vmem(
    block_q: int,
    block_kv: int,
    compute_q: int,
    compute_kv: int,
    head_dim: int,
    dtype: str,
    query_coords: int = 0,
) -> VmemNeed:
    """The VMEM the generated kernel needs (mirrors `svgen.runtime.kernel`'s buffers).

    Temporaries: the f32 scores and the narrowed probabilities of one compute block (the
    compiler streams the rest through vregs). Measured against libtpu: 2048 x 2048 compute
    blocks compile in 24 MiB where this says 31; the tests AOT-compile the largest tilings
    each target accepts at the limit derived from this. `query_coords`: how many query
    coordinates a boundary mask reads (each kept lane-replicated, [block_q, 128] int32).
    """
    item = ITEMSIZE[dtype]
    pipeline = 2 * item * head_dim * (2 * block_q + 2 * block_kv)
    acc_width = head_dim + (LANES if head_dim % 256 == 128 else 0)
    scratch = (
        4
        * block_q
        * (LANES + acc_width + (0 if head_dim % 256 == 128 else LANES) + LANES * query_coords)
        + item * block_q * head_dim
    )  # the scaled q tile
    return VmemNeed(pipeline, scratch, compute_q * compute_kv * (4 + item))
