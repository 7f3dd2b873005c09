"""`svgen inspect` as text for people: the plan in the words of the generated module's
docstring (svgen.codegen.words, one wording for both), then each pattern's tile map.
`--json` has every number, unrounded.

A density the analysis only bounded (a user predicate past its evaluation budget,
`density_is_exact` false) is never reported as the density: `density` is then null and the
bounds are `density_lower` and `density_upper`.
"""

from __future__ import annotations

from svgen.analysis import Plan
from svgen.codegen import select_doc_lines, words
from svgen.codegen.backends import backend_of
from svgen.codegen.tilemap import render_tile_map


def inspect_lines(plan: Plan, spec_file: str) -> list[str]:
    """The whole text report: the kernel, how heads get their pattern, then per pattern its
    statistics and tile map, as the module's docstring says them."""
    lines = [f"{plan.spec.name} ({spec_file})"]
    backend = backend_of(plan)
    lines += [f"  {line}" for line in words.kernel_lines(plan, backend)]
    lines.append(f"  Heads: {words.heads_words(plan)}")
    lines += _call_input_lines(plan)
    single = len(plan.patterns) == 1
    for index, pattern in enumerate(plan.patterns):
        title = "Pattern" if single else f"Pattern {index}, {pattern.name}"
        residuals = words.residual_names(pattern, "" if single else f"{pattern.name}_")
        lines += ["", f"  {title}: {pattern.mask.describe()}"]
        lines += [f"    {line}" for line in words.pattern_lines(pattern, residuals, plan, backend)]
        lines.append("    Tile map:")
        lines += [f"      {line}" for line in render_tile_map(pattern.kinds)]
    return lines


def _call_input_lines(plan: Plan) -> list[str]:
    """What each call takes besides q, k and v, in the module docstring's words: the spec's
    run-time inputs (segment ids, text lengths, a KV-cache chunk's frame offset) and a
    selection's policy (blocks chosen from q and k). Nothing for a spec with neither."""
    lines = []
    runtime = plan.spec.runtime
    inputs = words.runtime_input_lines(runtime)
    if runtime.any:
        lines += ["", "  Run-time inputs (the spec's `runtime` section), given per call: they only"]
        lines += ["  remove pairs from the compiled mask, with no recompilation:"]
    elif runtime.kv_cache:
        lines += ["", "  Chunked calls (the spec's `runtime.kv_cache`), one compile for every"]
        lines += ["  chunk position:"]
    lines += [f"    {line}" for line in inputs]
    if plan.spec.select is not None:
        lines += [""] + [f"  {line}" for line in select_doc_lines(plan)]
    return lines


def density_bounds_words(low: float, high: float) -> str:
    """A bounded density in words (`svgen inspect` and the compile summary)."""
    return (
        f"between {_fraction(low)} and {_fraction(high)} of token pairs kept (bounds, not "
        f"the density: a user predicate was not evaluated everywhere)"
    )


def _fraction(x: float) -> str:
    """Four decimals; small values in significant digits, so that they do not read as 0."""
    return f"{x:.4f}" if x == 0 or x >= 0.001 else f"{x:.3g}"
