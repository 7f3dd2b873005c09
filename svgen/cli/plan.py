"""A spec's analysis as every command runs it: loaded, linted, analyzed with progress."""

from __future__ import annotations

from svgen.analysis import Plan, analyze
from svgen.analysis.targets import TARGETS
from svgen.cli.messages import print_warnings
from svgen.cli.progress import Progress
from svgen.report import lint
from svgen.spec import load_spec


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
