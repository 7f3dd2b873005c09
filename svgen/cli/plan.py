"""A spec's analysis as every command runs it: loaded, linted, analyzed with progress."""

from __future__ import annotations

import dataclasses
import sys

from svgen.analysis import Plan, analyze
from svgen.analysis.targets import TARGETS
from svgen.cli.messages import print_warnings
from svgen.cli.progress import Progress
from svgen.core.program import shrink_steps
from svgen.report import lint
from svgen.spec import load_spec
from svgen.spec.errors import SpecError


def plan_spec(
    spec_file: str, quiet: bool, smem_budget: int, target: str, warn: bool = True
) -> Plan:
    """The spec's analysis for `target`, with its tiling for that chip (`tiling.<target>` where
    the spec names a TPU target, else the plain keys'; a GPU's is the `gpu` section); likely
    mistakes (svgen.report.lint) are printed as warnings on stderr unless `warn` is False, and
    change nothing else."""
    spec = load_spec(spec_file, chip=target if target in TARGETS else None)
    if warn:
        print_warnings(lint.spec_warnings(spec))
    progress = Progress(spec_file, quiet)
    try:
        plan = analyze(spec, progress=progress, smem_budget=smem_budget, target_name=target)
    finally:
        progress.close()
    if warn:
        print_warnings(lint.plan_warnings(plan))
    return plan


def fit_program(plan: Plan, render, spec_file: str, quiet: bool):
    """(plan, files, ProgramSize or None): the module whose kernels fit their chip's
    program budget (svgen.chip.program_size), code left out where needed; a SpecError at the
    spec's tiling where nothing is enough. Without libtpu here: the module as it is, and one
    line saying its size was not counted."""
    from svgen.chip import program_size

    progress = (
        (lambda line: None)
        if quiet
        else (lambda line: print(f"{spec_file}: {line}", file=sys.stderr, flush=True))
    )

    def fits_at(candidate: Plan):
        """The ProgramSize of the candidate with everything the compiler may leave out (one
        count a tiling: what fits then is what a smaller step might), or None."""
        steps = shrink_steps(len(candidate.patterns), candidate.target.cores_per_chip)
        smallest = dataclasses.replace(candidate, program=steps[-1])
        try:
            return program_size.fit(smallest, render, steps=())[2]
        except program_size.OverBudget:
            return None

    def suggest(over: Plan) -> str | None:
        progress("looking for a tiling that fits")
        return program_size.tiling_suggestion(over.spec, over.target.name, fits_at)

    def analyze_at(tiling) -> Plan | None:
        from svgen.chip.measured_tune import with_tiling

        try:
            return analyze(with_tiling(plan.spec, tiling), target_name=plan.target.name)
        except SpecError:  # a tiling the spec cannot take (larger than its sequence, say)
            return None

    if plan.spec.tiling_given and program_size.small_by_construction(plan):
        return plan, render(plan), None  # small tiles: no program comes near the budget
    try:
        if not plan.spec.tiling_given and plan.target.program_measured:
            # No tiling given: the compiler picks one on a chip it has measured.
            fitted = program_size.chip_free(plan, analyze_at, render, progress=progress)
        else:
            fitted = program_size.fit(plan, render, suggest=suggest, progress=progress)
        warning = fitted[2].warning()
        if warning:  # said whether quiet or not, as every warning is
            print(f"svgen: warning: {spec_file}: {warning}", file=sys.stderr)
        return fitted
    except program_size.Unavailable as exc:
        if not quiet:
            print(f"svgen: warning: {spec_file}: program size not counted: {exc}", file=sys.stderr)
        return plan, render(plan), None
    except program_size.OverBudget as exc:
        raise SpecError(str(exc), file=spec_file, key="tiling") from None
