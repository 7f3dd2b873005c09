"""`svgen fingerprint`: the fingerprints of what `svgen bench` times (svgen.chip.fingerprint),
for the specs of the references (bench/results/fingerprints.json) or those named.

Without options it prints them as JSON; `--write` rewrites the references (after a kernel
change that is meant: results timed before then no longer match HEAD's on docs/measured.md);
`--check` exits 1 and names each spec, direction and part that differs from them. Runs on
any host: the spec is compiled as bench compiles it and its calls are traced and lowered for
a TPU, never run.
"""

from __future__ import annotations

import json
import pathlib
import sys

from svgen.cli.files import write_all
from svgen.cli.messages import EXIT_STALE


def fingerprint_specs(args) -> int:
    from svgen.chip import chip_bench, fingerprint
    from svgen.spec import load_spec

    root = pathlib.Path(args.root)
    paths = args.specs or fingerprint.reference_paths(root)
    found = {}
    for relative in paths:
        if not args.quiet:
            print(f"svgen fingerprint: {relative}", file=sys.stderr, flush=True)
        spec = load_spec(root / relative, chip=fingerprint.REFERENCE_TARGET)
        found[str(relative)] = chip_bench.fingerprint_spec(spec, fingerprint.REFERENCE_TARGET)
    path = root / fingerprint.REFERENCES
    if args.write:
        text = json.dumps(fingerprint.reference_file(found), indent=1, sort_keys=True) + "\n"
        write_all({path: text.encode()})
        print(f"svgen fingerprint: wrote {path} ({len(found)} specs)", file=sys.stderr)
        return 0
    if args.check:
        lines = fingerprint.differences(json.loads(path.read_text())["specs"], found)
        for line in lines:
            print(line)
        print(
            f"svgen fingerprint: {len(lines)} difference(s) from {path}"
            + (f"; `{fingerprint.WRITE_COMMAND}` accepts them" if lines else ""),
            file=sys.stderr,
        )
        return EXIT_STALE if lines else 0
    print(json.dumps(found, indent=1, sort_keys=True))
    return 0
