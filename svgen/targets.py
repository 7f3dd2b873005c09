"""The TPU chips svgen compiles for, and what a kernel needs of their memories.

Only published capacities live here (one TensorCore's SMEM and VMEM, the clock the static cost
model assumes); everything is checked by the compiler, `svgen compile`, before any file is
written, so a tiling it accepts is one the TPU compiler accepts too (tests AOT-compile them).
"""

from __future__ import annotations

import dataclasses

# What a kernel needs lives with the kernel (runtime.vmem): the runtime asks for more at call
# time when it is called with a wider dtype than its spec's.
from svgen.runtime.vmem import MIB, VmemNeed, kernel_vmem  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    topology: str  # libtpu's AOT topology name (jax.experimental.topologies)
    smem_bytes: int  # per TensorCore: the scalar-prefetch tables live here
    vmem_bytes: int  # per TensorCore
    cores_per_chip: int  # TensorCores a chip runs one kernel's "parallel" grid axis on
    clock_ghz: float  # assumed by the static cost model (not published; see `svgen cost`)
    hbm_bytes_per_s: float  # published HBM bandwidth per chip (the model's memory-bound terms)


# Clocks: the MXU issue rate in libtpu's schedule (one 256x256 bf16 pass per 8 cycles per
# MXU) against the published bf16 peak; v5e: 4 MXUs of 128x128 against 197 TFLOP/s.
TARGETS = {
    "v5e": Target("v5e", "v5e:2x2", 1 * MIB, 128 * MIB, 1, 1.5, 819e9),
    "v6e": Target("v6e", "v6e:2x2", 1 * MIB, 128 * MIB, 1, 1.75, 1640e9),
    "v7x": Target("v7x", "tpu7x:2x2x1", 1 * MIB, 64 * MIB, 2, 2.2, 7370e9),
}
DEFAULT_TARGET = "v6e"

# The compiler keeps some VMEM for itself (semaphores, spills, its own staging); a kernel
# may ask for the rest.
VMEM_RESERVE = 8 * MIB


def target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; one of {', '.join(TARGETS)}")
    return TARGETS[name]
