"""Plain-text tables and key/value blocks for people (``--json`` is for scripts)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

# A column: (key in the row, header). Rows lacking the key show "-".
Column = tuple[str, str]


def cell(value: Any, key: str = "") -> str:
    """One value as table text: booleans as yes/no, times, durations and sizes readable
    (by the key's suffix), nested data as compact JSON."""
    if key and value is not None and not isinstance(value, bool):
        special = _by_key(key, value)
        if special is not None:
            return special
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def render_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Left-aligned text columns (numbers right-aligned), two spaces apart."""
    texts = [[cell(row.get(key), key) for key, _ in columns] for row in rows]
    numeric = [
        bool(rows) and all(_is_plain_number(key, row.get(key)) for row in rows)
        for key, _ in columns
    ]
    widths = [
        max([len(header)] + [len(t[i]) for t in texts]) for i, (_, header) in enumerate(columns)
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line([header for _, header in columns])]
    out.extend(line(t) for t in texts)
    return "\n".join(out)


def _is_plain_number(key: str, value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and _by_key(key, value) is None
    )


def render_record(record: Mapping[str, Any], fields: Sequence[Column] | None = None) -> str:
    """``Header:  value`` lines; ``fields`` picks and orders them (default: every key)."""
    pairs = fields or [(key, header_for(key).lower()) for key in record if record[key] != {}]
    present = [(key, header) for key, header in pairs if key in record]
    width = max((len(header) for _, header in present), default=0) + 1
    return "\n".join(
        f"{(header + ':').ljust(width)}  {cell(record[key], key)}" for key, header in present
    )


def columns_for(rows: Sequence[Mapping[str, Any]], preferred: Sequence[Column]) -> list[Column]:
    """The preferred columns the rows have, then any other scalar keys they carry."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    chosen = [(key, header) for key, header in preferred if key in keys]
    known = {key for key, _ in preferred}
    chosen.extend(
        (key, header_for(key))
        for key in keys
        if key not in known and all(not isinstance(row.get(key), Mapping | list) for row in rows)
    )
    return chosen or list(preferred)


def format_ms(ms: int | None) -> str | None:
    """Milliseconds since the epoch as local ``YYYY-MM-DD HH:MM:SS.mmm`` (None stays None)."""
    if ms is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def header_for(key: str) -> str:
    """A column header for a key.

    ``created_ms`` → ``CREATED``, ``disk_bytes`` → ``DISK``, ``queue_count`` → ``QUEUE COUNT``.
    """
    for suffix in ("_ms", "_bytes", "_timestamp"):
        if key.endswith(suffix) and key != suffix.lstrip("_"):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ").upper()


def _by_key(key: str, value: Any) -> str | None:
    if isinstance(value, int) and (
        key.endswith(("created_ms", "_timestamp")) or key == "timestamp"
    ):
        return format_ms(value)
    if isinstance(value, int) and key.endswith("_ms"):
        return format_duration_ms(value)
    if isinstance(value, int) and key.endswith("_bytes"):
        return format_size(value)
    if key == "retry_policy" and isinstance(value, Mapping):
        return format_retry_policy(value)
    return None


def format_duration_ms(ms: int) -> str:
    """``93_000`` → ``1m33s``; under a second in ms."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts[:2])


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


def format_retry_policy(policy: Mapping[str, Any]) -> str:
    if policy.get("kind") == "exponential":
        return (
            f"exponential {format_duration_ms(int(policy.get('initial_ms', 0)))} "
            f"x{policy.get('multiplier')} up to {format_duration_ms(int(policy.get('max_ms', 0)))}"
        )
    levels = policy.get("levels_ms") or []
    return "customized " + " ".join(format_duration_ms(int(level)) for level in levels)
