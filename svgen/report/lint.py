"""Warnings for specs that compile but are likely mistakes.

A spec can be valid and still not say what its author meant: a mask that keeps no pair
(every output row is zero), or a parameter larger than the geometry it measures (frames
given as a count of tokens, a window from a bigger model's spec). Such specs still compile,
with the same exit status; `svgen` prints one line per warning on stderr, located like an
error (``file:line:column: key: message``) so editors jump to it.

Which geometry size each parameter is measured against is declared with the parameter
(`Param.within` in svgen.spec.primitives), so a new primitive's parameters are checked without
an edit here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np

from svgen.spec import primitives
from svgen.analysis import residuals
from svgen.spec.errors import locate
from svgen.core.kinds import TileKind
from svgen.core.layout import TILED, TokenLayout
from svgen.spec import IMPLICIT_PATTERN, MaskTerm, Spec

#: The primitive of a block mask given as data (svgen.spec.primitives).
BLOCKS = "blocks"

__all__ = ["SpecWarning", "spec_warnings", "plan_warnings", "EXTENT_LIMITS"]


@dataclasses.dataclass(frozen=True)
class SpecWarning:
    """One likely mistake; ``str()`` reads like a SpecError."""

    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        return locate(self.message, self.file, self.line, self.column, self.key)


#: Per extent (svgen.spec.primitives.EXTENTS): the largest meaningful value on a geometry, and
#: how to say it ({n}: that value; geometry fields by name).
EXTENT_LIMITS: dict[str, tuple[Callable[[TokenLayout], int], str]] = {
    primitives.FRAME_COUNT: (lambda g: g.frames, "the video's {n:,} frame(s)"),
    primitives.FRAME_DIFFERENCE: (
        lambda g: g.frames - 1,
        "the largest frame difference, {n:,} ({frames:,} frames)",
    ),
    primitives.ROW_DIFFERENCE: (
        lambda g: g.height - 1,
        "the largest row difference, {n:,} (height {height:,})",
    ),
    primitives.COL_DIFFERENCE: (
        lambda g: g.width - 1,
        "the largest column difference, {n:,} (width {width:,})",
    ),
    primitives.POSITION_COUNT: (lambda g: g.seq_len, "the sequence's {n:,} tokens"),
    primitives.POSITION_DIFFERENCE: (
        lambda g: g.seq_len - 1,
        "the largest position difference, {n:,} ({seq_len:,} tokens)",
    ),
}


def spec_warnings(spec: Spec) -> list[SpecWarning]:
    """Parameters past the geometry, in every mask of the spec (patterns included), in the
    order they are written. Only values the spec gives are checked, never defaults."""
    out = []
    for term in _terms(spec):
        primitive = primitives.get(term.op)
        declared = {p.name: p for p in primitive.params}
        for name, value in term.params:
            param = declared.get(name)
            if param is None or param.within is None:
                continue
            largest, words = EXTENT_LIMITS[param.within]
            limit = largest(spec.geometry)
            if value > limit:
                out.append(
                    _at(
                        term,
                        f"{value:,} is more than "
                        f"{_say(words, limit, spec.geometry)}; likely a mistake",
                        name,
                    )
                )
    return sorted(out, key=lambda w: (w.line or 0, w.column or 0))


def plan_warnings(plan) -> list[SpecWarning]:
    """Patterns that keep no pair at all (an analysis.Plan): their heads output zeros.
    Only certain findings: a user predicate whose count is a bound warns only when even the
    upper bound is zero. And TPU kernels estimated slower than the same kernel on a dense
    mask (`_slower_than_dense`), patterns whose residual masks a work limit left out, and
    block masks given as data whose positions anchor frames shift (`_anchor_shifted_blocks`)."""
    out = []
    for pattern in plan.patterns:
        term = plan.spec.pattern_mask(pattern.name)
        what = (
            "the mask"
            if plan.spec.heads is None and pattern.name == IMPLICIT_PATTERN
            else f"pattern {pattern.name!r}"
        )
        if not pattern.classification.kept_pairs_upper:
            out.append(
                _at(
                    term,
                    f"{what} keeps no pair: every query row attends nothing and its output is zero",
                )
            )
        elif plan.kernel.steps_estimated:
            slower = _slower_than_dense(pattern)
            if slower is not None:
                out.append(_at(term, f"{what}: {slower}"))
        out += _anchor_shifted_blocks(pattern, term, what)
        if pattern.residuals_skipped is not None:
            out.append(
                _at(
                    term,
                    f"{what}: no residual masks: classifying the mask's parts would pass "
                    f"{pattern.residuals_skipped} at this size, so every BOUNDARY block runs "
                    "the whole mask (exact, slower; docs/kernels.md, Residual masks)",
                )
            )
    for candidate, pattern in zip(plan.spec.head_patterns().candidates, plan.patterns):
        ragged = _ragged_cubes(pattern)
        if ragged is None:
            continue
        w = candidate.where if plan.spec.heads is not None else None
        if w is None:  # the spec's own layout
            out.append(SpecWarning(ragged, file=plan.spec.source, key="layout.tiled"))
        else:  # a head candidate's (its layout, or the spec's it inherits)
            message = f"pattern {pattern.name!r} in its layout: {ragged}"
            out.append(SpecWarning(message, w.file, w.line, w.column, w.key))
    return out


def _anchor_shifted_blocks(pattern, term: MaskTerm, what: str) -> list[SpecWarning]:
    """A block mask given as data (`blocks`) indexes kernel positions. In a temporal-major
    order ([h, w, f], [w, h, f]) a `first_frame` in the same pattern moves its frames first
    (anchor frames), which moves every other video token too: a file calibrated in the
    order without the anchor (PAROAttention's, say) would silently read other tokens. One
    warning at each `blocks` term, naming the shift with the first token it moves."""
    lay = pattern.layout
    if not lay.anchor_frames:
        return []
    anchored = lay.anchor_frames * lay.tokens_per_frame
    plain = lay.video_start + lay.anchor_frames  # frame A, place 0 without anchor frames
    kernel = lay.video_start + anchored  # ... and with them: just past the anchor block
    message = (
        f"{what}: a block mask given as data indexes kernel positions, and first_frame keeps "
        f"the first {lay.anchor_frames} frame(s) ({anchored:,} tokens) first in this "
        f"layout's kernel order, which moves every other video token from where the same "
        f"order without anchor frames has it (frame {lay.anchor_frames}, place 0: position "
        f"{kernel:,} here, {plain:,} there): a mask file calibrated in that order indexes "
        f"other tokens here. Index the file by kernel position (the generated module's "
        f"layout constant, LAYOUT or <PATTERN>_LAYOUT, maps them to the user's tokens: "
        f".original_index), or leave first_frame out of this pattern"
    )
    return [_at(t, message) for t in _walk(term) if t.op == BLOCKS]


# Ragged cubes are worth a warning where they turn at least this share of the visited tiles
# BOUNDARY (STA's 6 x 8 x 8 cubes on 33 x 45 x 80: 70%; on 30 x 48 x 80, which they divide: 0%).
RAGGED_BOUNDARY_SHARE = 0.25


def _ragged_cubes(pattern) -> str | None:
    """Why a tiled layout's cubes that do not divide the video cost speed, and what divides;
    None where they divide, or leave most visited tiles FULL anyway."""
    g = pattern.layout
    if g.order != TILED:
        return None
    axes = [
        (name, size, cube)
        for name, size, cube in (
            ("frames", g.frames, g.cube_frames),
            ("rows", g.height, g.cube_rows),
            ("cols", g.width, g.cube_cols),
        )
        if size % cube
    ]
    counts = pattern.tile_counts()
    visited = counts["full"] + counts["boundary"]
    if not axes or counts["boundary"] < RAGGED_BOUNDARY_SHARE * max(visited, 1):
        return None
    rest = "; ".join(f"{n} {size} = {size // c} x {c} + {size % c}" for n, size, c in axes)
    divide = "; ".join(
        f"{n} {' or '.join(map(str, _divisors_near(size, c)))}" for n, size, c in axes
    )
    whole = {n: -(-size // c) * c for n, size, c in axes}
    padded = " x ".join(
        str(whole.get(n, size))
        for n, size in (("frames", g.frames), ("rows", g.height), ("cols", g.width))
    )
    return (
        f"cubes of {g.cube_frames} x {g.cube_rows} x {g.cube_cols} do not divide the video's "
        f"{g.frames} x {g.height} x {g.width} ({rest}): the last cubes of those axes are smaller, "
        f"so cubes straddle tiles and {counts['boundary']:,} of {visited:,} visited tiles "
        f"({counts['boundary'] / visited:.0%}) are BOUNDARY, each computing the mask per element. "
        f"Cube sizes that divide: {divide}; or a video of {padded} (padded frames or places)"
    )


def _divisors_near(size: int, cube: int) -> list[int]:
    """The divisors of `size` nearest `cube` from below and from above (the sides that exist)."""
    divisors = [d for d in range(2, size + 1) if size % d == 0]
    below = [d for d in divisors if d < cube]
    above = [d for d in divisors if d > cube]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


# The speed estimate behind the slower-than-dense warning, in units of a FULL 512 x 512 compute
# block's body on v6e (841 bundles, `svgen cost`): a grid step's bookkeeping costs about a third
# of one (284), and every full-block operation of a BOUNDARY block's mask adds at least 0.06
# (bench/residual_cost.py: 0.06-0.12 per operation over seven masks; the low end, so that the
# warning fires only where even the optimistic estimate is slower).
STEP_UNITS = 0.34
UNITS_PER_MASK_OP = 0.06
# ... and only past this ratio: within it the estimate cannot tell (a kernel of one tile, say,
# whose only block holds padding keys in the dense kernel too).
SLOWER_MARGIN = 1.1


def _slower_than_dense(pattern) -> str | None:
    """Why the pattern's kernel would be slower than the same kernel on a dense mask (every
    tile visited, every block FULL), or None; estimated from its block kinds and the
    full-block operations of its BOUNDARY blocks' masks (svgen.analysis.residuals)."""
    kinds, compute, grid = pattern.compute_kinds, pattern.compute_grid, pattern.grid
    area = compute.block_q * compute.block_kv / (512 * 512)
    boundary = kinds == TileKind.BOUNDARY
    ops = np.full(kinds.shape, residuals.estimate_ops(pattern.mask), np.int64)
    if pattern.residuals is not None:
        for j, variant in enumerate(pattern.residuals.variants, 1):
            ops[pattern.residuals.block_variant == j] = variant.ops
    full = int(np.count_nonzero(kinds == TileKind.FULL))
    masked = float((1 + UNITS_PER_MASK_OP * ops[boundary]).sum())
    sparse = STEP_UNITS * pattern.table.visited_steps + area * (full + masked)
    dense = STEP_UNITS * grid.num_q_blocks * grid.num_kv_blocks + area * kinds.size
    if sparse <= SLOWER_MARGIN * dense:
        return None
    mask_ops = int(ops[boundary].max()) if boundary.any() else 0
    return (
        f"its kernel would be about {sparse / dense:.1f}x slower than the same kernel on a "
        f"dense mask (estimated: {pattern.table.visited_steps:,} of "
        f"{grid.num_q_blocks * grid.num_kv_blocks:,} tiles visited, "
        f"{int(boundary.sum()):,} BOUNDARY compute blocks of up to ~{mask_ops} full-block "
        f"operations of mask, each at least {1 + UNITS_PER_MASK_OP * mask_ops:.1f}x a FULL "
        f"block; `svgen cost` measures it). What helps: `tiling.align` (BOUNDARY blocks "
        f"become FULL or EMPTY), tiles the pattern's structure fills, or parts of the mask "
        f"that the analysis can decide per block (see docs/kernels.md, Residual masks)"
    )


def _terms(spec: Spec) -> Iterator[MaskTerm]:
    roots = ([spec.mask] if spec.mask is not None else []) + [t for _, t in spec.patterns]
    for root in roots:
        yield from _walk(root)


def _walk(term: MaskTerm) -> Iterator[MaskTerm]:
    yield term
    for child in term.children:
        yield from _walk(child)


def _say(words: str, n: int, g: TokenLayout) -> str:
    return words.format(n=n, frames=g.frames, height=g.height, width=g.width, seq_len=g.seq_len)


def _at(term: MaskTerm, message: str, param: str | None = None) -> SpecWarning:
    """A warning located at the term's key (a parameter's key path when one is named)."""
    w = term.where
    if w is None:
        return SpecWarning(message, key=param)
    key = f"{w.key}.{param}" if param else w.key
    return SpecWarning(message, w.file, w.line, w.column, key)
