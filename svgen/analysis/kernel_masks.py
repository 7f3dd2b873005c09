"""The masks the kernels run: each candidate pattern's spec terms lowered to the mask IR
(svgen.ir), its kernel order (TokenLayout, with anchor frames for temporal_major), and the
mask over that order's frame (rows and columns exchanged where a frame is walked column by
column; rows and columns refused where a curve scatters them)."""

from __future__ import annotations

from svgen import ir
from svgen.core.layout import FRAME_MAJOR, TokenLayout
from svgen.spec import Spec
from svgen.spec.errors import SpecError


def lower_masks(run) -> None:
    """Pass: per candidate pattern, its spec terms lowered to simplified mask IR."""
    spec = run.spec
    run.masks = [ir.lower(spec, spec.pattern_mask(c.pattern)) for c in run.candidates]


def choose_layouts(run) -> None:
    """Pass: per candidate pattern, its kernel order."""
    run.layouts = [choose_layout(run.spec, c.layout, m) for c, m in zip(run.candidates, run.masks)]


def over_kernel_frames(run) -> None:
    """Pass: per candidate pattern, the mask its kernel runs over its layout's frame."""
    run.masks = [
        _candidate_mask(run.spec, mask, layout, candidate)
        for mask, layout, candidate in zip(run.masks, run.layouts, run.candidates)
    ]


def choose_layout(spec: Spec, order: str, mask: ir.Node) -> TokenLayout:
    """The kernel order `order` over the spec's geometry, with the mask's anchor frames kept
    first where the order is not frame-major."""
    g = spec.geometry
    anchors = 0 if order == FRAME_MAJOR else min(mask.anchor_frames(), g.frames)
    return g.with_order(order, anchors)


def over_kernel_frame(spec: Spec, mask: ir.Node, layout: TokenLayout, order, where, key: str):
    """The mask the kernel of `layout` runs: over a transposed frame (an axis order `order`
    that walks a frame column by column, svgen.core.layout) the mask with rows and columns
    exchanged, so that everything after this point sees one row-major frame. A mask with no
    such form is a SpecError at `where` (key `key`); so is a mask that reads rows or columns
    in a curve layout, whose kernel decodes neither."""
    if layout.curve:
        _check_curve_mask(spec, mask, layout, where, key)
    if not layout.transposed:
        return mask
    try:
        return mask.transposed()
    except ir.NotTransposable as err:
        raise SpecError(
            f"layout {order.words()} walks a frame column by column, and this mask has no "
            f"form over the transposed frame: {err} (the orders whose rows come before their "
            "columns take it: [f, h, w], [h, w, f], [h, f, w])",
            file=spec.source,
            key=key,
            line=where.line if where else None,
            column=where.column if where else None,
        ) from None


def _check_curve_mask(spec: Spec, mask: ir.Node, layout: TokenLayout, where, key: str) -> None:
    """A curve layout (svgen.core.layout) keeps frames and positions as frame_major does and
    scatters each frame's rows and columns along the curve: its kernels decode no row or
    column, so a mask reading them is refused, naming what it reads. Over the whole video the
    frames are scattered too, and decoded neither."""
    scattered = {"h_q", "h_k", "w_q", "w_k"}
    if layout.curve_over_video:
        scattered |= {"f_q", "f_k"}
    names = sorted({s.name for s in mask.predicate().free_symbols} & scattered)
    if not names:
        return
    if layout.curve_over_video:
        walk, decodes = "the whole video", "no frames, rows or columns"
        takes = "positions and text (band, prefix, text, expr over i and is_text)"
    else:
        walk, decodes = "each frame", "no rows or columns"
        takes = (
            "frames, positions and text (first_frame, band, prefix, text, spatial_window with "
            "frames only, expr over f, i and is_text)"
        )
    raise SpecError(
        f"layout {{curve: {layout.curve}}} walks {walk} along a curve, and its kernel "
        f"decodes {decodes}; this mask reads {', '.join(names)}. A curve layout there takes "
        f"masks of {takes}, block masks given as data (blocks) and selections (select)",
        file=spec.source,
        key=key,
        line=where.line if where else None,
        column=where.column if where else None,
    )


def _candidate_mask(spec: Spec, mask: ir.Node, layout: TokenLayout, candidate) -> ir.Node:
    where = candidate.where
    key = "layout" if where is None else f"{where.key}.layout"
    return over_kernel_frame(spec, mask, layout, candidate.layout, where, key)
