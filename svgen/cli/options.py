"""Options more than one command takes, and the argument types they check."""

from __future__ import annotations

import argparse

from svgen.analysis import DEFAULT_SMEM_BUDGET
from svgen.analysis.targets import DEFAULT_TARGET, GPU_TARGETS, TARGETS

OUT_DEFAULT = "generated"


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a budget of 0 or less means nothing)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _StoreGiven(argparse.Action):
    """Stores the value and records that it was given (`target_given`): `svgen tune
    --measure` tells a --target the user wrote from the default one."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.target_given = True


def add_budget(p: argparse.ArgumentParser, gpu: bool = False) -> None:
    p.set_defaults(target_given=False)
    p.add_argument(
        "--smem-budget",
        type=positive_int,
        default=DEFAULT_SMEM_BUDGET,
        metavar="BYTES",
        help="fail when a kernel's scalar-prefetch tables exceed this many bytes "
        f"(default {DEFAULT_SMEM_BUDGET}: one TPU core's SMEM)",
    )
    if gpu:
        p.add_argument(
            "--target",
            choices=sorted(TARGETS) + sorted(GPU_TARGETS),
            default=DEFAULT_TARGET,
            help=f"the chip the kernel is for (default {DEFAULT_TARGET}): a TPU (its VMEM "
            f"decides which tilings fit), or a GPU ({', '.join(sorted(GPU_TARGETS))}: a Pallas "
            f"Triton kernel, <name>_gpu.py, tiled by the spec's `gpu` section)",
        )
        return
    p.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default=DEFAULT_TARGET,
        action=_StoreGiven,
        help=f"the TPU the kernel is for: its VMEM decides which tilings fit "
        f"(default {DEFAULT_TARGET})",
    )
