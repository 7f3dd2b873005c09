"""Code a kernel may leave out to keep its program small: the compiler's lever against the
program-size cliff (svgen.chip.program_size). NumPy-free, shared by the compiler, which
decides, and the runtime, which builds the kernel it was told to.

On a TPU v5e, past the chip's instruction memory a kernel ran at a fraction of the rate of a
smaller program doing the same work (the core fetches its program as it runs); straight-line
BOUNDARY bodies gained little where they fit, and residual-mask variants are what made the
largest programs (docs/measured.md, "The program-size cliff"). Both are given up, in that
order, before a tiling is refused.

A module of several patterns first splits its forward kernel into one call per pattern
(`pattern_calls`): each call walks only the heads of its pattern and carries only that
pattern's code, so a head pays for its own pattern's code, not for the union's; the calls
write one output, each its own heads' rows. What it costs is a kernel launch and a pipeline
start per pattern, against a program that no longer grows with the number of patterns.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProgramLimits:
    """What the compiler left out of a kernel. straight_words: the most straight-line
    BOUNDARY bodies a pattern gets (None: the runtime's default, straight.MAX_WORDS);
    residual_masks: False runs every BOUNDARY block's whole mask; pattern_calls: one
    forward kernel per pattern instead of one for all (see the module docstring)."""

    straight_words: int | None = None
    residual_masks: bool = True
    # One forward kernel call per pattern, over the heads that chose it (a module of several
    # patterns on a chip of one TensorCore: its flat walk is what skips the other heads).
    pattern_calls: bool = False

    @property
    def is_default(self) -> bool:
        return self == ProgramLimits()

    def source(self) -> str:
        """The constructor call a generated module holds (its non-default fields only)."""
        fields = []
        if self.pattern_calls:
            fields.append("pattern_calls=True")
        if self.straight_words is not None:
            fields.append(f"straight_words={self.straight_words}")
        if not self.residual_masks:
            fields.append("residual_masks=False")
        return f"ProgramLimits({', '.join(fields)})"

    def words(self) -> str:
        """What was left out, in words ('' when nothing)."""
        parts = []
        if self.pattern_calls:
            parts.append("one forward kernel per pattern")
        if self.straight_words == 0:
            parts.append("no straight-line BOUNDARY bodies")
        elif self.straight_words is not None:
            parts.append(f"at most {self.straight_words} straight-line BOUNDARY bodies a pattern")
        if not self.residual_masks:
            parts.append("whole masks on BOUNDARY blocks (no residual-mask variants)")
        return "; ".join(parts)


#: The steps the compiler takes, cheapest first, while a kernel is over its chip's budget.
SHRINK_STEPS = (
    ProgramLimits(straight_words=0),
    ProgramLimits(straight_words=0, residual_masks=False),
)


def shrink_steps(patterns: int, tensor_cores: int) -> tuple[ProgramLimits, ...]:
    """The shrink steps of a module of `patterns` patterns on a chip of `tensor_cores`
    TensorCores: with several patterns on one core, one kernel per pattern first (it leaves
    out no path a head takes), then each of SHRINK_STEPS with it."""
    if patterns < 2 or tensor_cores != 1:
        return SHRINK_STEPS
    split = ProgramLimits(pattern_calls=True)
    return (split,) + tuple(dataclasses.replace(s, pattern_calls=True) for s in SHRINK_STEPS)
