"""Reading YAML nodes with file/line/column/key errors: `Reader`, the one place values are
checked and converted, and how keys and values are shown in messages.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from svgen.spec.errors import SpecError
from svgen.spec.limits import (
    MAX_NAME_LEN,
)
from svgen.spec.model import Location, NAME_PATTERN, NAME_RE, reserved_name_reason

# ----------------------------------------------------------------------------- node helpers

MISSING = object()


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Reader:
    def __init__(self, text: str, source: str):
        self.text = text
        self.source = source
        self._constructor = yaml.constructor.SafeConstructor()

    # -- errors
    def error(self, node: Node | None, key: str | None, message: str) -> SpecError:
        if node is None:
            return SpecError(message, file=self.source, key=key or None)
        mark = node.start_mark
        return SpecError(
            message, file=self.source, line=mark.line + 1, column=mark.column + 1, key=key or None
        )

    def location(self, node: Node, key: str) -> Location:
        return Location(self.source, node.start_mark.line + 1, node.start_mark.column + 1, key)

    # -- values
    def scalar(self, node: Node, path: str | None = None) -> Any:
        """The Python value of a scalar node (int, float, bool, None, str, ...)."""
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # e.g. an unknown tag such as !foo
            self._constructor.recursive_objects.clear()
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.error(node, path, f"unsupported YAML value: {problem}") from None
        except (ValueError, OverflowError):
            # An integer of thousands of digits (Python refuses to convert it), a timestamp
            # such as 2024-13-45: a value no key here could accept anyway.
            self._constructor.recursive_objects.clear()
            raise self.error(
                node, path, f"unsupported YAML value: cannot read {abbreviate(node.value)}"
            ) from None

    def describe(self, node: Node) -> str:
        """What a node holds, for 'got ...' in messages."""
        if isinstance(node, MappingNode):
            return "an empty mapping" if not node.value else "a mapping"
        if isinstance(node, SequenceNode):
            return "an empty list" if not node.value else "a list"
        try:
            value = self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError:
            self._constructor.recursive_objects.clear()
            return f"a value tagged {node.tag}"
        except (ValueError, OverflowError):
            self._constructor.recursive_objects.clear()
            return f"an unreadable value ({abbreviate(node.value)})"
        if value is None:
            return "null"
        if isinstance(value, bool):
            return f"a boolean ({node.value})"
        if isinstance(value, int):
            return f"an integer ({show_int(value)})"
        if isinstance(value, float):
            return f"a number ({_clip(node.value)})"
        if isinstance(value, str):
            return f"a string ({abbreviate(value)})"
        return f"a {type(value).__name__} ({_clip(node.value)})"

    def mapping(
        self,
        node: Node,
        path: str,
        allowed: tuple[str, ...],
        what: str = "a mapping",
        allowed_note: str | None = None,
    ) -> dict[str, tuple[Node, Node]]:
        """Check a mapping node: no duplicate or unknown keys. Returns key -> (key node, value node)."""
        if not isinstance(node, MappingNode):
            raise self.error(node, path, f"must be {what}, got {self.describe(node)}")
        out: dict[str, tuple[Node, Node]] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode):
                raise self.error(
                    knode, path, f"keys must be plain names, got {self.describe(knode)}"
                )
            key = knode.value
            shown = key_text(key)
            if key in out:
                first = out[key][0].start_mark.line + 1
                raise self.error(
                    knode,
                    join_path(path, shown),
                    f"duplicate key '{shown}' (first given on line {first})",
                )
            if key not in allowed:
                note = allowed_note or (
                    f"allowed keys: {', '.join(allowed)}" if allowed else "no keys are allowed"
                )
                raise self.error(knode, join_path(path, shown), f"unknown key '{shown}'; {note}")
            out[key] = (knode, vnode)
        return out

    def require(self, node: Node, path: str, entries: dict, keys: tuple[str, ...]) -> None:
        for key in keys:
            if key not in entries:
                raise self.error(node, path, f"missing required key '{key}'")

    def integer(self, node: Node, path: str, minimum: int, maximum: int, limit: str) -> int:
        """An integer in [minimum, maximum]; ``limit`` names the maximum in the message
        (every integer is range-checked here, before any arithmetic sees it)."""
        desc = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        value = self.scalar(node, path) if isinstance(node, ScalarNode) else MISSING
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(node, path, f"must be {desc}, got {self.describe(node)}")
        if value < minimum:
            raise self.error(node, path, f"must be {desc}, got {show_int(value)}")
        if value > maximum:
            raise self.error(
                node, path, f"must be at most {maximum:,} ({limit}), got {show_int(value)}"
            )
        return value

    def string(self, node: Node, path: str, what: str = "a string") -> str:
        value = self.scalar(node, path) if isinstance(node, ScalarNode) else MISSING
        if not isinstance(value, str):
            raise self.error(node, path, f"must be {what}, got {self.describe(node)}")
        return value

    def choice(self, node: Node, path: str, choices: tuple) -> Any:
        value = self.scalar(node, path) if isinstance(node, ScalarNode) else MISSING
        ok = any(type(value) is type(c) and value == c for c in choices)
        if not ok:
            listed = ", ".join(str(c) for c in choices)
            got = self.describe(node)
            if (
                isinstance(value, (str, int))
                and not isinstance(value, bool)
                and value is not MISSING
            ):
                got = abbreviate(value) if isinstance(value, str) else show_int(value)
            raise self.error(node, path, f"must be one of {listed}, got {got}")
        return value

    def name(self, node: Node, path: str, what: str = "a name") -> str:
        must = f"{what} matching {NAME_PATTERN} of at most {MAX_NAME_LEN} characters"
        value = self.string(node, path, must)
        if not NAME_RE.match(value) or len(value) > MAX_NAME_LEN:
            raise self.error(node, path, f"must be {must}, got {abbreviate(value)}")
        return value

    def unreserved(self, node: Node, path: str, name: str, becomes: str) -> str:
        """``name`` unless it is a keyword, builtin or module name (``becomes`` says why
        that matters for this name)."""
        reason = reserved_name_reason(name)
        if reason is not None:
            raise self.error(
                node,
                path,
                f"{name!r} is {reason}; {becomes}, so it may not be "
                f"a keyword, builtin or module name: choose another",
            )
        return name


def show_int(value: int) -> str:
    """An integer for a message: in full unless it has more digits than any limit."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def key_text(key: str, keep: int = 80) -> str:
    """A key as written, cut short for a key path (a key may be any length)."""
    return key if len(key) <= keep else f"{key[:keep]}..."


def _clip(text: str, keep: int = 80) -> str:
    """``text`` as written, cut short so that one hostile value cannot flood the message."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def abbreviate(text: str, keep: int = 80) -> str:
    """``repr(text)``, cut short so that one hostile value cannot flood the message."""
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}... ({len(text)} characters)"
