"""Messages in per topic and out per (group, topic), by minute, over the last 24 hours.

Beside them, per (group, topic), the messages *acked* and *redelivered* (handed out
again after a nack or a timeout) by minute, in rings of the same size: the
dashboard's rate charts (:meth:`TrafficStatistics.history`, over 1 to 24 hours).

What ``halfmoon stats`` prints (RocketMQ's ``statsAll``: InTPS, OutTPS,
InMsg24Hour, OutMsg24Hour). One :class:`MinuteRing` per series: 1440 minute
buckets, each stamped with its minute, reused when that minute of the day
comes round again, so a series costs a fixed ~23 KiB whatever the traffic.
"In" series are keyed ``(topic, None)``, "out" series ``(topic, group)``.
A series with no traffic for a whole window is dropped when a report is
built, so deleted topics and groups do not pile up.

The rate per second is the last 60 seconds' count over 60: the current
minute's bucket plus the share of the previous minute still inside those 60
seconds (buckets are whole minutes, so that share is prorated). Time comes
from the broker's clock: a fake clock drives the tests.
"""

from __future__ import annotations

import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MINUTE_MS = 60_000
WINDOW_MINUTES = 24 * 60

SeriesKey = tuple[str, str | None]  # (topic, consumer group or None for messages in)
# What a chart can show: messages in (stored into the topic), out (delivered), acked, and
# redelivered (delivered again: the part of "out" that is a retry).
KINDS = ("in", "out", "acked", "redelivered")
CONSUMPTION_KINDS = ("acked", "redelivered")  # kept per (topic, group) beside "out"
MAX_POINTS = 120  # a history is summed into at most this many steps


class MinuteRing:
    """Counts per minute for the last ``size`` minutes (not thread-safe: the owner locks).

    The whole window's total is kept as a running sum (``_sum``): a write adds to it, and a
    bucket leaves it when its minute falls out of the window, found by walking only the
    minutes that passed since the last total (the dashboard asks for every series' total
    every few seconds; summing 1,440 buckets per series each time cost ~80 µs a series).
    """

    __slots__ = ("counts", "minutes", "last_minute", "_sum", "_expired")

    def __init__(self, size: int = WINDOW_MINUTES) -> None:
        self.counts = array("q", [0]) * size
        self.minutes = array("q", [-1]) * size
        self.last_minute = -1
        self._sum = 0  # the counts of every bucket stamped after _expired
        self._expired = -(2**62)  # buckets stamped at or before this minute are out of _sum

    def add(self, minute: int, count: int) -> None:
        slot = minute % len(self.counts)
        stamped = self.minutes[slot]
        if stamped != minute:
            if stamped > self._expired:
                self._sum -= self.counts[slot]
            self.minutes[slot] = minute
            self.counts[slot] = 0
        self.counts[slot] += count
        if minute > self._expired:
            self._sum += count
        self.last_minute = max(self.last_minute, minute)

    def at(self, minute: int) -> int:
        slot = minute % len(self.counts)
        return self.counts[slot] if self.minutes[slot] == minute else 0

    def total(self, now_minute: int, minutes: int | None = None) -> int:
        """The count over the ``minutes`` (default: all) minutes ending with ``now_minute``."""
        size = len(self.counts)
        span = size if minutes is None else min(minutes, size)
        if span < size:
            return sum(self.at(m) for m in range(now_minute - span + 1, now_minute + 1))
        oldest = now_minute - span
        if oldest < self._expired or self.last_minute > now_minute:
            return self._scan(oldest, now_minute)  # the clock went back: no running sum
        if oldest > self._expired:
            self._expire(oldest)
        return self._sum

    def _expire(self, oldest: int) -> None:
        """Take every bucket stamped in (``_expired``, ``oldest``] out of the running sum."""
        size = len(self.counts)
        if oldest - self._expired >= size:
            for slot, stamped in enumerate(self.minutes):
                if self._expired < stamped <= oldest:
                    self._sum -= self.counts[slot]
        else:
            for minute in range(self._expired + 1, oldest + 1):
                slot = minute % size
                if self.minutes[slot] == minute:
                    self._sum -= self.counts[slot]
        self._expired = oldest

    def _scan(self, oldest: int, now_minute: int) -> int:
        return sum(
            c for c, m in zip(self.counts, self.minutes, strict=True) if oldest < m <= now_minute
        )


@dataclass(frozen=True)
class TrafficRow:
    topic: str
    group: str | None  # None: messages stored into the topic; else delivered to this group
    per_second: float  # over the last 60 seconds
    last_minute: int  # messages in the last 60 seconds
    total_24h: int
    total_1h: int
    # The last 60 minutes' counts, oldest first (the current minute last): the
    # dashboard's charts. Defaulted so rows from an older broker still decode.
    last_hour: list[int] = field(default_factory=list)


class TrafficStatistics:
    def __init__(self, now_ms: Callable[[], int], window_minutes: int = WINDOW_MINUTES) -> None:
        if window_minutes < 2:
            raise ValueError("the statistics window must be at least 2 minutes")
        self._now_ms = now_ms
        self._window = window_minutes
        self._lock = threading.Lock()
        self._series: dict[SeriesKey, MinuteRing] = {}
        # (kind, topic, group) for the CONSUMPTION_KINDS.
        self._consumption: dict[tuple[str, str, str], MinuteRing] = {}

    # -- recording (hot path: one lock, a few array writes) ----------------------------

    def record_in(self, topics: Iterable[str]) -> None:
        """One message stored into each listed topic (a topic listed twice counts twice)."""
        minute = self._now_ms() // MINUTE_MS
        counts = Counter(topics)  # a send's messages mostly share one topic: one add each
        with self._lock:
            for topic, count in counts.items():
                self._ring((topic, None)).add(minute, count)

    def record_out(self, group: str, topic: str, count: int) -> None:
        """``count`` messages delivered to ``group`` from ``topic``."""
        if count <= 0:
            return
        minute = self._now_ms() // MINUTE_MS
        with self._lock:
            self._ring((topic, group)).add(minute, count)

    def record(self, kind: str, group: str, topic: str, count: int) -> None:
        """``count`` messages of ``group`` from ``topic`` acked or redelivered (``kind``)."""
        if count <= 0:
            return
        minute = self._now_ms() // MINUTE_MS
        key = (kind, topic, group)
        with self._lock:
            ring = self._consumption.get(key)
            if ring is None:
                ring = self._consumption[key] = MinuteRing(self._window)
            ring.add(minute, count)

    def _ring(self, key: SeriesKey) -> MinuteRing:
        ring = self._series.get(key)
        if ring is None:
            ring = self._series[key] = MinuteRing(self._window)
        return ring

    # -- reports ------------------------------------------------------------------

    def rows(self, *, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        """Every live series (in first, then out), filtered by topic and/or group, sorted by name.

        With ``group`` given, only that group's "out" rows are returned.
        """
        now = self._now_ms()
        minute, into = divmod(now, MINUTE_MS)
        previous_share = 1.0 - into / MINUTE_MS
        rows = []
        with self._lock:
            self._drop_idle(minute)
            for (series_topic, series_group), ring in self._series.items():
                if topic is not None and series_topic != topic:
                    continue
                if group is not None and series_group != group:
                    continue
                recent = ring.at(minute) + ring.at(minute - 1) * previous_share
                rows.append(
                    TrafficRow(
                        topic=series_topic,
                        group=series_group,
                        per_second=round(recent / 60, 3),
                        last_minute=round(recent),
                        total_24h=ring.total(minute),
                        total_1h=ring.total(minute, 60),
                        last_hour=[ring.at(m) for m in range(minute - 59, minute + 1)],
                    )
                )
        rows.sort(key=lambda r: (r.group is not None, r.topic, r.group or ""))
        return rows

    def per_minute(self, topic: str, group: str | None = None, minutes: int = 60) -> list[int]:
        """The series' counts for the last ``minutes`` minutes, oldest first (zeros when
        unknown)."""
        minute = self._now_ms() // MINUTE_MS
        span = min(minutes, self._window)
        with self._lock:
            ring = self._series.get((topic, group))
            if ring is None:
                return [0] * span
            return [ring.at(m) for m in range(minute - span + 1, minute + 1)]

    def _drop_idle(self, minute: int) -> None:
        """Forget series with no traffic for a whole window (deleted topics and groups). Locked."""
        for table in (self._series, self._consumption):
            for key in [k for k, r in table.items() if minute - r.last_minute >= self._window]:
                del table[key]  # type: ignore[arg-type]

    def history(self, topic: str | None, group: str | None, minutes: int = 60) -> dict[str, Any]:
        """Per kind, the counts of the last ``minutes`` minutes in steps of whole minutes (at
        most MAX_POINTS steps, oldest first, the current minute in the last one), summed over
        the series that match: a topic's "in" and every group's consumption of it, or a
        group's consumption of every topic (its "in" is then the topics it consumed).
        """
        span = max(1, min(minutes, self._window))
        step = -(-span // MAX_POINTS)
        points = -(-span // step)
        now_minute = self._now_ms() // MINUTE_MS
        first = now_minute - points * step + 1
        # Under the lock only copy the matching rings (a few µs each): the sums, ~1 ms per
        # ring over a day, are made outside it, so sends and receives never wait for them.
        picked: list[tuple[str, array[int], array[int]]] = []

        def add(kind: str, ring: MinuteRing) -> None:
            picked.append((kind, array("q", ring.counts), array("q", ring.minutes)))

        with self._lock:
            self._drop_idle(now_minute)
            consumed = set()
            for (series_topic, series_group), ring in self._series.items():
                if topic is not None and series_topic != topic:
                    continue
                if series_group is None:
                    continue
                if group is not None and series_group != group:
                    continue
                consumed.add(series_topic)
                add("out", ring)
            for (kind, series_topic, series_group), ring in self._consumption.items():
                if topic is not None and series_topic != topic:
                    continue
                if group is not None and series_group != group:
                    continue
                add(kind, ring)
            for (series_topic, series_group), ring in self._series.items():
                if series_group is not None:
                    continue
                if (topic is not None and series_topic == topic) or (
                    topic is None and group is not None and series_topic in consumed
                ):
                    add("in", ring)
        sums = {kind: [0] * points for kind in KINDS}
        for kind, counts, stamped in picked:
            size, row = len(counts), sums[kind]
            for i in range(points):
                for minute in range(first + i * step, first + (i + 1) * step):
                    slot = minute % size
                    if stamped[slot] == minute:
                        row[i] += counts[slot]
        return {
            "minutes": points * step,
            "step_ms": step * MINUTE_MS,
            "start_ms": first * MINUTE_MS,
            "series": sums,
        }
