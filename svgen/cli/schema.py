"""`svgen schema`: the JSON Schema of spec files (svgen.schema.json, for editors)."""

from __future__ import annotations

import sys


def print_schema(args) -> int:
    from svgen.spec.schema import schema_text

    sys.stdout.write(schema_text())
    return 0
