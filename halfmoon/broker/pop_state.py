"""The state of pop consumption: per (group, topic), where the group stands in
each queue (:mod:`consumption`), where a new group starts, the queries and
administration over it, and its snapshot on disk.

:class:`PopStates` holds the table; :class:`halfmoon.broker.pop.PopService`
holds one and delivers from it (receive, ack and friends).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halfmoon.broker.clock import Clock
from halfmoon.broker.consumption import (
    QueueConsumption,
    TopicConsumption,
    read_snapshot,
    write_snapshot,
)
from halfmoon.broker.groups import DEFAULT_MAX_DELIVERY_ATTEMPTS
from halfmoon.broker.pop_journal import (
    FULL_EVERY_S,
    MAX_INFLIGHT_JOURNALED,
    PopJournal,
    QueueKey,
)
from halfmoon.broker.receipt import ReceiptCodec, new_receipt_key
from halfmoon.store.api import Store
from halfmoon.store.message import StoredMessage

log = logging.getLogger(__name__)


def default_hot_data_bytes() -> int:
    """40 % of physical memory: RocketMQ's ``accessMessageInMemoryMaxRatio`` default."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 40 // 100
    except (ValueError, OSError):  # not on this platform: assume 4 GiB of memory
        return 4 * 1024**3 * 40 // 100


@dataclass(frozen=True, slots=True)
class PopGroupSettings:
    """What pop needs to know about a consumer group."""

    fifo: bool = False
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS
    consume_from: str = "latest"  # where a new group starts: "earliest" | "latest" | "auto"
    # With fifo: order every message of a queue, not only those with a message group
    # (lite topics: one queue per lite topic, always delivered in order).
    every_message_ordered: bool = False


class PopStates:
    """Each (group, topic)'s consumption state, its administration and persistence."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        topic_queues: Callable[[str], list[int]],
        group_settings: Callable[[str], PopGroupSettings],
        state_path: Path | None,
        hot_data_bytes: int = 0,
        journal: PopJournal | None = None,
    ) -> None:
        """``journal``: positions also go to the commit log (:mod:`pop_journal`), as a
        broker group's master needs, and are replayed from it here."""
        self.store = store
        self.clock = clock
        self.topic_queues = topic_queues
        self.group_settings = group_settings
        self._state_path = state_path
        self._hot_data_bytes = hot_data_bytes or default_hot_data_bytes()
        self.table: dict[tuple[str, str], TopicConsumption] = {}
        self._states_lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._membership_changed = False  # a state was dropped since the last snapshot
        snapshot = read_snapshot(state_path) if state_path is not None else None
        if journal is not None and snapshot is not None and snapshot.journal_end > journal.end:
            # The snapshot holds records this log does not (a tail lost to a crash under an
            # async flush, or cut when a deposed master rejoined): the log is the truth.
            log.warning(
                "event=pop_snapshot_ahead_of_log journal_end=%d end=%d",
                snapshot.journal_end, journal.end,
            )  # fmt: skip
            snapshot.topics = []
            snapshot.journal_offset = 0
        self.codec = ReceiptCodec(snapshot.receipt_key if snapshot else new_receipt_key())
        # Epochs must never repeat, even across a crash that lost the last
        # snapshot: start above both the saved counter and 1024 per elapsed ms.
        first_epoch = max(snapshot.next_epoch if snapshot else 0, clock.now_ms() * 1024)
        self.epochs = itertools.count(first_epoch)
        if snapshot:
            for state in snapshot.topics:
                self.table[(state.group, state.topic)] = state
        self.journal = journal
        if journal is not None:
            journal.issuer = self.codec.issuer
        # Each queue's position as last journaled; a queue whose position differs is
        # journaled at the next snapshot.
        self._journaled: dict[QueueKey, dict[str, Any]] = {}
        self._journaled_all_s = 0.0
        self._journal_mark = 0
        if journal is not None:
            self._journal_mark = journal.replay(
                snapshot.journal_offset if snapshot else 0,
                self._replayed,
                self._replayed_drop,
                self._replayed_acks,
                self._replayed_entries,
            )
            self._journaled_all_s = time.monotonic()
        # Who holds deliveries in flight (maybe none left): whose end a watcher asks about.
        self.holders: set[str] = {
            entry.holder
            for state in self.table.values()
            for queue in state.queues.values()
            for entry in queue.inflight.values()
            if entry.holder
        }
        if snapshot is None and state_path is not None:
            # The receipt key on disk before the first handle goes out: a crash before the
            # first periodic snapshot must not void the handles a holder still has.
            self._membership_changed = True
            self.snapshot()

    def _replayed(self, key: QueueKey, document: dict[str, Any], issuer: str) -> None:
        """A journaled queue newer than the snapshot (on a new master: all of them)."""
        group, topic, queue_id = key
        if issuer != self.codec.issuer and "inflight" in document:
            document = {**document, "inflight": [unheld(e) for e in document["inflight"]]}
        state = self.state(group, topic)
        queue = state.queues.get(queue_id)
        if "cursor" in document:  # the whole queue: what was in flight comes back at once
            state.queues[queue_id] = QueueConsumption.from_json(document)
        elif queue is None:
            state.queues[queue_id] = QueueConsumption(int(document["committed"]))
        elif queue.committed != int(document["committed"]):
            queue.reset(int(document["committed"]))  # what it had in flight comes again
        state.dirty = True
        self._journaled[key] = document

    def _replayed_acks(self, key: QueueKey, offsets: list[int]) -> None:
        """Acks journaled after the queue's last state record: consumed, never delivered
        again (idempotent: a record the snapshot already reflects changes nothing)."""
        group, topic, queue_id = key
        state = self.table.get((group, topic))
        queue = state.queues.get(queue_id) if state is not None else None
        if state is None or queue is None:
            return  # the group was dropped (or reset) after it
        for offset in offsets:
            if offset >= queue.committed:
                queue.mark_done(offset)
        state.dirty = True

    def _replayed_entries(self, key: QueueKey, entries: list[list[Any]], issuer: str) -> None:
        """Deliveries (or held entries changed) journaled after the queue's last state record.
        A queue with no state here is left alone (its first contact was recorded before any
        delivery: a record without it is from a group dropped since). Entries another broker
        issued come back unheld: their holder's handles are not this broker's."""
        group, topic, queue_id = key
        if issuer != self.codec.issuer:
            entries = [unheld(entry) for entry in entries]
        state = self.table.get((group, topic))
        queue = state.queues.get(queue_id) if state is not None else None
        if state is None or queue is None:
            return
        for entry in sorted(entries):
            queue.restore(entry)
        state.dirty = True

    def _replayed_drop(self, group: str) -> None:
        for key in [key for key in self.table if key[0] == group]:
            del self.table[key]
            self._membership_changed = True
        for queue_key in [k for k in self._journaled if k[0] == group]:
            del self._journaled[queue_key]

    def _journal_state(self, state: TopicConsumption, every: bool = False) -> None:
        """Journal the queues of ``state`` that changed (all with ``every``); called with
        ``state.lock`` held, so records of one queue are appended in the order it changed."""
        if self.journal is None or not (state.dirty or every):
            return
        changed = []
        for queue_id, queue in state.queues.items():
            key = (state.group, state.topic, queue_id)
            document = journal_document(queue)
            if every or self._journaled.get(key) != document:
                changed.append((key, document))
        if changed:
            self.journal.record(changed)
            self._journaled.update(changed)

    # -- queries and administration ------------------------------------------

    def subscribe(self, group: str, topic: str) -> None:
        """Fix where a new group starts in ``topic`` now, before its first receive.

        With ``consume_from="latest"``, a group's position is taken at its first
        contact with a topic; calling this when a consumer subscribes makes
        messages sent between subscribing and the first receive count.
        """
        queue_ids = self.topic_queues(topic)
        settings = self.group_settings(group)
        state = self.state(group, topic)
        with state.lock:
            self.ensure_queues(state, queue_ids, settings)

    def next_wakeup_ms(self, group: str, topic: str) -> int | None:
        """When an in-flight message of ``topic`` may next become deliverable (maybe past).

        None when nothing is in flight. For a FIFO-blocked queue, the time the
        block ends rather than an earlier expiry behind it.
        """
        state = self.table.get((group, topic))
        if state is None:
            return None
        with state.lock:
            return next_wakeup_locked(state, self.clock.now_ms())

    def progress(self, group: str, topic: str) -> list[tuple[int, int, int, int]]:
        """(queue_id, committed, cursor, inflight_count) for each queue the group has touched."""
        state = self.table.get((group, topic))
        if state is None:
            return []
        with state.lock:
            return [
                (queue_id, queue.committed, queue.cursor, len(queue.inflight))
                for queue_id, queue in sorted(state.queues.items())
            ]

    def retrying(self, group: str, topic: str) -> dict[int, int]:
        """Per queue the group has touched: its in-flight messages past their first delivery
        (handed out again after a nack, a timeout or a consumer's change of invisible time)."""
        state = self.table.get((group, topic))
        if state is None:
            return {}
        with state.lock:
            return {queue_id: queue.retrying for queue_id, queue in state.queues.items()}

    def ready(self, group: str, topic: str) -> dict[int, int]:
        """Per queue the group has touched: the messages a receive would hand out now, those
        never delivered (from the cursor to the queue's end, less any there already done) and
        those in flight whose invisible time is over (requeued, nacked, timed out). The
        committed offset alone cannot say it: messages acked above it are done, and messages
        requeued below the cursor are ready again while still in flight."""
        state = self.table.get((group, topic))
        if state is None:
            return {}
        now = self.clock.now_ms()
        with state.lock:
            ready: dict[int, int] = {}
            for queue_id, queue in state.queues.items():
                end = self.store.max_offset(topic, queue_id)
                ahead = sum(1 for offset in queue.done_ahead if offset < end)
                ready[queue_id] = max(0, end - queue.cursor - ahead) + queue.visible_count(now)
            return ready

    def drop_group(self, group: str) -> None:
        """Forget everything about ``group`` (its handles stop working)."""
        with self._states_lock:
            for key in [key for key in self.table if key[0] == group]:
                del self.table[key]
                self._membership_changed = True
            if self.journal is not None:
                self.journal.record_drop(group)
                for queue_key in [k for k in self._journaled if k[0] == group]:
                    del self._journaled[queue_key]

    def release(self, holder: str) -> int:
        """Every delivery ``holder`` holds visible again now, held by nobody: its holder ended
        (a front end's lease ran out), so its deliveries are redelivered at once rather than at
        their invisible time. Journaled, so a restart does not hide them again. How many."""
        released = 0
        with self._states_lock:
            states = list(self.table.values())
        for state in states:
            with state.lock:
                changed: dict[int, list[list[Any]]] = {}
                for queue_id, queue in state.queues.items():
                    offsets = queue.release(holder, self.epochs)
                    if offsets:
                        changed[queue_id] = [queue.inflight[o].journaled(o) for o in offsets]
                if changed:
                    released += sum(len(entries) for entries in changed.values())
                    state.dirty = True
                    if self.journal is not None:
                        self.journal.record_entries(state.group, state.topic, changed)
        self.holders.discard(holder)
        return released

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Restart ``group`` at ``offset`` in one queue; its in-flight deliveries there die."""
        state = self.state(group, topic)
        with state.lock:
            queue = state.queues.get(queue_id)
            if queue is None:
                state.queues[queue_id] = QueueConsumption(offset)
            else:
                queue.reset(offset)
            state.dirty = True
            self._journal_state(state)

    # -- persistence ---------------------------------------------------------

    def snapshot(self) -> None:
        """Write the state file if anything changed since the last write (atomic)."""
        if self._state_path is None:
            return
        with self._snapshot_lock:
            with self._states_lock:
                states = list(self.table.values())
                changed = self._membership_changed
                self._membership_changed = False
            # Taken first: every record before it reflects a change the documents below hold.
            mark = self.journal.end if self.journal is not None else 0
            documents = []
            every = (
                self.journal is not None
                and time.monotonic() - self._journaled_all_s >= FULL_EVERY_S
            )
            if every:
                self._journaled_all_s = time.monotonic()
            try:
                for state in states:
                    with state.lock:
                        self._journal_state(state, every)
                        if state.dirty or state.saved is None:
                            state.saved = state.to_json()
                            state.dirty = False
                            changed = True
                        documents.append(state.saved)
                if changed or mark != self._journal_mark:
                    # Every record this snapshot reflects lies below ``end``: a log ending
                    # before it lost some (opening sets such a snapshot aside).
                    end = self.journal.end if self.journal is not None else 0
                    write_snapshot(
                        self._state_path, self.codec.key, next(self.epochs), documents, mark, end
                    )
                    self._journal_mark = mark
            except BaseException:
                self._membership_changed = True  # make the next snapshot write
                raise

    def close(self) -> None:
        self.snapshot()

    # -- internals -----------------------------------------------------------

    def state(self, group: str, topic: str) -> TopicConsumption:
        key = (group, topic)
        state = self.table.get(key)
        if state is None:
            with self._states_lock:
                state = self.table.get(key)
                if state is None:
                    state = self.table[key] = TopicConsumption(group, topic)
        return state

    def ensure_queues(
        self, state: TopicConsumption, queue_ids: list[int], settings: PopGroupSettings
    ) -> None:
        """Give every readable queue a position; called with ``state.lock`` held.

        "latest" and "auto" apply only to a group's first contact with the topic: a
        queue added later starts at its beginning, since all of it is news to the group.
        """
        queues = state.queues
        first_contact = not queues
        for queue_id in queue_ids:
            if queue_id in queues:
                continue
            if first_contact and settings.consume_from == "latest":
                start = self.store.max_offset(state.topic, queue_id)
            elif first_contact and settings.consume_from == "auto":
                start = self._auto_start(state.topic, queue_id)
            else:
                start = self.store.min_offset(state.topic, queue_id)
            queues[queue_id] = QueueConsumption(start)
            state.dirty = True
        if first_contact:
            # Where the group starts is journaled at once: a new master must not take its
            # first receive there for a first contact (starting at the latest offset, it
            # would skip what was sent since).
            self._journal_state(state)

    def _auto_start(self, topic: str, queue_id: int) -> int:
        """RocketMQ 5's first pop position (``PopMessageProcessor.getInitOffset``, mode MAX).

        The queue's first message when the queue still starts at offset 0 and that
        message is hot (``initPopOffsetByCheckMsgInMem``): a consumer started right
        after its producer gets everything. Otherwise the queue's last message, so
        the newest one is still delivered but an old backlog is not replayed.
        """
        end = self.store.max_offset(topic, queue_id)
        if end == 0:
            return 0
        if self.store.min_offset(topic, queue_id) == 0:
            first = self.store.get(topic, queue_id, 0, max_messages=1)
            if first.messages and first.messages[0].queue_offset == 0:
                log_end = self.store.stats().commit_log_max_offset
                if log_end - first.messages[0].commit_log_offset <= self._hot_data_bytes:
                    return 0
        return end - 1

    def read(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        result = self.store.get(topic, queue_id, offset, max_messages=1)
        if result.messages and result.messages[0].queue_offset == offset:
            return result.messages[0]
        return None


def unheld(entry: list[Any]) -> list[Any]:
    """An in-flight entry's journaled form without its holder (visible at once again, but for
    a deferred one: at its delivery time)."""
    if len(entry) >= 7 and not int(entry[1]):
        return [*entry[:5], "", entry[6]]
    return list(entry[:5])


def journal_document(queue: QueueConsumption) -> dict[str, Any]:
    """What :mod:`pop_journal` records of a queue: the whole queue (its snapshot form) while
    few are in flight, else only the committed position (bounding a record's size)."""
    if len(queue.inflight) <= MAX_INFLIGHT_JOURNALED:
        return queue.to_json()
    return {"committed": queue.committed}


def next_wakeup_locked(state: TopicConsumption, now: int) -> int | None:
    """:meth:`PopStates.next_wakeup_ms` of one state; called with ``state.lock`` held."""
    earliest: int | None = None
    for queue in state.queues.values():
        if queue.ordered and queue.fifo_blocked(now):
            wake: int | None = max(queue.inflight[o].visible_at for o in queue.ordered)
        else:
            wake = queue.next_visible_at()
        if wake is not None and (earliest is None or wake < earliest):
            earliest = wake
    return earliest
