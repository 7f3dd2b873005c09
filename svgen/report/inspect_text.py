"""`svgen inspect` as text for people: the plan in the words of the generated module's
docstring (svgen.codegen.words, one wording for both), then each pattern's tile map.
`--json` has every number, unrounded.

A density the analysis only bounded (a user predicate past its evaluation budget,
`density_is_exact` false) is never reported as the density: `density` is then null and the
bounds are `density_lower` and `density_upper`.
"""

from __future__ import annotations

from svgen.analysis import Plan
from svgen.codegen import words
from svgen.codegen.backends import backend_of
from svgen.codegen.tilemap import render_tile_map


def inspect_lines(plan: Plan, spec_file: str) -> list[str]:
    """The whole text report: the kernel, how heads get their pattern, then per pattern its
    statistics and tile map, as the module's docstring says them."""
    lines = [f"{plan.spec.name} ({spec_file})"]
    backend = backend_of(plan)
    lines += [f"  {line}" for line in words.kernel_lines(plan, backend)]
    lines.append(f"  Heads: {words.heads_words(plan)}")
    single = len(plan.patterns) == 1
    for index, pattern in enumerate(plan.patterns):
        title = "Pattern" if single else f"Pattern {index}, {pattern.name}"
        residuals = words.residual_names(pattern, "" if single else f"{pattern.name}_")
        lines += ["", f"  {title}: {pattern.mask.describe()}"]
        lines += [f"    {line}" for line in words.pattern_lines(pattern, residuals, plan, backend)]
        lines.append("    Tile map:")
        lines += [f"      {line}" for line in render_tile_map(pattern.kinds)]
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
