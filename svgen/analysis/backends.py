"""The backend's steps of `analyze`: the object that plans for the target's kernel
(svgen.analysis.tpu_backend, svgen.analysis.gpu_backend), chosen here and only here from the
target's name, and the passes that ask it. Each backend answers the same questions: the
tiles it classifies at, the layouts and block masks it runs, what it checks before
classifying, its tables, and which tables must fit SMEM."""

from __future__ import annotations

from svgen.analysis.gpu_backend import GpuBackend
from svgen.analysis.run import Settings
from svgen.analysis.targets import gpu_target, is_gpu, target
from svgen.analysis.tpu_backend import TpuBackend


def backend_for(
    target_name: str, smem_budget: int, residual_masks: bool, settings: Settings
) -> TpuBackend | GpuBackend:
    """The backend that plans for `target_name`, a TPU or a GPU (a ValueError for a name that
    is neither). residual_masks=False: every BOUNDARY block runs the whole mask (TPU)."""
    if is_gpu(target_name):
        return GpuBackend(gpu_target(target_name), settings.tile_pairs)
    return TpuBackend(target(target_name), smem_budget, residual_masks)


def classification_tiling(run) -> None:
    """Pass: the tiles the backend classifies at (a GPU's may be coarser than its tiles); the
    spec from here on carries them."""
    run.spec = run.backend.classified(run.spec)


def check_layouts(run) -> None:
    """Pass: the backend's kernel runs every pattern's kernel order."""
    run.backend.check_layouts(run.spec, run.layouts)


def check_tiling(run) -> None:
    """Pass: the tiling can run on the backend (TPU: the one VMEM check, from the printed
    masks' query values; GPU: a selection chooses per GPU tile), before classifying."""
    run.backend.check_tiling(run)


def plan_tables(run) -> None:
    """Pass: the backend's tables of all patterns (TPU: SMEM piece tables with residual masks
    where they fit, and the backward kernels' tables checked; GPU: CSR tables)."""
    run.backend.plan_tables(run)


def check_runtime_tables(run) -> None:
    """Pass: the tables a call with run-time inputs builds, at their static maximum."""
    run.backend.check_runtime_tables(run)


def check_chunk_tables(run) -> None:
    """Pass: runtime.kv_cache's chunked calls' tables."""
    if run.spec.runtime.kv_cache:
        run.backend.check_chunk_tables(run)


def check_select_heads(run) -> None:
    """Pass: the heads a selection runs for, on the backend's kernel."""
    if run.spec.select is not None:
        run.backend.check_select_heads(run)


def check_select_tables(run) -> None:
    """Pass: a selection's tables, at their static maximum, per pattern."""
    if run.spec.select is not None:
        run.backend.check_select_tables(run)
