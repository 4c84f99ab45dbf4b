"""Times on the command line: ``now``, ``1h`` (that long ago), ISO 8601 or milliseconds since the
epoch; and durations (``500ms``, ``2s``)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import time

from halfmoon.config import parse_duration_ms

# "-2h" reads as an option to argparse unless written --begin=-2h, so "2h" alone means ago too.
_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
TIME_HELP = (
    "now, 30m / 2h / 1d (that long ago), 2026-01-31T12:00[:00][Z|+01:00] (local time "
    "without a zone), or epoch ms"
)


def parse_time_ms(text: str, now_ms: int | None = None) -> int:
    """Milliseconds since the epoch; raises argparse.ArgumentTypeError for anything else."""
    value = text.strip()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if value.lower() == "now":
        return now
    if _RELATIVE.match(value.lower()):
        return now - int(parse_duration_ms(value.lstrip("-")))
    if value.isdigit():
        return int(value)
    try:
        parsed = dt.datetime.fromisoformat(value.replace(" ", "T", 1) if " " in value else value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad time {text!r}: expected {TIME_HELP}") from None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()  # local time, as people read clocks
    return int(parsed.timestamp() * 1000)


def duration(text: str) -> float:
    """A positive duration in seconds: ``500ms``, ``2s``, ``5m``, ``1h``, ``1d``, or a bare
    number of seconds (``1.5``); read as configuration keys read theirs."""
    try:
        seconds = parse_duration_ms(text, bare_unit_ms=1000) / 1000
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: {exc}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return seconds
