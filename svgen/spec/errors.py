"""User-facing errors raised while reading and checking specs (and the location format that
warnings about a spec share with them)."""

from __future__ import annotations


class SpecError(Exception):
    """One clear, user-facing error in a spec: file, line, column, key path, message.

    ``str(error)`` reads ``file:line:column: key: message``; parts that are ``None``
    are left out (``file: key: message``, ``key: message`` or just ``message``).
    ``line`` and ``column`` are 1-based.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        key: str | None = None,
    ):
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.key = key
        super().__init__(self._format())

    def _format(self) -> str:
        return locate(self.message, self.file, self.line, self.column, self.key)

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self):
        return (_rebuild_spec_error, (self.message, self.file, self.line, self.column, self.key))


def locate(
    message: str,
    file: str | None = None,
    line: int | None = None,
    column: int | None = None,
    key: str | None = None,
) -> str:
    """``file:line:column: key: message``, leaving out the parts that are None: the one
    format of errors and warnings about a spec, so editors jump to both alike."""
    where = ""
    if file is not None:
        where = str(file)
    if line is not None:
        where = f"{where}:{line}" if where else str(line)
        if column is not None:
            where = f"{where}:{column}"
    parts = []
    if where:
        parts.append(where)
    if key:
        parts.append(key)
    parts.append(message)
    return ": ".join(parts)


def _rebuild_spec_error(message, file, line, column, key):
    return SpecError(message, file=file, line=line, column=column, key=key)
