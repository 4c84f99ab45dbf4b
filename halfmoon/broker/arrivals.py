"""Arrival wake-ups: the in-process broker's listeners, told which queue may have
something to deliver (a long poll parked on it, a proxy's watcher) whenever the
store appends to a consumer's queue or a transaction decision frees one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from halfmoon.broker.lite_names import parent_topic_of
from halfmoon.broker.topics import is_internal_topic
from halfmoon.store.api import AppendResult

log = logging.getLogger(__name__)


class ArrivalListeners:
    def __init__(self) -> None:
        self._listeners: list[Callable[[str, int], None]] = []

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self._listeners.append(callback)

    def appended(self, results: list[AppendResult]) -> None:
        """The store's batch listener."""
        # One wake-up per queue that grew, not per message: a batch of a hundred sends to a
        # topic of eight queues wakes each parked poll (and each proxy's watcher) once.
        grown = dict.fromkeys((r.topic, r.queue_id) for r in results)
        for topic, queue_id in grown:
            if is_internal_topic(topic):
                continue  # timer, half, op and parked records: no consumer waits on them
            # lite consumers wait on the parent
            self.wake(parent_topic_of(topic) or topic, queue_id)

    def wake(self, topic: str, queue_id: int) -> None:
        """Tell every listener that ``topic``'s queue may have something to deliver; a
        listener that fails is logged and the others are still told."""
        for callback in list(self._listeners):
            try:
                callback(topic, queue_id)
            except Exception:
                log.exception("arrival listener failed")
