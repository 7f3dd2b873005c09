"""The compile side of each backend: what a plan of that backend contributes to its module.

A generated module is the shared template (templates/common/module.py.j2) and the spec's
data; a backend adds its template (the blocks it fills), the svgen.runtime module that
builds `attention`, its constants, how many runs it keeps inline, and the lines its
docstring says about the kernel. The run-time side of each backend is its `Attention`
(svgen.runtime.kernel, svgen.runtime.gpu); the analysis plans for either (analysis.analyze).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from svgen.analysis import Plan
from svgen.codegen import pyformat
from svgen.codegen.words import gpu_kernel_words, tpu_kernel_words


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend's compile side (see the module docstring)."""

    name: str  # "tpu", "gpu": Plan.backend
    template: str  # the module template, extending common/module.py.j2
    # The svgen.runtime modules its module imports (svgen.core's tables every module does).
    runtime_modules: tuple[str, ...]
    # Above this many runs a table goes to a .npy file beside the module.
    max_inline_runs: int
    # Its constants (NAME, literal): after the tiles' (SEQ_LEN ... BLOCK_KV), and after the
    # attention's (HEADS, HEAD_DIM, DTYPE).
    tiling_constants: Callable[[Plan], list[tuple[str, str]]]
    kernel_constants: Callable[[Plan], list[tuple[str, str]]]
    # The docstring's lines on the kernel (after geometry and attention).
    kernel_words: Callable[[Plan], list[str]]
    # What the kernel does per visited tile of a head, in the docstring's Visited line.
    visits: str


def _tpu_tiling(plan: Plan) -> list[tuple[str, str]]:
    """The TPU kernel's compute blocks."""
    compute = plan.patterns[0].compute_grid
    return [("COMPUTE_Q", str(compute.block_q)), ("COMPUTE_KV", str(compute.block_kv))]


def _tpu_kernel(plan: Plan) -> list[tuple[str, str]]:
    """Its walk's piece length and the chip's facts."""
    return [
        ("SLOTS_PER_PIECE", str(plan.tables.slots)),
        ("TARGET", pyformat.string(plan.target.name)),
        ("VMEM_LIMIT_BYTES", str(plan.kernel.vmem.limit())),
        ("TENSOR_CORES", str(plan.target.cores_per_chip)),
        ("MXU_WIDTH", str(plan.target.mxu_width)),
    ]


def _no_constants(plan: Plan) -> list[tuple[str, str]]:
    return []


def _gpu_kernel(plan: Plan) -> list[tuple[str, str]]:
    """The GPU kernel's launch: its tiles, warps and stages."""
    return [
        ("TARGET", pyformat.string(plan.target.name)),
        ("GPU_BLOCK_Q", str(plan.kernel.tiling.block_q)),
        ("GPU_BLOCK_KV", str(plan.kernel.tiling.block_kv)),
        ("NUM_WARPS", str(plan.kernel.tiling.num_warps)),
        ("NUM_STAGES", str(plan.kernel.tiling.num_stages)),
    ]


TPU = Backend(
    name="tpu",
    template="pallas_tpu/module.py.j2",
    # libtpu_env: quiet where no TPU is attached (the module's first statement)
    runtime_modules=("kernel", "libtpu_env"),
    max_inline_runs=4096,
    tiling_constants=_tpu_tiling,
    kernel_constants=_tpu_kernel,
    kernel_words=tpu_kernel_words,
    visits="steps doing work",
)
GPU = Backend(
    name="gpu",
    template="pallas_triton/module.py.j2",
    runtime_modules=("gpu",),
    # Its runs are at its small classification tiles, a line or two per q tile: readable
    # inline up to a few thousand q tiles (the shipped one: 4,797 runs over 1,182 q tiles).
    max_inline_runs=8192,
    tiling_constants=_no_constants,
    kernel_constants=_gpu_kernel,
    kernel_words=gpu_kernel_words,
    visits="tiles computed",
)
BACKENDS = {b.name: b for b in (TPU, GPU)}


def backend_of(plan: Plan) -> Backend:
    """The compile side of the plan's backend."""
    return BACKENDS[plan.backend]
