"""How the command reports trouble: its exit statuses, spec errors located at
file:line:column, and warnings on stderr."""

from __future__ import annotations

import pathlib
import sys

import yaml

from svgen.spec.errors import SpecError

EXIT_STALE = 1
EXIT_BAD_INPUT = 2


def located(err: SpecError) -> SpecError:
    """`err` with the line and column of its key in its spec file, when it names a key but
    not where it is written (the analysis knows the key path, not the YAML node): the key's
    value, else its nearest written parent (`tiling` when the tiling is the default: the
    file's first line), so that every message about a spec reads file:line:col: key."""
    if err.line is not None or err.file is None or not err.key:
        return err
    try:
        text = pathlib.Path(err.file).read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (OSError, UnicodeError, yaml.YAMLError):
        return err
    if node is None:
        return err
    for part in err.key.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        found = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
        if not found:
            break
        node = found[0]
    mark = node.start_mark
    return SpecError(
        err.message, file=err.file, line=mark.line + 1, column=mark.column + 1, key=err.key
    )


def print_warnings(warnings) -> None:
    for warning in warnings:
        print(f"svgen: warning: {warning}", file=sys.stderr)
