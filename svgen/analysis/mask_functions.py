"""Each pattern's mask functions, printed once per compile (svgen.analysis.mask_code): the
analysis counts their query values for the VMEM check, the plan carries them
(PatternPlan.mask_functions), and codegen places them in the module as they are.

The names are the module's: a function's query functions are named after it, so the names
are settled before anything is printed. The whole mask is printed before classification
(the VMEM check needs its query values first); residual masks, found later, are printed
after it and share its query functions by value."""

from __future__ import annotations

import dataclasses

from svgen.analysis.mask_code import emit_mask
from svgen.analysis.mask_source import MaskSource, aligned_mask, query_values, shared_functions


def function_prefix(pattern: str, single: bool) -> str:
    """What a pattern's functions and tables are named with in a module of several patterns
    (its name and "_"); nothing in a module of one."""
    return "" if single else f"{pattern}_"


def boundary_mask_name(prefix: str) -> str:
    """The module's function for a pattern's whole mask on BOUNDARY blocks."""
    return f"{prefix}boundary_mask"


def residual_mask_name(prefix: str, j: int) -> str:
    """The module's function for a pattern's j-th residual mask (j from 1)."""
    return f"{prefix}residual_mask_{j}"


@dataclasses.dataclass(frozen=True)
class MaskFunctions:
    """A pattern's mask functions as printed, and what its kernel keeps of them in VMEM once
    per q tile: the coordinates they read, then their query functions (mask_source)."""

    prefix: str  # function_prefix of the pattern
    sources: tuple[MaskSource, ...]  # the whole mask's, then each residual mask's
    query_coords: tuple[str, ...]
    query_functions: tuple[str, ...]  # by name

    @property
    def boundary(self) -> MaskSource:
        return self.sources[0]

    @property
    def boundary_name(self) -> str:
        return boundary_mask_name(self.prefix)

    @property
    def residuals(self) -> tuple[MaskSource, ...]:
        return self.sources[1:]

    @property
    def residual_names(self) -> list[str]:
        return [residual_mask_name(self.prefix, j) for j in range(1, len(self.sources))]

    @property
    def value_count(self) -> int:
        """How many query values the kernel keeps, each a [block_q, 128] int32 buffer."""
        return len(self.query_coords) + len(self.query_functions)


def _functions(prefix: str, sources: list[MaskSource], per_video: bool) -> MaskFunctions:
    return MaskFunctions(prefix, tuple(sources), *query_values(sources, per_video))


def print_pattern(mask, layout, prefix: str, aligned: bool, per_video: bool) -> MaskFunctions:
    """A pattern's whole mask printed as its boundary-mask function; an aligned pattern's
    (tiling.align) keeps every real pair of a visited block and prints no mask."""
    source = aligned_mask() if aligned else emit_mask(mask, layout, boundary_mask_name(prefix), {})
    return _functions(prefix, [source], per_video)


def add_residual_masks(printed: MaskFunctions, masks, layout, per_video: bool) -> MaskFunctions:
    """`printed` with the pattern's residual masks (`masks`, in their variants' order)
    printed after its whole mask, sharing its query functions by value."""
    shared = shared_functions(printed.sources)
    sources = list(printed.sources)
    for j, mask in enumerate(masks, 1):
        sources.append(emit_mask(mask, layout, residual_mask_name(printed.prefix, j), shared))
    return _functions(printed.prefix, sources, per_video)


def print_masks(run) -> None:
    """Pass: every candidate pattern's whole mask, printed once, as its module will hold it."""
    spec, candidates = run.spec, run.candidates
    single = len(candidates) == 1
    run.printed = [
        print_pattern(
            mask,
            layout,
            function_prefix(candidate.pattern, single),
            spec.tiling.aligned,
            spec.runtime.per_video_frames,
        )
        for candidate, mask, layout in zip(candidates, run.masks, run.layouts)
    ]
