"""A dependency-free progress bar on stderr, drawn only when stderr is a terminal.

Scripts and pipes see nothing (stderr stays clean for the one error line);
people see ``label [#########.........]  4,200/10,000  42%``, redrawn at most
ten times a second and erased when the operation ends.
"""

from __future__ import annotations

import sys
import time
from typing import IO

BAR_WIDTH = 30
REDRAW_SECONDS = 0.1


class ProgressBar:
    """``with ProgressBar(total, "sending") as bar: bar.update(done)``; total may be unknown
    (None)."""

    def __init__(
        self,
        total: int | None,
        label: str,
        stream: IO[str] | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_tty(self.stream) if enabled is None else enabled
        self.done = 0
        self._last_draw = 0.0
        self._drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int, *, force: bool = False) -> None:
        self.done = done
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < REDRAW_SECONDS:
            return
        self._last_draw = now
        self.stream.write("\r" + self.render() + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def advance(self, count: int = 1) -> None:
        self.update(self.done + count)

    def render(self) -> str:
        if not self.total:
            return f"{self.label}  {self.done:,}"
        share = min(1.0, self.done / self.total)
        filled = int(share * BAR_WIDTH)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        return f"{self.label} [{bar}]  {self.done:,}/{self.total:,}  {share * 100:.0f}%"

    def close(self) -> None:
        """Erase the bar so what follows starts on a clean line."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
