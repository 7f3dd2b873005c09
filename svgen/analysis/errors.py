"""SpecErrors about the sections a call builds its tables from (`select`, runtime.kv_cache),
located at the key they are about."""

from __future__ import annotations

from svgen.spec import Spec
from svgen.spec.errors import SpecError


def candidate_key(spec: Spec, pattern: str) -> str:
    """Where the candidate of a pattern's heads is written (an entry that gives none holds
    the section's own)."""
    own = spec.select.own(pattern)
    if own is not None and own.candidate is not spec.select.candidate:
        return f"select.patterns.{pattern}.candidate"
    return "select.candidate"


def select_error(spec: Spec, key: str, message: str) -> SpecError:
    """An error about the `select` section, at its line (a pattern's entry's, for its key)."""
    where = spec.select.where
    for own in spec.select.patterns:
        if key.startswith(f"select.patterns.{own.pattern}."):
            where = own.where or where
    return SpecError(
        message,
        file=spec.source,
        key=key,
        line=where.line if where else None,
        column=where.column if where else None,
    )


def kv_cache_error(spec: Spec, message: str) -> SpecError:
    """An error about `runtime.kv_cache`, at its key."""
    where = spec.runtime.where
    if where is None:
        return SpecError(message, file=spec.source, key="runtime.kv_cache")
    return SpecError(message, file=where.file, line=where.line, column=where.column, key=where.key)
