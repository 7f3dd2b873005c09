"""`svgen report`: docs/measured.md's tables and the README's headline, written from the chip's
results in bench/results (svgen.chip.results_tables), between their pages' marker comments.

`--check` writes nothing and exits 1 where a page is not what the results give (a result
added without `svgen report`, a table edited by hand), or where svgen.analysis.targets'
measured chip figures disagree with the results; 2 where the results cannot be read as
bench/results/manifest.json describes them.
"""

from __future__ import annotations

import pathlib
import sys

from svgen.cli.files import write_all
from svgen.cli.messages import EXIT_BAD_INPUT, EXIT_STALE


def report_pages(args) -> int:
    from svgen.chip import results_page, results_tables

    root = pathlib.Path(args.root)
    try:
        pages = results_tables.pages(root)
        mismatches = results_page.fact_mismatches(results_page.facts(results_page.load(root)))
    except results_page.ReportError as exc:
        print(f"svgen: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    stale = [page for page, (now, wanted) in pages.items() if now != wanted]
    for line in mismatches:
        print(f"svgen: error: {line}", file=sys.stderr)
    if args.check:
        for page in stale:
            print(
                f"svgen: error: {page} is not what bench/results gives: run `svgen report`",
                file=sys.stderr,
            )
        return EXIT_STALE if stale or mismatches else 0
    write_all(
        {root / page: wanted.encode() for page, (_, wanted) in pages.items() if page in stale}
    )
    for page in stale:
        print(f"svgen report: wrote {page}", file=sys.stderr)
    return EXIT_STALE if mismatches else 0
