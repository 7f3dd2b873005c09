"""The TPU chips svgen compiles for, and what a kernel needs of their memories.

Only published capacities live here (one TensorCore's SMEM and VMEM, the clock the static cost
model assumes); everything is checked by the compiler, `svgen compile`, before any file is
written, so a tiling it accepts is one the TPU compiler accepts too (tests AOT-compile them).
"""

from __future__ import annotations

import dataclasses

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    topology: str  # libtpu's AOT topology name (jax.experimental.topologies)
    smem_bytes: int  # per TensorCore: the scalar-prefetch tables live here
    vmem_bytes: int  # per TensorCore
    cores_per_chip: int  # TensorCores a chip runs one kernel's "parallel" grid axis on
    clock_ghz: float  # assumed by the static cost model (not published; see `svgen cost`)


# Clocks: the MXU issue rate in libtpu's schedule (one 256x256 bf16 pass per 8 cycles per
# MXU) against the published bf16 peak; v5e: 4 MXUs of 128x128 against 197 TFLOP/s.
TARGETS = {
    "v5e": Target("v5e", "v5e:2x2", 1 * MIB, 128 * MIB, 1, 1.5),
    "v6e": Target("v6e", "v6e:2x2", 1 * MIB, 128 * MIB, 1, 1.75),
    "v7x": Target("v7x", "tpu7x:2x2x1", 1 * MIB, 64 * MIB, 2, 2.2),
}
DEFAULT_TARGET = "v6e"

# The compiler keeps some VMEM for itself (semaphores, spills, its own staging); a kernel
# may ask for the rest.
VMEM_RESERVE = 8 * MIB
# Below this need the compiler's default scoped limit applies (its default is 32 MiB on
# v5e/v6e and smaller on some chips; asking explicitly is harmless and makes it exact).
ITEMSIZE = {"bfloat16": 2, "float32": 4}
LANES = 128


def target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; one of {', '.join(TARGETS)}")
    return TARGETS[name]


@dataclasses.dataclass(frozen=True)
class VmemNeed:
    """What one kernel keeps in VMEM, in bytes, by part (see `kernel_vmem`)."""

    pipeline: int  # q, k, v and output blocks, each double-buffered
    scratch: int  # m, [acc | l] carried across a q tile's steps
    temporaries: int  # score and probability tiles of the compute blocks in flight

    @property
    def total(self) -> int:
        return self.pipeline + self.scratch + self.temporaries

    def limit(self) -> int:
        """The scoped VMEM limit to ask for: the need plus a margin, in whole MiB."""
        return -(-(self.total + self.total // 8 + 2 * MIB) // MIB) * MIB


def kernel_vmem(block_q: int, block_kv: int, compute_q: int, compute_kv: int, head_dim: int,
                dtype: str) -> VmemNeed:
    """The VMEM the generated kernel needs (mirrors `svgen.runtime.kernel`'s buffers).

    Temporaries: the f32 scores and the narrowed probabilities of one compute block (the
    compiler streams the rest through vregs). Measured against libtpu: 2048 x 2048 compute
    blocks compile in 24 MiB where this says 31; the tests AOT-compile the largest tilings
    each target accepts at the limit derived from this.
    """
    item = ITEMSIZE[dtype]
    pipeline = 2 * item * head_dim * (2 * block_q + 2 * block_kv)
    acc_width = head_dim + (LANES if head_dim % 256 == 128 else 0)
    scratch = 4 * block_q * (LANES + acc_width + (0 if head_dim % 256 == 128 else LANES))
    return VmemNeed(pipeline, scratch, compute_q * compute_kv * (4 + item))
