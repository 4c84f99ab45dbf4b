"""Pending transactions by the time they next want a check, so a check scan costs what is due.

The check service used to list every pending transaction at each scan and
look at each one; with 100,000 orphans waiting for a producer that answers
2,000 at a time, every refill scan walked all 100,000 to send a few hundred.
:class:`DueIndex` keeps the transactions that may need a check (PREPARED,
not a transaction group member) in min-heaps keyed by the time they become
due: the later of their first check time (stored + timeout or immunity) and
their last counted check + ``check_retry_ms``.

- **Lanes.** One heap per *lane*, a (producer group, topic) pair: the unit a
  check sender refuses as a whole when every live stream of it is full. A
  scan takes the due lanes and works through each until it is empty or
  refused, so the transactions behind a full producer are not even looked
  at. A second heap orders the lanes by their earliest entry, so finding
  what is due costs nothing when nothing is.
- **Lazy invalidation.** Committing, rolling back, parking or re-indexing
  a transaction only clears (or replaces) the token it holds
  (``PendingTxn.check_token``); its old heap item stays until it surfaces
  and is dropped then. A lane whose heap holds more than twice as many
  dead items as live ones (plus a small slack) is rebuilt, so memory stays
  proportional to the live entries: each item is pushed once and popped or
  compacted away once, O(log n) each.
- **Taking an entry.** :meth:`pop_due` removes the entry from the index; the
  caller puts it back (:meth:`add`) with its next due time once a check was
  counted, or at the same time when the check could not be sent (only after
  the scan is done with its lane, or it would be popped again at once).

Not thread-safe: the transaction service calls it under its lock.
:attr:`work` counts heap items pushed, popped and compacted: what a test
asserts on to show a scan's cost follows what is due, not what is pending.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from halfmoon.broker.transactions.records import PendingTxn

Lane = tuple[str | None, str]  # (producer group, topic)
# A lane's heap item: (due ms, half offset, token, entry); the token tells a live item from a
# stale one (the entry was decided or re-indexed since).
_Item = tuple[int, int, int, PendingTxn]
# Dead heap items a lane tolerates beyond twice its live ones before it is rebuilt.
COMPACT_SLACK = 64


def lane_of(entry: PendingTxn) -> Lane:
    return (entry.producer_group, entry.topic)


class _LaneHeap:
    __slots__ = ("heap", "key", "live", "number", "scheduled")

    def __init__(self, key: Lane, number: int) -> None:
        self.key = key
        self.number = number  # orders lanes due at the same ms (lane keys do not compare)
        self.heap: list[_Item] = []
        self.live = 0  # items whose token is current
        self.scheduled: int | None = None  # its earliest key in the schedule, if there


class DueIndex:
    def __init__(self) -> None:
        self._lanes: dict[Lane, _LaneHeap] = {}
        self._schedule: list[tuple[int, int, _LaneHeap]] = []  # (due ms, lane number, lane)
        self._tokens = itertools.count(1)
        self._numbers = itertools.count()
        self._live = 0
        self.work = 0

    def __len__(self) -> int:
        return self._live

    def __contains__(self, entry: PendingTxn) -> bool:
        return entry.check_token is not None

    def add(self, entry: PendingTxn, due_ms: int) -> None:
        """Index ``entry`` to be checked at ``due_ms`` (replacing its place, if it had one)."""
        self.discard(entry)
        key = lane_of(entry)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _LaneHeap(key, next(self._numbers))
        token = next(self._tokens)
        entry.check_token = token
        heapq.heappush(lane.heap, (due_ms, entry.half_offset, token, entry))
        lane.live += 1
        self._live += 1
        self.work += 1
        if lane.scheduled is None or due_ms < lane.scheduled:
            lane.scheduled = due_ms
            heapq.heappush(self._schedule, (due_ms, lane.number, lane))

    def discard(self, entry: PendingTxn) -> None:
        """Take ``entry`` out (decided, parked, removed): O(1), its heap item dies lazily."""
        if entry.check_token is None:
            return
        entry.check_token = None
        lane = self._lanes.get(lane_of(entry))
        if lane is None:  # not possible while tokens and lanes agree; nothing to count
            return
        lane.live -= 1
        self._live -= 1
        if len(lane.heap) > 2 * lane.live + COMPACT_SLACK:
            self._compact(lane)

    def due_lanes(self, now_ms: int) -> list[Lane]:
        """The lanes with an entry due at ``now_ms``, earliest first; off the schedule until
        :meth:`reschedule`."""
        due: list[Lane] = []
        schedule = self._schedule
        while schedule and schedule[0][0] <= now_ms:
            at, _, lane = heapq.heappop(schedule)
            self.work += 1
            if lane.scheduled != at or self._lanes.get(lane.key) is not lane:
                continue  # superseded by an earlier key, or the lane was dropped
            lane.scheduled = None
            due.append(lane.key)
        return due

    def pop_due(self, key: Lane, now_ms: int) -> PendingTxn | None:
        """Take the earliest entry of lane ``key`` due at ``now_ms`` out of the index; None when
        the lane has none."""
        lane = self._lanes.get(key)
        if lane is None:
            return None
        heap = lane.heap
        while heap and heap[0][0] <= now_ms:
            _, _, token, entry = heapq.heappop(heap)
            self.work += 1
            if entry.check_token != token:
                continue  # stale: decided or re-indexed since
            entry.check_token = None
            lane.live -= 1
            self._live -= 1
            return entry
        return None

    def has_due(self, key: Lane, now_ms: int) -> bool:
        """True when lane ``key`` has an entry due at ``now_ms`` (dead items on top are dropped)."""
        lane = self._lanes.get(key)
        if lane is None:
            return False
        heap = lane.heap
        while heap and heap[0][3].check_token != heap[0][2]:
            heapq.heappop(heap)
            self.work += 1
        return bool(heap) and heap[0][0] <= now_ms

    def reschedule(self, key: Lane) -> None:
        """Put lane ``key`` back on the schedule at its earliest live entry (a scan is done with
        it); forget it when it has none."""
        lane = self._lanes.get(key)
        if lane is None:
            return
        heap = lane.heap
        while heap and heap[0][3].check_token != heap[0][2]:
            heapq.heappop(heap)
            self.work += 1
        if not heap:
            del self._lanes[key]
            return
        at = heap[0][0]
        if lane.scheduled is None or at < lane.scheduled:
            lane.scheduled = at
            heapq.heappush(self._schedule, (at, lane.number, lane))
            self.work += 1

    def next_due_ms(self) -> int | None:
        """The earliest time anything may be due (a lower bound: stale items count)."""
        return self._schedule[0][0] if self._schedule else None

    def entries(self) -> Iterator[tuple[int, PendingTxn]]:
        """Every live entry with its due time, in no particular order (for tests and checks)."""
        for lane in self._lanes.values():
            for at, _, token, entry in lane.heap:
                if entry.check_token == token:
                    yield at, entry

    def _compact(self, lane: _LaneHeap) -> None:
        self.work += len(lane.heap)
        lane.heap = [item for item in lane.heap if item[3].check_token == item[2]]
        heapq.heapify(lane.heap)
        if not lane.heap and lane.scheduled is None:
            del self._lanes[lane.key]
