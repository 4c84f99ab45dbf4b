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
from collections.abc import Callable, Mapping

from halfmoon.broker.consumption import InFlight, TopicConsumption
from halfmoon.store.message import StoredMessage

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


class ReviveQueue:
    """Final deliveries by the time they become visible; see the module doc.

    It works on pop.py's state through what it is given: the states by (group,
    topic), the group's max attempts, a store read, the dead-letter call
    (False when it failed) and the epoch counter.
    """

    def __init__(
        self,
        states: Mapping[tuple[str, str], TopicConsumption],
        max_attempts: Callable[[str], int],
        read: Callable[[str, int, int], StoredMessage | None],
        dead_letter: Callable[[str, StoredMessage, int], bool],
        next_epoch: Callable[[], int],
        *,
        retry_ms: int,
    ) -> None:
        self._states = states
        self._max_attempts = max_attempts
        self._read = read
        self._dead_letter = dead_letter
        self._next_epoch = next_epoch
        self._retry_ms = retry_ms
        self.scan_limit = SCAN_LIMIT
        self.dead_letter_limit = DEAD_LETTER_LIMIT
        self.budget_ms = TICK_BUDGET_MS
        self.compact_min = COMPACT_MIN
        self._compacted_to = 0  # watches left by the last compaction
        self._heap: list[Watch] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._heap)

    # -- watching (pop.py, with the state's lock held) ---------------------------

    def watch(
        self, visible_at: int, group: str, topic: str, queue_id: int, offset: int, epoch: int
    ) -> None:
        """Check this delivery at ``visible_at``: dead-letter it if it is still in flight then."""
        with self._lock:
            heapq.heappush(self._heap, (visible_at, group, topic, queue_id, offset, epoch))
            if len(self._heap) > max(self.compact_min, 2 * self._compacted_to):
                self._compact()

    def watch_entry(
        self, state: TopicConsumption, queue_id: int, offset: int, entry: InFlight
    ) -> None:
        self.watch(entry.visible_at, state.group, state.topic, queue_id, offset, entry.epoch)

    def watch_restored(self, state: TopicConsumption) -> None:
        """Every in-flight delivery of a restored state (visible at once): the first tick sorts
        them."""
        for queue_id, queue in state.queues.items():
            for offset, entry in queue.inflight.items():
                self.watch_entry(state, queue_id, offset, entry)

    # -- the scan (tick thread) ----------------------------------------------------

    def run(self, now: int) -> int:
        """Handle due watches within this tick's limits; the number dead-lettered (or tried)."""
        done = 0
        started = time.monotonic()
        for _ in range(self.scan_limit):
            with self._lock:
                if not self._heap or self._heap[0][0] > now:
                    break
                item = heapq.heappop(self._heap)
            try:
                if self._revive_one(item, now):
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
            if (
                done >= self.dead_letter_limit
                or (time.monotonic() - started) * 1000 > self.budget_ms
            ):
                break
        return done

    def _is_live(self, watch: Watch) -> bool:
        # Reads pop state without its lock, which is safe: a delivery's epoch never comes
        # back, so a watch found stale stays stale.
        _, group, topic, queue_id, offset, epoch = watch
        state = self._states.get((group, topic))
        queue = state.queues.get(queue_id) if state is not None else None
        entry = queue.inflight.get(offset) if queue is not None else None
        return entry is not None and entry.epoch == epoch

    def _revive_one(self, watch: Watch, now: int) -> bool:
        _, group, topic, queue_id, offset, epoch = watch
        state = self._states.get((group, topic))
        if state is None or not self._is_live(watch):
            return False
        max_attempts = self._max_attempts(group)
        with state.lock:
            queue = state.queues.get(queue_id)
            entry = queue.inflight.get(offset) if queue is not None else None
            if (
                queue is None
                or entry is None
                or entry.epoch != epoch
                or entry.visible_at > now
                or entry.attempt < max_attempts
            ):
                return False  # acked, changed, redelivered, or no longer the last attempt
            if entry.ordered and any(o < offset for o in queue.ordered):
                # FIFO: the lower offsets of this queue go first.
                self.watch(now + self._retry_ms, *watch[1:])
                return False
            stored = self._read(topic, queue_id, offset)
            state.dirty = True
            if stored is None:
                queue.complete(offset)  # gone from the store: nothing to dead-letter
            elif self._dead_letter(group, stored, entry.attempt):
                queue.complete(offset)
            else:
                queue.hide(offset, now + self._retry_ms, self._next_epoch())
                self.watch_entry(state, queue_id, offset, entry)
            return True

    def _compact(self) -> None:
        # Called with the heap lock held.
        self._heap = [item for item in self._heap if self._is_live(item)]
        heapq.heapify(self._heap)
        self._compacted_to = len(self._heap)
