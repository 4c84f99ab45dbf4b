"""Plain-text tables and key/value blocks for people (``--json`` is for scripts)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

# A column: (key in the row, header). Rows lacking the key show "-".
Column = tuple[str, str]


def cell(value: Any) -> str:
    """One value as table text: booleans as yes/no, nested data as compact JSON."""
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
    texts = [[cell(row.get(key)) for key, _ in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(key), int | float) and not isinstance(row.get(key), bool)
            for row in rows) and bool(rows)
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


def render_record(record: Mapping[str, Any], fields: Sequence[Column] | None = None) -> str:
    """``Header:  value`` lines; ``fields`` picks and orders them (default: every key)."""
    pairs = fields or [(key, key.replace("_", " ")) for key in record]
    present = [(key, header) for key, header in pairs if key in record]
    width = max((len(header) for _, header in present), default=0) + 1
    return "\n".join(f"{(header + ':').ljust(width)}  {cell(record[key])}" for key, header in present)


def columns_for(rows: Sequence[Mapping[str, Any]], preferred: Sequence[Column]) -> list[Column]:
    """The preferred columns the rows have, then any other scalar keys they carry."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    chosen = [(key, header) for key, header in preferred if key in keys]
    known = {key for key, _ in preferred}
    chosen.extend(
        (key, key.replace("_", " ").upper())
        for key in keys
        if key not in known and all(not isinstance(row.get(key), Mapping | list) for row in rows)
    )
    return chosen or list(preferred)


def format_ms(ms: int | None) -> str | None:
    """Milliseconds since the epoch as local ``YYYY-MM-DD HH:MM:SS.mmm`` (None stays None)."""
    if ms is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"
