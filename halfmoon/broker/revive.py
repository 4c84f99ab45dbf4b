"""The revive scan: dead-letter a last delivery whose invisible time ran out, without a consumer.

A delivery that is not a message's last is redelivered in place by the next
receive of its group (pop.py), so nothing needs doing while no consumer
asks. A *final* delivery (its attempt reached the group's
``max_delivery_attempts``) is different: when its invisible time ends, the
message belongs in ``%DLQ%<group>`` whether or not any consumer of the group
is still running, or poison messages would sit invisible forever and
dead-letter alerts would never fire. RocketMQ's broker moves expired pop
checkpoints on in its background PopReviveService (every
``reviveInterval`` = 1 s); this is halfmoon's equivalent for the last step.

Algorithm (``Broker.tick`` calls :meth:`PopService.revive` every
``server.tick_interval``, 100 ms by default, from the tick thread):

* Whenever a delivery becomes final, pop.py *watches* it: it pushes
  ``(visible_at, group, topic, queue_id, offset, epoch)`` on one heap. That
  happens on a redelivery whose attempt reaches the maximum, a first
  delivery in a group whose maximum is 1, a change of invisible duration of
  a final delivery, a dead-lettering that failed (retried
  ``DEAD_LETTER_RETRY_MS`` later), and for every in-flight delivery
  restored from the consumption snapshot (restored deliveries are visible
  at once, so these are checked on the first tick).
* Each tick pops the watches that are due (``visible_at <= now``), oldest
  first: at most ``SCAN_LIMIT`` (1024) watches, at most
  ``DEAD_LETTER_LIMIT`` (32) dead-letterings and at most ``TICK_BUDGET_MS``
  (50 ms) of real time per tick, so one tick's cost is bounded (a
  dead-lettering is a durable append: an fsync under sync flush) and the
  delay timer and transaction checks sharing the tick are not starved;
  what is left waits for the next tick. Each due watch is checked under its (group, topic)
  lock, the same lock receive and ack take: if the delivery is no longer in
  flight with the same epoch (acked, its invisible time changed,
  redelivered, dead-lettered by a receive, reset) or is no longer final
  (the group's maximum was raised), the watch is dropped; otherwise the
  message is dead-lettered with the lock held, as on the receive path.
  In a FIFO group, an ordered delivery waits while a lower ordered offset
  of its queue is still in flight, so the dead-letter topic keeps the
  queue's order.
* A message is therefore dead-lettered within one tick of its invisible
  time ending (unless more than ``DEAD_LETTER_LIMIT`` fall due in one
  tick); an idle broker costs one heap peek per tick, whatever the number
  of groups, states and in-flight deliveries.
* Watches of deliveries that ended early (acked) stay on the heap until
  their time comes, or until the heap outgrows ``COMPACT_MIN`` (4096) and
  twice its size after the last compaction; a compaction then keeps only
  the watches whose delivery is still in flight with the same epoch.
  Memory is O(final deliveries in flight), not O(all deliveries).

Locking: the heap has its own lock, always taken last: ``watch`` is called
with a state lock held, and the scan never holds the heap lock while it
takes a state lock.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Due watches examined per tick, and dead-letterings (durable appends) per tick.
SCAN_LIMIT = 1024
DEAD_LETTER_LIMIT = 32
# Real time one tick may spend dead-lettering before leaving the rest to the next.
TICK_BUDGET_MS = 50
# Compact the heap when it holds more watches than this (and twice as many as after the
# last compaction): bounds the stale watches acked deliveries leave behind.
COMPACT_MIN = 4096

# (visible_at, group, topic, queue_id, offset, epoch)
Watch = tuple[int, str, str, int, int, int]
# Dead-letter one due watch if it still names a final delivery; True if it did or tried to.
ReviveOne = Callable[[Watch, int], bool]
# Whether a watch may still be due (its delivery is in flight with that epoch); lock-free.
IsLive = Callable[[Watch], bool]


class ReviveQueue:
    """Final deliveries by the time they become visible; see the module doc."""

    def __init__(
        self,
        is_live: IsLive,
        *,
        scan_limit: int = SCAN_LIMIT,
        dead_letter_limit: int = DEAD_LETTER_LIMIT,
        budget_ms: int = TICK_BUDGET_MS,
        compact_min: int = COMPACT_MIN,
        retry_ms: int = 1_000,
    ) -> None:
        self._is_live = is_live
        self._scan_limit = scan_limit
        self._dead_letter_limit = dead_letter_limit
        self._budget_s = budget_ms / 1000
        self._compact_min = compact_min
        self._compact_at = compact_min
        self._retry_ms = retry_ms
        self._heap: list[Watch] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._heap)

    def watch(
        self, visible_at: int, group: str, topic: str, queue_id: int, offset: int, epoch: int
    ) -> None:
        """Check this delivery at ``visible_at``: dead-letter it if it is still in flight then."""
        with self._lock:
            heapq.heappush(self._heap, (visible_at, group, topic, queue_id, offset, epoch))
            if len(self._heap) > self._compact_at:
                self._compact()

    def next_due(self) -> int | None:
        """When the earliest watch falls due (it may be stale); None when there is none."""
        with self._lock:
            return self._heap[0][0] if self._heap else None

    def run(self, now: int, revive_one: ReviveOne) -> int:
        """Handle due watches within this tick's limits; the number dead-lettered (or tried)."""
        done = 0
        started = time.monotonic()
        for _ in range(self._scan_limit):
            with self._lock:
                if not self._heap or self._heap[0][0] > now:
                    break
                item = heapq.heappop(self._heap)
            try:
                if revive_one(item, now):
                    done += 1
            except Exception:  # noqa: BLE001 - a bad read must not stop the tick
                log.exception(
                    "group %s: revive of %s/%d offset %d failed; retrying in %d ms",
                    item[1],
                    item[2],
                    item[3],
                    item[4],
                    self._retry_ms,
                )
                self.watch(now + self._retry_ms, *item[1:])
                break
            if done >= self._dead_letter_limit or time.monotonic() - started > self._budget_s:
                break
        return done

    def _compact(self) -> None:
        # Called with the heap lock held; is_live reads pop state without its lock, which
        # is safe: a delivery's epoch never comes back, so a watch found stale stays stale.
        self._heap = [item for item in self._heap if self._is_live(item)]
        heapq.heapify(self._heap)
        self._compact_at = max(self._compact_min, 2 * len(self._heap))
