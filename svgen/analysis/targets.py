"""The chips svgen compiles for, TPUs (`Target`) and NVIDIA GPUs (`GpuTarget`), and what a
kernel needs of their memories.

Only published capacities live here (one TensorCore's SMEM and VMEM, the clock the static cost
model assumes; a GPU's shared memory and registers); everything is checked by the compiler, `svgen compile`, before any file is
written, so a tiling it accepts is one the TPU compiler accepts too (tests AOT-compile them).
"""

from __future__ import annotations

import dataclasses

# What a kernel needs lives with the kernel (core.vmem): the runtime asks for more at call
# time when it is called with a wider dtype than its spec's.
from svgen.core.vmem import MIB, VmemNeed, kernel_vmem  # noqa: F401


@dataclasses.dataclass(frozen=True)
class ChipMeasured:
    """What a chip showed that no published figure says: the one place svgen's code reads
    measured chip figures from (the cost model's caveats). Each is what the results in
    bench/results give (docs/measured.md); `svgen report --check` fails where they disagree,
    so a new measurement that moves one is written here, and nowhere else, by hand."""

    program_fast_bundles: int  # the largest forward program that ran at its work's rate
    program_slow_bundles: int  # the smallest that ran slowly
    # how much slower those ran than the same spec's fastest program within the budget
    program_slowdown: tuple[float, float]
    model_pairs: int  # one-level tilings of the shipped specs timed against the static model
    model_typical: tuple[float, float, int]  # chip / model on most: least, most, how many
    model_worst: float  # chip / model at worst (programs past the budget)


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    topology: str  # libtpu's AOT topology name (jax.experimental.topologies)
    smem_bytes: int  # per TensorCore: the scalar-prefetch tables live here
    vmem_bytes: int  # per TensorCore
    cores_per_chip: int  # TensorCores a chip runs one kernel's "parallel" grid axis on
    clock_ghz: float  # assumed by the static cost model (not published; see `svgen cost`)
    hbm_bytes_per_s: float  # published HBM bandwidth per chip (the model's memory-bound terms)
    # published dense bf16 peak of one TensorCore (the chip's over its cores): the static
    # model runs a kernel's grid on one core, so `svgen cost` puts its useful FLOP/s against it
    bf16_flops_per_core_s: float
    # Width of one MXU pass. With 256 (v6e, v7x) a head_dim of 128 fills half a pass, so the
    # kernel gets the row sum free from [V | 1]; with 128 (v5e) that column block is a second
    # pass, and the row sum is taken across lanes instead (faster on a v5e: docs/measured.md).
    mxu_width: int = 256
    # The largest forward kernel program (libtpu's final bundles) svgen emits for the chip:
    # past the core's instruction memory a kernel ran slower (ChipMeasured.program_slowdown).
    program_bundles: int = 64_000
    # whether that figure was measured on the chip (v5e), or is v5e's carried over as a
    # conservative guess (v6e, v7x: not measured)
    program_measured: bool = False
    measured: ChipMeasured | None = None  # None: nothing measured on this chip


# Clocks: assumed, not published (v5e: 4 MXUs of 128x128 at 1.5 GHz give its 197 TFLOP/s).
# On v6e the schedule's MXU rate at 1.75 GHz is half the published 918 TFLOP/s (see
# cost.Utilisation): the clock may be low by up to 2x; cycle ratios do not depend on it.
#: TPU v5e, as measured (docs/measured.md, generated from bench/results by `svgen report`).
V5E_MEASURED = ChipMeasured(
    program_fast_bundles=64_358,
    program_slow_bundles=68_161,
    program_slowdown=(1.9, 4.7),
    model_pairs=25,
    model_typical=(1.09, 1.14, 23),
    model_worst=5.0,
)

TARGETS = {
    # v5e's program budget: under the largest forward kernel measured at full speed
    # (V5E_MEASURED.program_fast_bundles).
    "v5e": Target(
        "v5e", "v5e:2x2", 1 * MIB, 128 * MIB, 1, 1.5, 819e9, 197e12, 128, 64_000, True, V5E_MEASURED
    ),
    "v6e": Target("v6e", "v6e:2x2", 1 * MIB, 128 * MIB, 1, 1.75, 1640e9, 918e12),
    "v7x": Target("v7x", "tpu7x:2x2x1", 1 * MIB, 64 * MIB, 2, 2.2, 7370e9, 2307e12 / 2),
}
DEFAULT_TARGET = "v6e"

# The compiler keeps some VMEM for itself (semaphores, spills, its own staging); a kernel
# may ask for the rest.
VMEM_RESERVE = 8 * MIB


def target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; one of {', '.join(TARGETS)}")
    return TARGETS[name]


# -- GPUs (the Pallas Triton backend, svgen.runtime.gpu) ----------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """An NVIDIA GPU: what `svgen compile --target` checks a GPU kernel's launch against, and
    the XLA target description a deviceless compile uses (svgen/analysis/gpu_specs/,
    svgen.chip.gpu_aot)."""

    name: str
    description: str
    config_file: str  # svgen/analysis/gpu_specs/<file>: XLA GpuTargetConfig text proto
    shared_memory_per_block: int  # bytes a block may opt into (shared_memory_per_block_optin)
    registers_per_thread: int  # the most a thread may use (PTX ISA: 255 on sm_90)
    sm_count: int
    hbm_bytes_per_s: float

    def config_text(self) -> str:
        import importlib.resources  # only a deviceless compile reads it

        return (
            importlib.resources.files("svgen.analysis")
            .joinpath("gpu_specs", self.config_file)
            .read_text()
        )


# Published Hopper figures, as the target protos in svgen/analysis/gpu_specs/ hold them.
GPU_TARGETS = {
    "h100": GpuTarget(
        "h100", "NVIDIA H100 SXM (sm_90a)", "h100_sxm.txtpb", 232448, 255, 132, 3.35e12
    ),
    "h200": GpuTarget(
        "h200", "NVIDIA H200 SXM (sm_90a)", "h200_sxm.txtpb", 232448, 255, 132, 4.8e12
    ),
}


def is_gpu(name: str) -> bool:
    return name in GPU_TARGETS


def gpu_target(name: str) -> GpuTarget:
    if name not in GPU_TARGETS:
        raise ValueError(f"unknown GPU target {name!r}; one of {', '.join(GPU_TARGETS)}")
    return GPU_TARGETS[name]
