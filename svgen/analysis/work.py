"""The analysis's work limits (svgen.spec.limits): masks whose row sets would cost too much to
classify are refused before anything is classified (an estimate from sampled rows), and a
classification stopped by its budget on the way is the same error, at the pattern's mask."""

from __future__ import annotations

from svgen import ir
from svgen.analysis import axis_terms, rowsets
from svgen.analysis.run import Settings
from svgen.core.layout import FRAME_MAJOR, TokenLayout
from svgen.spec import Spec
from svgen.spec.errors import SpecError
from svgen.spec.limits import ROW_SET_WORK, WorkOverLimit


def row_set_rows(spec: Spec, mask: ir.Node, layout: TokenLayout) -> int:
    """How many query rows `classify_tiles` builds row sets for (mirrors its dispatch): one
    frame's for a frame-invariant mask in frame-major order, none for a per-axis mask (its
    product boxes), else every row."""
    if (
        layout.text_tokens == 0
        and layout.frames > 1
        and layout.order == FRAME_MAJOR
        and mask.frame_invariant()
        and spec.tiling.align == "exact"
    ):
        return layout.tokens_per_frame
    return 0 if axis_terms.applies(mask, layout) else layout.seq_len


def check_row_set_work(run) -> None:
    """Pass: refuse, before classifying anything, masks whose row sets would build more than
    MAX_ROW_SET_WORK intervals over all candidate patterns together (estimated from sampled
    rows, see rowsets.estimate_work): the work grows with terms x rows x intervals per row,
    which the limits on the spec's size do not bound."""
    spec, settings = run.spec, run.settings
    t, left = spec.tiling, settings.row_set_work
    for candidate, mask, layout in zip(run.candidates, run.masks, run.layouts):
        rows = row_set_rows(spec, mask, layout)
        if rows == 0:
            continue
        work = rowsets.estimate_work(mask, layout, t.block_q, t.block_kv, rows, left)
        if work is None:
            raise _row_set_error(spec, candidate.pattern, rows, layout, settings)
        left -= work


def _row_set_error(
    spec: Spec, name: str, rows: int, layout: TokenLayout, settings: Settings
) -> SpecError:
    return _mask_error(
        spec,
        name,
        f"needs more than {settings.row_set_work:,} row-set intervals to classify "
        f"(MAX_ROW_SET_WORK: the allowed keys of {rows:,} query rows in {layout.order} order "
        f"as intervals, summed over its terms and every candidate pattern); use fewer or "
        f"smaller terms (a union of many windows), fewer tokens, or built-ins the per-axis "
        f"analysis takes (at most {axis_terms.MAX_TERMS} terms once unions are expanded)",
    )


def _mask_error(spec: Spec, name: str, message: str) -> SpecError:
    """A SpecError at the mask key of pattern `name` (file:line:col)."""
    where = spec.pattern_mask(name).where
    which = f"pattern {name!r}" if spec.heads is not None else "the mask"
    if where is None:
        return SpecError(f"{which} {message}", file=spec.source, key="mask")
    return SpecError(
        f"{which} {message}", file=where.file, line=where.line, column=where.column, key=where.key
    )


def work_error(
    spec: Spec, over: WorkOverLimit, name: str, mask, layout, settings: Settings
) -> SpecError:
    """The error of a classification stopped by its work budget."""
    if over.work is ROW_SET_WORK:
        return _row_set_error(spec, name, row_set_rows(spec, mask, layout), layout, settings)
    terms = len(axis_terms.polynomial(mask, (layout.frames, layout.height, layout.width)) or ())
    return _mask_error(
        spec,
        name,
        f"needs more than {settings.product_work:,} box pairs x terms to classify "
        f"(MAX_PRODUCT_WORK: {layout.seq_len:,} tokens in {layout.order} order, whose tiles "
        f"break into coordinate boxes, times the {terms} terms of its inclusion-exclusion "
        f"sum); use fewer primitives in one any_of or all_of, cubes that divide the geometry, "
        f"or fewer tokens",
    )
