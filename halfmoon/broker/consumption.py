"""Where a consumer group stands in each queue it pops from.

Per (group, topic, queue) the state is::

    committed ──────────────── cursor ──────────► (never delivered)
        │  in flight or done    │

* ``cursor``: the next offset never delivered to the group.
* ``inflight``: offsets delivered and not yet acked, each with when it becomes
  visible again, its delivery attempt, the epoch of its current handle and its
  holder, if any (a front end's lease: the delivery is released when that ends,
  and stays hidden across a restart while it lasts).
* Everything in ``[committed, cursor)`` that is not in flight is *done*
  (acked, skipped by the filter, dead-lettered). So the "acked above
  committed" set is never stored: it is the complement of ``inflight``, and
  ``committed`` is simply the lowest in-flight offset (or ``cursor``).
  Memory is O(messages in flight), whatever the ack order.

Two helper structures keep every operation amortized O(log n):

* ``_order``: in-flight offsets in ascending order (new deliveries happen at
  the cursor, so appending keeps it sorted); acked offsets leave it lazily.
* ``_heap``: (visible_at, offset, epoch) for finding expired deliveries;
  entries whose epoch no longer matches are stale and skipped.

Both are rebuilt from ``inflight`` when stale entries outnumber live ones,
which bounds them to about twice the in-flight count.

The counts a queue's status asks for at every AMQP Basic.Get and every
publish to a length-limited queue never walk the in-flight table: the
deliveries visible again (:meth:`QueueConsumption.visible_count`) are found
in the heap's due part alone, and those past their first delivery
(``retrying``) are counted as attempts change.

This module holds no locks of its own: a :class:`TopicConsumption` carries
the lock its owner takes around every call.
"""

from __future__ import annotations

import heapq
import json
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halfmoon.errors import CorruptionError
from halfmoon.store.fsutil import replace_atomically

SNAPSHOT_VERSION = 1
# Rebuild the lazy structures once stale entries exceed live ones by this.
_COMPACT_SLACK = 64


# The visible_at of an in-flight message requeued (an invisible time changed to 0) or
# restored by a restart: before any real time. Requeued messages so go out before those
# whose invisible time ran out, lowest offset first among themselves (the heap's tie-break):
# back in their place in the queue, as an AMQP broker requeues, whatever order and moment
# they were requeued at.
REQUEUED_VISIBLE_AT = 0


@dataclass(slots=True)
class InFlight:
    visible_at: int
    attempt: int  # deliveries so far (1 after the first)
    epoch: int  # of the current receipt handle
    commit_log_offset: int
    ordered: bool  # FIFO group and the message has a message group
    holder: str = ""  # who holds the delivery (see PopStates.release); "" for nobody

    def journaled(self, offset: int) -> list[Any]:
        """The entry as the snapshot and the journal keep it; a held one with its holder and
        when it is visible again, which a restart keeps (an unheld one is visible at once), as
        does a deferred one (attempt 0: not delivered before its delivery time)."""
        form: list[Any] = [offset, self.attempt, self.epoch, self.commit_log_offset]
        form.append(int(self.ordered))
        if self.holder or not self.attempt:
            form += [self.holder, self.visible_at]
        return form


def entry_fields(entry: list[Any]) -> tuple[int, int, int, int, bool, str, int]:
    """An entry's :meth:`InFlight.journaled` form read back: offset, attempt, epoch, commit
    log offset, ordered, holder and visible_at (an unheld one: visible at once, requeued)."""
    offset, attempt, epoch, commit_log_offset, ordered = (int(v) for v in entry[:5])
    if len(entry) >= 7:
        return (
            offset,
            attempt,
            epoch,
            commit_log_offset,
            bool(ordered),
            str(entry[5]),
            int(entry[6]),
        )
    return offset, attempt, epoch, commit_log_offset, bool(ordered), "", REQUEUED_VISIBLE_AT


class QueueConsumption:
    """One group's position in one queue. Not thread-safe; see module doc."""

    __slots__ = (
        "committed", "cursor", "inflight", "ordered", "done_ahead", "retrying", "_order", "_heap",
    )  # fmt: skip

    def __init__(self, start: int) -> None:
        self.committed = start
        self.cursor = start
        self.inflight: dict[int, InFlight] = {}
        self.ordered: set[int] = set()  # in-flight offsets that hold FIFO order
        # Offsets at or past the cursor already consumed: a transaction's acks replayed after a
        # crash whose state file predates the delivery. Skipped when the cursor reaches them.
        self.done_ahead: set[int] = set()
        self.retrying = 0  # in-flight entries past their first delivery (attempt > 1)
        self._order: deque[int] = deque()
        self._heap: list[tuple[int, int, int]] = []

    # -- deliveries ----------------------------------------------------------

    def deliver(
        self,
        offset: int,
        commit_log_offset: int,
        visible_at: int,
        epoch: int,
        ordered: bool,
        holder: str = "",
    ) -> None:
        """Record the first delivery of ``offset`` (which must be >= every earlier one)."""
        replaced = self.inflight.get(offset)
        if replaced is not None and replaced.attempt > 1:
            self.retrying -= 1
        self.inflight[offset] = InFlight(visible_at, 1, epoch, commit_log_offset, ordered, holder)
        self._order.append(offset)
        heapq.heappush(self._heap, (visible_at, offset, epoch))
        if ordered:
            self.ordered.add(offset)

    def move_cursor(self, offset: int) -> None:
        """Everything below ``offset`` not in flight is done (delivered or skipped)."""
        if offset > self.cursor:
            self.cursor = offset
            if self.done_ahead:
                self.done_ahead = {o for o in self.done_ahead if o >= offset}
            self._advance_committed()

    def mark_done(self, offset: int) -> None:
        """``offset`` is consumed, wherever it stands (idempotent; see :attr:`done_ahead`)."""
        if offset in self.inflight:
            self.complete(offset)
        elif offset >= self.cursor:
            self.done_ahead.add(offset)

    def skip_done(self, offset: int) -> bool:
        """True (and forgotten) when a new delivery of ``offset`` must be skipped."""
        if offset in self.done_ahead:
            self.done_ahead.discard(offset)
            return True
        return False

    def defer(
        self, offset: int, commit_log_offset: int, due: int, epoch: int, ordered: bool
    ) -> None:
        """Record ``offset`` as in flight but never delivered (attempt 0) until ``due``: a
        message committed with a delivery time still ahead. Its first delivery, when due, is
        a redelivery's walk with attempt 1."""
        self.deliver(offset, commit_log_offset, due, epoch, ordered)
        self.set_attempt(self.inflight[offset], 0)

    def redeliver(self, offset: int, visible_at: int, epoch: int, holder: str = "") -> InFlight:
        entry = self.inflight[offset]
        self.set_attempt(entry, entry.attempt + 1)
        entry.holder = holder
        self.hide(offset, visible_at, epoch)
        return entry

    def restore(self, entry: list[Any]) -> None:
        """Apply an entry in its :meth:`InFlight.journaled` form (replayed from the journal):
        a delivery past the cursor is recorded (the cursor moves past it: what lay between
        was delivered or skipped before it), one in flight takes the entry's attempt, epoch
        and holder; one done (acked after its record was written) stays done."""
        offset, attempt, epoch, commit_log_offset, ordered, holder, visible_at = entry_fields(entry)
        if offset >= self.cursor:
            if not self.skip_done(offset):
                self.deliver(offset, commit_log_offset, visible_at, epoch, ordered, holder)
                self.set_attempt(self.inflight[offset], attempt)
            self.move_cursor(offset + 1)
        elif offset in self.inflight:
            current = self.inflight[offset]
            self.set_attempt(current, attempt)
            current.holder = holder
            self.hide(offset, visible_at, epoch)

    def release(self, holder: str, epochs: Iterator[int]) -> list[int]:
        """Every delivery ``holder`` holds requeued (visible at once, in its place), held by
        nobody, each under a new epoch (the holder's handles die); their offsets."""
        released = [offset for offset, e in self.inflight.items() if e.holder == holder]
        for offset in released:
            self.inflight[offset].holder = ""
            self.hide(offset, REQUEUED_VISIBLE_AT, next(epochs))
        return released

    def hide(self, offset: int, visible_at: int, epoch: int) -> None:
        """Give the in-flight ``offset`` a new visibility time and handle epoch."""
        entry = self.inflight[offset]
        entry.visible_at = visible_at
        entry.epoch = epoch
        heapq.heappush(self._heap, (visible_at, offset, epoch))
        self._maybe_compact()

    def complete(self, offset: int) -> None:
        """``offset`` is done (acked, dead-lettered or gone from the store)."""
        if self.inflight.pop(offset).attempt > 1:
            self.retrying -= 1
        self.ordered.discard(offset)
        if offset == self.committed:
            self._advance_committed()
        self._maybe_compact()

    def reset(self, offset: int) -> None:
        """Forget everything and start over at ``offset`` (in-flight handles die)."""
        self.committed = self.cursor = offset
        self.inflight.clear()
        self.ordered.clear()
        self.done_ahead.clear()
        self.retrying = 0
        self._order.clear()
        self._heap.clear()

    def set_attempt(self, entry: InFlight, attempt: int) -> None:
        """Set an in-flight entry's delivery attempt, ``retrying`` kept with it."""
        self.retrying += (attempt > 1) - (entry.attempt > 1)
        entry.attempt = attempt

    # -- queries -------------------------------------------------------------

    def visible_count(self, now: int) -> int:
        """In-flight entries visible again at ``now`` (requeued, timed out, due).

        A walk of the heap's entries due by ``now`` only: a heap's children are never
        earlier than their parent, so the walk stops at the first later entry on each
        branch. Deliveries hidden for their invisible time (most of what is in flight) are
        never visited: O(entries due), not O(in flight)."""
        heap, inflight = self._heap, self.inflight
        size = len(heap)
        counted: set[int] = set()
        stack = [0] if size else []
        while stack:
            index = stack.pop()
            visible_at, offset, epoch = heap[index]
            if visible_at > now:
                continue
            entry = inflight.get(offset)
            if entry is not None and entry.epoch == epoch and entry.visible_at == visible_at:
                counted.add(offset)  # a set: an entry pushed twice is counted once
            child = 2 * index + 1
            if child < size:
                stack.append(child)
                if child + 1 < size:
                    stack.append(child + 1)
        return len(counted)

    def take_expired(self, now: int, limit: int, by_offset: bool) -> list[tuple[int, InFlight]]:
        """Up to ``limit`` in-flight entries visible again at ``now``, removed from the timer.

        The caller must then :meth:`redeliver`, :meth:`hide` or :meth:`complete`
        each one. ``by_offset`` picks the lowest offsets first (FIFO) instead of
        the longest-expired.
        """
        heap = self._heap
        found: list[tuple[int, InFlight]] = []
        while heap and heap[0][0] <= now and (by_offset or len(found) < limit):
            _, offset, epoch = heapq.heappop(heap)
            entry = self.inflight.get(offset)
            if entry is not None and entry.epoch == epoch:
                found.append((offset, entry))
        if by_offset and len(found) > limit:
            found.sort(key=lambda item: item[0])
            for offset, entry in found[limit:]:
                heapq.heappush(heap, (entry.visible_at, offset, entry.epoch))
            del found[limit:]
        return found

    def requeue(self, offset: int) -> None:
        """Put an entry taken by :meth:`take_expired` back on the timer unchanged."""
        entry = self.inflight[offset]
        heapq.heappush(self._heap, (entry.visible_at, offset, entry.epoch))

    def fifo_blocked(self, now: int) -> bool:
        """Whether an ordered message of this queue is still being processed."""
        inflight = self.inflight
        return any(inflight[offset].visible_at > now for offset in self.ordered)

    def next_visible_at(self) -> int | None:
        heap = self._heap
        inflight = self.inflight
        while heap:
            visible_at, offset, epoch = heap[0]
            entry = inflight.get(offset)
            if entry is not None and entry.epoch == epoch:
                return visible_at
            heapq.heappop(heap)
        return None

    # -- internals -----------------------------------------------------------

    def _advance_committed(self) -> None:
        order = self._order
        inflight = self.inflight
        while order and order[0] not in inflight:
            order.popleft()
        self.committed = order[0] if order else self.cursor

    def _maybe_compact(self) -> None:
        live = len(self.inflight)
        limit = 2 * live + _COMPACT_SLACK
        if len(self._heap) > limit:
            self._heap = [(e.visible_at, o, e.epoch) for o, e in self.inflight.items()]
            heapq.heapify(self._heap)
        if len(self._order) > limit:
            self._order = deque(sorted(self.inflight))

    # -- persistence ---------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "committed": self.committed,
            "cursor": self.cursor,
            "inflight": [e.journaled(offset) for offset, e in sorted(self.inflight.items())],
        }
        if self.done_ahead:
            data["done_ahead"] = sorted(self.done_ahead)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueConsumption:
        """Restore; in-flight entries come back visible at once, attempts kept, but for
        held ones: hidden while they were, with their holder."""
        queue = cls(int(data["cursor"]))
        for entry in sorted(data["inflight"]):
            offset, attempt, epoch, commit_log_offset, ordered, holder, visible_at = entry_fields(
                entry
            )
            queue.deliver(offset, commit_log_offset, visible_at, epoch, ordered, holder)
            queue.set_attempt(queue.inflight[offset], attempt)
        queue.done_ahead = {int(o) for o in data.get("done_ahead", ())}
        queue._advance_committed()
        return queue


class TopicConsumption:
    """A group's state for one topic: its queues, and the lock guarding them."""

    __slots__ = ("group", "topic", "lock", "queues", "rotation", "dirty", "saved")

    def __init__(self, group: str, topic: str) -> None:
        self.group = group
        self.topic = topic
        self.lock = threading.Lock()
        self.queues: dict[int, QueueConsumption] = {}
        self.rotation = 0  # where the next receive starts, spreading consumers over queues
        self.dirty = True  # changed since the last snapshot
        self.saved: dict[str, Any] | None = None  # the last snapshot's JSON of this state

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "topic": self.topic,
            "queues": [
                {"queue_id": queue_id, **queue.to_json()}
                for queue_id, queue in sorted(self.queues.items())
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicConsumption:
        state = cls(str(data["group"]), str(data["topic"]))
        for queue in data["queues"]:
            state.queues[int(queue["queue_id"])] = QueueConsumption.from_json(queue)
        state.dirty = False
        return state


@dataclass(slots=True)
class Snapshot:
    receipt_key: bytes
    next_epoch: int
    topics: list[TopicConsumption]
    journal_offset: int = 0  # the %HM_POP% records it holds (pop_journal.py)
    journal_end: int = 0  # the journal's end once this snapshot's records were appended


def write_snapshot(
    path: Path,
    receipt_key: bytes,
    next_epoch: int,
    topics: list[dict[str, Any]],
    journal_offset: int = 0,
    journal_end: int = 0,
) -> None:
    """Atomically replace ``path``: write a temp file, fsync, rename, fsync the directory."""
    document = {
        "version": SNAPSHOT_VERSION,
        "receipt_key": receipt_key.hex(),
        "next_epoch": next_epoch,
        "topics": topics,
        "journal_offset": journal_offset,
        "journal_end": journal_end,
    }
    data = json.dumps(document, separators=(",", ":")).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, data)


def read_snapshot(path: Path) -> Snapshot | None:
    """The snapshot at ``path``, or None if there is none yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(raw)
        if not isinstance(document, dict) or document.get("version") != SNAPSHOT_VERSION:
            raise ValueError("not a version 1 consumption snapshot")
        return Snapshot(
            receipt_key=bytes.fromhex(document["receipt_key"]),
            next_epoch=int(document["next_epoch"]),
            topics=[TopicConsumption.from_json(t) for t in document["topics"]],
            journal_offset=int(document.get("journal_offset", 0)),
            journal_end=int(document.get("journal_end", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptionError(
            f"consumption state {path} is unreadable ({error}); move it aside to start "
            "over (groups then restart from their consume_from position and in-flight "
            "messages are redelivered)"
        ) from error
