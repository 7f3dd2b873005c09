"""Progress on stderr while an analysis or a tuning runs: one status line, rewritten in
place on a terminal, and plain lines, seldom, in a log."""

from __future__ import annotations

import sys
import time

# Report progress for analyses that take longer than this (seconds).
PROGRESS_AFTER = 1.0
REFRESH_EVERY = 0.1  # seconds between updates of the progress line on a terminal
LOG_EVERY = 10.0  # seconds between progress lines when stderr is a file or a pipe


class StatusLine:
    """One status line on stderr. On a terminal it is rewritten in place (carriage return);
    in a log a carriage return erases nothing and the updates would pile up into one huge
    line, so there: plain lines, at most one every LOG_EVERY seconds unless forced."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.live = _is_terminal(self.stream)
        self.last_shown: float | None = None
        self.line_open = False  # a live line without its newline yet

    def due(self, force: bool = False) -> bool:
        """Whether an update now would not flood the stream (and if so, count it shown)."""
        now = time.perf_counter()
        interval = REFRESH_EVERY if self.live else LOG_EVERY
        if not force and self.last_shown is not None and now - self.last_shown < interval:
            return False
        self.last_shown = now
        return True

    def show(self, text: str, final: bool = False) -> None:
        if self.live:
            print(f"\r\x1b[2K{text}", end="\n" if final else "", file=self.stream, flush=True)
            self.line_open = not final
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End a live line cut short (an error), so the next message starts on its own line."""
        if self.line_open:
            print(file=self.stream, flush=True)
            self.line_open = False


class Progress(StatusLine):
    """Analysis progress, once an analysis has run for `after` seconds."""

    def __init__(self, label: str, quiet: bool, stream=None, after: float = PROGRESS_AFTER):
        super().__init__(stream)
        self.label, self.quiet, self.after = label, quiet, after
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.quiet or time.perf_counter() - self.start < self.after:
            return
        final = done == total
        if self.due(force=final):
            self.show(f"  {self.label}: classified {done}/{total} q tiles", final)


class TuneProgress(StatusLine):
    """Tune progress: every compile (tens of seconds apart) and the analyses between them."""

    def __init__(self, quiet: bool, stream=None):
        super().__init__(stream)
        self.quiet = quiet

    def __call__(self, what: str, done: int, total: int) -> None:
        compile_step = total == 0
        if self.quiet or not self.due(force=compile_step or done == total):
            return
        text = f"  tune: {what}" + (f" [{done}/{total}]" if total else f" [compile {done}]")
        self.show(f"{text} {_bar(done, total)}" if self.live and total else text)


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
