"""Times on the command line: ``now``, ``1h`` (that long ago), ISO 8601 or milliseconds since the
epoch; and durations (``500ms``, ``2s``)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import time

# "-2h" reads as an option to argparse unless written --begin=-2h, so "2h" alone means ago too.
_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
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
    match = _RELATIVE.match(value.lower())
    if match:
        return now - int(float(match.group(1)) * _UNIT_MS[match.group(2)])
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
    """``500ms``, ``2s``, ``5m``, ``1h``, ``1.5`` (seconds) → seconds."""
    raw = text.strip().lower()
    try:
        if raw.endswith("ms"):
            value = float(raw[:-2]) / 1000
        elif raw.endswith("s"):
            value = float(raw[:-1])
        elif raw.endswith("m"):
            value = float(raw[:-1]) * 60
        elif raw.endswith("h"):
            value = float(raw[:-1]) * 3600
        else:
            value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 500ms or 2s, got {text!r}"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return value
