"""Latency fault tolerance: avoid a broker that just failed or answered slowly, for a while.

RocketMQ's producer keeps, per broker, the time until which it should be
avoided. After each send the latency is looked up in a table: the largest
``latency_levels[i]`` not above it gives ``avoid_for[i]``. With the defaults,
an answer in 550 ms or more avoids the broker for 3 s, one in a second or
more for 60 s, and so on; a failed send counts as ``failure_latency``. When
every candidate is being avoided, the one free soonest is used: a slow broker
beats no broker.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyFaultPolicy:
    """The latency → avoidance table (seconds); ``enabled=False`` turns avoidance off."""

    latency_levels: tuple[float, ...] = (0.05, 0.1, 0.55, 1.0, 2.0, 3.0, 15.0)
    avoid_for: tuple[float, ...] = (0.0, 0.0, 3.0, 60.0, 120.0, 180.0, 600.0)
    failure_latency: float = 1.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if len(self.latency_levels) != len(self.avoid_for):
            raise ValueError("latency_levels and avoid_for must have the same length")
        if list(self.latency_levels) != sorted(self.latency_levels):
            raise ValueError("latency_levels must be ascending")

    def avoidance(self, latency: float) -> float:
        """Seconds to avoid a broker after a send that took ``latency`` seconds."""
        index = bisect.bisect_right(self.latency_levels, latency) - 1
        return self.avoid_for[index] if index >= 0 else 0.0


class LatencyFaultTolerance:
    """Per-broker "avoid until" times, fed by every send's outcome."""

    def __init__(
        self, policy: LatencyFaultPolicy | None = None, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy or LatencyFaultPolicy()
        self._now = now
        self._avoid_until: dict[str, float] = {}

    def record(self, broker: str, latency: float, *, failed: bool = False) -> None:
        """Feed one send's outcome (``latency`` seconds, or a failure)."""
        if not self.policy.enabled:
            return
        if failed:
            latency = max(latency, self.policy.failure_latency)
        avoid = self.policy.avoidance(latency)
        if avoid > 0:
            self._avoid_until[broker] = self._now() + avoid
        elif self._avoid_until:
            self._avoid_until.pop(broker, None)

    def available(self, broker: str) -> bool:
        """True unless ``broker`` is being avoided right now."""
        until = self._avoid_until.get(broker)
        return until is None or until <= self._now()

    def pick(self, candidates: list[str]) -> str:
        """The first available candidate, or the one whose avoidance ends soonest."""
        if not self._avoid_until:
            return candidates[0]
        for broker in candidates:
            if self.available(broker):
                return broker
        return min(candidates, key=lambda b: self._avoid_until.get(b, 0.0))
