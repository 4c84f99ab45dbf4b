"""Results of a benchmark run: measurements, rows, targets, and how they print.

A *row* is one scenario (say "append, async, 1 KiB"); it holds one
:class:`Measurement` per system, halfmoon first, and prints the ratio
halfmoon/peer for every peer. Throughput is counted in messages and in
record bytes (the same bytes for every system), MB = 10^6 bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

HALFMOON = "halfmoon"


@dataclass(slots=True)
class Measurement:
    """How long one system took to move ``messages`` records of ``bytes`` in total."""

    system: str
    messages: int
    bytes: int
    seconds: float
    note: str = ""

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass(slots=True)
class Row:
    """One scenario measured on every system; ``key`` is stable for tools and tests."""

    key: str
    scenario: str
    measurements: list[Measurement] = field(default_factory=list)

    def of(self, system: str) -> Measurement | None:
        for m in self.measurements:
            if m.system == system:
                return m
        return None

    @property
    def halfmoon(self) -> Measurement | None:
        return self.of(HALFMOON)

    def ratio(self, peer: Measurement) -> float | None:
        """halfmoon's msgs/s over the peer's (>1 means halfmoon is faster)."""
        mine = self.halfmoon
        if mine is None or peer.msgs_per_s <= 0:
            return None
        return mine.msgs_per_s / peer.msgs_per_s


@dataclass(slots=True)
class Target:
    """A goal from the store's issue, checked against this run."""

    name: str
    measured: float
    goal: float
    unit: str

    @property
    def passed(self) -> bool:
        return self.measured >= self.goal


@dataclass(slots=True)
class Report:
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def row(self, key: str) -> Row | None:
        for r in self.rows:
            if r.key == key:
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            ms = []
            for m in r.measurements:
                d = asdict(m)
                d["msgs_per_s"] = m.msgs_per_s
                d["mb_per_s"] = m.mb_per_s
                ratio = None if m.system == HALFMOON else r.ratio(m)
                d["halfmoon_ratio"] = ratio
                ms.append(d)
            rows.append({"key": r.key, "scenario": r.scenario, "measurements": ms})
        targets = [{**asdict(t), "passed": t.passed} for t in self.targets]
        return {
            "machine": self.machine,
            "settings": self.settings,
            "rows": rows,
            "targets": targets,
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def _fmt_int(value: float) -> str:
    return f"{value:,.0f}"


def _fmt_ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def format_rows(rows: Iterable[Row]) -> str:
    """The results table, one line per (scenario, system)."""
    header = f"{'scenario':<34} {'system':<34} {'msgs/s':>11} {'MB/s':>9} {'hm/peer':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        first = True
        for m in r.measurements:
            ratio = "" if m.system == HALFMOON else _fmt_ratio(r.ratio(m))
            label = r.scenario if first else ""
            lines.append(
                f"{label:<34} {m.system:<34} {_fmt_int(m.msgs_per_s):>11} "
                f"{m.mb_per_s:>9.1f} {ratio:>8}"
            )
            first = False
    return "\n".join(lines)


def format_targets(targets: Iterable[Target]) -> str:
    header = f"{'target':<46} {'measured':>14} {'goal':>14}  result"
    lines = [header, "-" * len(header)]
    for t in targets:
        if t.unit == "%":
            measured, goal = f"{t.measured:.1f} %", f">= {t.goal:.0f} %"
        else:
            measured, goal = f"{_fmt_int(t.measured)} {t.unit}", f">= {_fmt_int(t.goal)}"
        lines.append(f"{t.name:<46} {measured:>14} {goal:>14}  {'PASS' if t.passed else 'MISS'}")
    return "\n".join(lines)


def format_machine(machine: dict[str, Any]) -> str:
    return "\n".join(f"  {k}: {v}" for k, v in machine.items())


def print_report(report: Report, out: TextIO) -> None:
    out.write("machine:\n" + format_machine(report.machine) + "\n")
    out.write("settings:\n" + format_machine(report.settings) + "\n\n")
    out.write(format_rows(report.rows) + "\n\n")
    out.write(format_targets(report.targets) + "\n")
    out.flush()
