"""Which queue a message goes to.

A message group always maps to the same queue (a stable hash of the group
modulo the writable queue count), so the group's order holds as long as the
queue count does not change. Other messages are spread round robin. The hash
is CRC-32 of the group's UTF-8 bytes: stable across processes and restarts,
unlike Python's ``hash``.
"""

from __future__ import annotations

import itertools
import threading
import zlib


def queue_for_group(message_group: str, queue_count: int) -> int:
    if queue_count <= 0:
        raise ValueError("queue_count must be positive")
    return zlib.crc32(message_group.encode("utf-8")) % queue_count


class QueueSelector:
    """Round robin over a topic's writable queues, one counter per topic."""

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def select(self, topic: str, queue_count: int, message_group: str | None = None) -> int:
        if message_group:
            return queue_for_group(message_group, queue_count)
        with self._lock:
            counter = self._counters.get(topic)
            if counter is None:
                counter = self._counters[topic] = itertools.count()
            return next(counter) % queue_count

    def forget(self, topic: str) -> None:
        with self._lock:
            self._counters.pop(topic, None)
