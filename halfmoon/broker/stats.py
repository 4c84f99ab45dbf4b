"""Counters and one-minute rates for the broker's status page.

:class:`RateCounter` keeps per-second buckets for the last minute in a ring;
the rate is the sum of the buckets that are still within the last 60 seconds
divided by 60, so a burst fades out over a minute rather than at once. Time
comes from the broker's clock, so tests compute rates with a fake clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_SECONDS = 60


class RateCounter:
    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._buckets = [0] * WINDOW_SECONDS
        self._bucket_second = [-1] * WINDOW_SECONDS
        self.total = 0

    def add(self, count: int = 1) -> None:
        second = self._now_ms() // 1000
        slot = second % WINDOW_SECONDS
        with self._lock:
            if self._bucket_second[slot] != second:
                self._bucket_second[slot] = second
                self._buckets[slot] = 0
            self._buckets[slot] += count
            self.total += count

    def per_second(self) -> float:
        """The average rate over the last minute (the current second included)."""
        now = self._now_ms() // 1000
        with self._lock:
            recent = sum(
                count
                for count, second in zip(self._buckets, self._bucket_second, strict=True)
                if now - WINDOW_SECONDS < second <= now
            )
        return recent / WINDOW_SECONDS


@dataclass
class BrokerStatus:
    name: str
    uptime_ms: int
    topics: int
    groups: int
    queues: int
    messages_in_total: int
    messages_out_total: int
    tps_in: float  # messages per second, 1-minute average
    tps_out: float
    disk_bytes: int
    commit_log_min_offset: int
    commit_log_max_offset: int
    commit_log_flushed_offset: int
    pending_delay_messages: int
    extra: dict[str, int] = field(default_factory=dict)
