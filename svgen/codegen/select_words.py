"""A selection (`select`) in words: the paragraph of a module's docstring that `svgen inspect`
prints too, and the SelectPolicy(...) a module builds."""

from __future__ import annotations

import textwrap

from svgen import ir
from svgen.analysis import Plan
from svgen.codegen import pyformat


def select_doc_lines(plan: Plan) -> list[str]:
    """The selection's paragraph of a module's docstring (`svgen inspect` prints it too): the
    policy, its candidates and scores, per pattern where heads choose otherwise."""
    select = plan.spec.select
    most = plan.select_max_blocks(0)
    return textwrap.wrap(
        "Blocks chosen per call from q and k (the spec's `select`): "
        + (
            "the mask above is always kept; "
            if len(plan.patterns) == 1
            else "each head's pattern above is always kept; "
        )
        + f"besides it, {_select_words(select, most)}. Candidates: the compute "
        f"blocks that {ir.lower(plan.spec, select.candidate).describe()} touches"
        + ("" if len(plan.patterns) == 1 else " (in each pattern's layout)")
        + f"; a chosen block is attended whole. Scores: {_score_words(select)}. No "
        "gradient flows through the selection."
        + "".join(_own_select_words(plan, i) for i in range(len(plan.patterns)))
        + (
            " With the run-time inputs, a chosen block keeps only the pairs of one "
            "segment (and real text), and a block whose queries and keys share no "
            "segment is never chosen."
            if plan.spec.runtime.any
            else ""
        ),
        width=92,
    )


def policy_text(select, most: int) -> str:
    """The generated module's SelectPolicy(...) of a policy whose max resolves to `most`."""
    return (
        f"select.SelectPolicy({pyformat.string(select.rule)}, {select.default!r}, "
        f"{select.min_blocks}, {most}"
        + (f", sampled_rows={select.sampled_rows})" if select.sampled_rows else ")")
    )


def _own_select_words(plan: Plan, index: int) -> str:
    """The docstring's sentence for a pattern whose heads choose otherwise
    (select.patterns.<name>); nothing for the others."""
    name = plan.patterns[index].name
    if plan.spec.select.own(name) is None:
        return ""
    own = plan.select_policy(index)
    candidate = ir.lower(plan.spec, own.candidate).describe()
    return (
        f" Heads of {name} choose otherwise: {_select_words(own, plan.select_max_blocks(index))}"
        f", among the compute blocks that {candidate} touches."
    )


def _score_words(select) -> str:
    """How the module's policy scores blocks (the module docstring's words)."""
    if select.sampled_rows:
        return (
            f"the attention mass of {select.sampled_rows} evenly spaced query rows per compute "
            "block row, per key block (log of the rows' mean share)"
        )
    return "mean-pooled q . mean-pooled k per compute block, scaled by sm_scale"


def _select_words(select, max_blocks: int) -> str:
    """The policy in a sentence (the module docstring's); max_blocks: the spec's `max`, or
    the candidate's bound when it gives none (Plan.select_max_blocks)."""
    bounds = f"at least {select.min_blocks} and at most {max_blocks} blocks per row"
    if select.max_blocks is None:
        bounds += " (the spec gives no max: the most selectable blocks of any row)"
    if select.rule == "top_k":
        return (
            "top_k: per compute block row, the k best candidate blocks "
            f"(k = {int(select.default)} unless the call gives top_k=; {bounds})"
        )
    return (
        "top_p: per compute block row, the fewest best candidate blocks whose softmax mass "
        f"of pooled scores reaches p (p = {select.default} unless the call gives top_p=; "
        f"{bounds})"
    )
