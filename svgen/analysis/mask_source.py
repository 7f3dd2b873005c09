"""A mask function's printed source (svgen.analysis.mask_code prints it): its statements,
the query coordinates they read and the query functions they call, and what a pattern's
kernel keeps of them once per q tile (its query values)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class QueryFunction:
    """A module-level function of the queries alone that a mask reads through `q.once`
    (runtime.coords): the kernel computes it once per q tile, beside the decoded
    coordinates, instead of on every BOUNDARY block."""

    name: str
    owner: str  # the mask function that reads it
    lines: tuple[str, ...]  # statements, without indentation
    result: str
    query_coords: tuple[str, ...]  # the attributes of q it reads, sorted
    reader: str = "coords.fields"  # the call whose query side it is
    value: str = ""  # the expression it returns: a mask printed later shares it by this


@dataclasses.dataclass(frozen=True)
class MaskSource:
    """One mask function's body as printed (svgen.analysis.mask_code.emit_mask)."""

    lines: tuple[str, ...]  # statements, without indentation
    result: str  # the expression the function returns
    query_coords: tuple[str, ...]  # the attributes of q the statements read, sorted
    query_functions: tuple[QueryFunction, ...] = ()  # what they read through q.once
    calls_coords: bool = False  # they call svgen.runtime.coords: the module imports it


def shared_functions(sources) -> dict[str, str]:
    """The query functions of masks already printed (`sources`), by value: what emit_mask
    shares with the masks of the same pattern printed after them."""
    return {f.value: f.name for s in sources for f in s.query_functions}


def aligned_mask() -> MaskSource:
    """An aligned pattern's mask (tiling.align): its blocks are FULL or EMPTY, and the kernel
    runs the masked path only for FULL blocks of the column holding padding keys, where it
    tests k < seq_len itself. Every pair of a visited block is kept; no coordinates."""
    return MaskSource(
        ("# Aligned (tiling.align): every real pair of a visited block is kept.",), "True", ()
    )


def query_values(sources, per_video_frames: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(coordinates, query function names) a pattern's kernel decodes once per q tile, each a
    [block_q, 128] int32 buffer in VMEM: the coordinates its mask functions (`sources`, the
    whole mask's and its residual masks') read, then their query functions. With per-video
    frames a query function is computed on every block instead (video_frames.ShiftedFrames),
    from coordinates that must then be decoded too."""
    names = {c for s in sources for c in s.query_coords}
    functions = [f for s in sources for f in s.query_functions]
    if per_video_frames:
        names |= {c for f in functions for c in f.query_coords}
    return tuple(sorted(names)), tuple(f.name for f in functions)
