"""The receive of pop consumption: the walk over a topic's queues that
:mod:`halfmoon.broker.pop` describes, redelivering what is due, dead-lettering
what ran out of attempts and delivering new messages, each hidden for the
receive's invisible time under a fresh receipt handle.

It reads and changes the state table (:class:`~halfmoon.broker.pop_state.PopStates`)
under each (group, topic)'s lock, and hands last deliveries to the revive scan
(:class:`~halfmoon.broker.revive.ReviveQueue`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from halfmoon.broker.consumption import InFlight, QueueConsumption, TopicConsumption
from halfmoon.broker.filter import MessageFilter
from halfmoon.broker.message import PROPERTY_DELIVERY_TIME, MessageView, Received
from halfmoon.broker.pop_state import PopGroupSettings, PopStates, next_wakeup_locked
from halfmoon.broker.receipt import ReceiptHandle, check_invisible_ms
from halfmoon.broker.revive import ReviveQueue
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import GetStatus
from halfmoon.store.message import StoredMessage

log = logging.getLogger("halfmoon.broker.pop")

# A message whose dead-lettering failed is tried again this much later.
DEAD_LETTER_RETRY_MS = 1_000
# Store reads per queue per receive while looking for matching new messages
# (each read scans a bounded number of entries), so a filter that matches
# nothing cannot make one receive walk a whole queue.
MAX_READS_PER_QUEUE = 4
# receive_nowait declines a group this many messages (or more) behind a queue's end: what
# it would read was written long ago and may have to come from disk (a worker's job).
LOOP_BACKLOG_LIMIT = 4096

# Moves a message to the dead-letter topic: (group, message, attempts) -> whether it did.
SendToDeadLetter = Callable[[str, StoredMessage, int], bool]


def _due_later(stored: StoredMessage, now: int) -> int | None:
    """The delivery time of a message stored in its queue before it (a transaction group
    member committed with one: AMQP's ``x-delay`` in a transaction), when still ahead."""
    due = stored.properties.get(PROPERTY_DELIVERY_TIME)
    if due is None:
        return None
    try:
        at = int(due)
    except ValueError:
        return None
    return at if at > now else None


def _any_expired(state: TopicConsumption, queue_ids: list[int], now: int) -> bool:
    """Whether a delivery in one of these queues is visible again (due for redelivery)."""
    for queue_id in queue_ids:
        queue = state.queues.get(queue_id)
        if queue is not None and queue.inflight:
            visible_at = queue.next_visible_at()
            if visible_at is not None and visible_at <= now:
                return True
    return False


class PopReceiver:
    """Receives from the state table: what is due again first, then new messages."""

    def __init__(
        self,
        states: PopStates,
        revive: ReviveQueue,
        dead_letter: SendToDeadLetter,
        *,
        min_receive_invisible_ms: int,
        priority_order: Callable[[str], bool],
    ) -> None:
        self.states = states
        self._revive = revive  # watches last deliveries, to dead-letter them when due
        self._dead_letter = dead_letter
        self._min_invisible_ms = min_receive_invisible_ms
        # Topics whose receives start at the first of topic_queues every time: priority
        # topics, which list their queues highest priority first (priority.py).
        self._priority_order = priority_order

    def receive(
        self,
        group: str,
        topic: str,
        matcher: MessageFilter | None,
        batch_size: int,
        invisible_ms: int,
        queue_id: int | None = None,
        holder: str = "",
    ) -> list[MessageView]:
        """Up to ``batch_size`` messages, hidden from the group for ``invisible_ms``.

        ``queue_id`` limits the receive to that queue (none from a queue that is
        not readable). ``holder``: who holds the deliveries (released when it ends:
        :meth:`~halfmoon.broker.pop_state.PopStates.release`). Non-blocking: [] when
        nothing is available (see
        :meth:`~halfmoon.broker.pop_state.PopStates.next_wakeup_ms`). The deliveries
        are journaled before it returns.
        """
        received = self._receive(
            group, topic, matcher, batch_size, invisible_ms, queue_id, holder, True
        )
        assert received is not None  # a blocking receive always answers
        return received.views

    def receive_nowait(
        self,
        group: str,
        topic: str,
        matcher: MessageFilter | None,
        batch_size: int,
        invisible_ms: int,
        queue_id: int | None = None,
        holder: str = "",
    ) -> Received | None:
        """:meth:`receive` when it needs neither to wait nor to write; None when it would.

        It would wait for the (group, topic) lock another receive or ack holds,
        it would write when an expired delivery is due (a redelivery may
        dead-letter, which appends to the store, durably), and it may read from
        disk when the group trails a queue by more than
        :data:`LOOP_BACKLOG_LIMIT` messages. Then the caller
        runs :meth:`receive` where blocking is fine (a worker thread). What is
        left is reading the queues and bookkeeping in memory: an event loop may
        call this. When it finds nothing it also says when an in-flight message is
        next due (:meth:`~halfmoon.broker.pop_state.PopStates.next_wakeup_ms`, read under
        the same hold of the lock). Its journal record is one append, as an ack's is.
        """
        return self._receive(
            group, topic, matcher, batch_size, invisible_ms, queue_id, holder, False
        )

    def _receive(
        self,
        group: str,
        topic: str,
        matcher: MessageFilter | None,
        batch_size: int,
        invisible_ms: int,
        queue_id: int | None,
        holder: str,
        blocking: bool,
    ) -> Received | None:
        check_invisible_ms(invisible_ms, self._min_invisible_ms)
        if batch_size < 1:
            raise InvalidArgument(f"batch size must be at least 1, got {batch_size}")
        queue_ids = self.states.topic_queues(topic)
        if not queue_ids:
            return Received([])
        settings = self.states.group_settings(group)
        state = self.states.state(group, topic)
        out: list[MessageView] = []
        deferred: list[tuple[int, int]] = []  # (queue id, offset): walked, not yet due
        if not state.lock.acquire(blocking):
            return None
        try:
            if not blocking and not state.queues:
                return None  # first contact: where the group starts may read the store's past
            self.states.ensure_queues(state, queue_ids, settings)
            now = self.states.clock.now_ms()
            if queue_id is not None:
                walk = [queue_id] if queue_id in queue_ids else []
            elif not settings.fifo and self._priority_order(topic):
                walk = list(queue_ids)  # highest priority first, every time
            else:
                walk = queue_ids[state.rotation :] + queue_ids[: state.rotation]
            if not blocking and (_any_expired(state, walk, now) or self._far_behind(state, walk)):
                return None
            if queue_id is None and (settings.fifo or not self._priority_order(topic)):
                state.rotation = (state.rotation + 1) % len(queue_ids)
            for walked in walk:
                self._receive_queue(
                    state, walked, settings, matcher, batch_size, now, invisible_ms, holder, out,
                    deferred,
                )  # fmt: skip
                if len(out) >= batch_size:
                    break
            if out or deferred:
                self._journal_deliveries(state, out, holder, deferred)
            if out or blocking:
                return Received(out)
            return Received(out, next_wakeup_locked(state, now))
        finally:
            state.lock.release()

    def _journal_deliveries(
        self,
        state: TopicConsumption,
        out: list[MessageView],
        holder: str,
        deferred: list[tuple[int, int]],
    ) -> None:
        """One journal record of a receive's deliveries (:mod:`pop_journal`), so a restart knows
        them: delivered before, held while their holder lives, or deferred to their time."""
        if holder and out:
            self.states.holders.add(holder)
        journal = self.states.journal
        if journal is None:
            return
        entries: dict[int, list[list[Any]]] = {}
        walked = [(view.queue_id, view.queue_offset) for view in out] + deferred
        for queue_id, offset in walked:
            entry = state.queues[queue_id].inflight.get(offset)
            if entry is not None:
                entries.setdefault(queue_id, []).append(entry.journaled(offset))
        if entries:
            journal.record_entries(state.group, state.topic, entries)

    def _far_behind(self, state: TopicConsumption, queue_ids: list[int]) -> bool:
        """Whether the group's cursor in one of these queues trails the queue's end by more
        than :data:`LOOP_BACKLOG_LIMIT` messages: old data may no longer be in the page
        cache, and a read that faults it in from disk must not stall an event loop."""
        max_offset = self.states.store.max_offset
        for queue_id in queue_ids:
            queue = state.queues.get(queue_id)
            if queue is not None and (
                max_offset(state.topic, queue_id) - queue.cursor > LOOP_BACKLOG_LIMIT
            ):
                return True
        return False

    def _receive_queue(
        self,
        state: TopicConsumption,
        queue_id: int,
        settings: PopGroupSettings,
        matcher: MessageFilter | None,
        batch_size: int,
        now: int,
        invisible_ms: int,
        holder: str,
        out: list[MessageView],
        deferred: list[tuple[int, int]],
    ) -> None:
        queue = state.queues[queue_id]
        if settings.fifo and queue.ordered and queue.fifo_blocked(now):
            return
        if queue.inflight and not self._redeliver_expired(
            state, queue_id, queue, settings, batch_size, now, invisible_ms, holder, out
        ):
            return
        if len(out) < batch_size:
            self._deliver_new(
                state, queue_id, queue, settings, matcher, batch_size, now, invisible_ms,
                holder, out, deferred,
            )  # fmt: skip

    def _redeliver_expired(
        self,
        state: TopicConsumption,
        queue_id: int,
        queue: QueueConsumption,
        settings: PopGroupSettings,
        batch_size: int,
        now: int,
        invisible_ms: int,
        holder: str,
        out: list[MessageView],
    ) -> bool:
        """Redeliver or dead-letter expired deliveries; False if the queue must stop here."""
        expired = queue.take_expired(now, batch_size - len(out), by_offset=settings.fifo)
        if not expired:
            return True
        state.dirty = True
        visible_at = now + invisible_ms
        for index, (offset, entry) in enumerate(expired):
            try:
                stored = self.states.read(state.topic, queue_id, offset)
                view = MessageView.of(stored) if stored is not None else None
            except BaseException:
                for pending, _ in expired[index:]:
                    queue.requeue(pending)
                raise
            if stored is None or view is None:
                log.warning(
                    "group %s: %s/%d offset %d is gone from the store while in flight; "
                    "counting it as consumed",
                    state.group,
                    state.topic,
                    queue_id,
                    offset,
                )
                queue.complete(offset)
            elif entry.attempt >= settings.max_delivery_attempts:
                if self._dead_letter(state.group, stored, entry.attempt):
                    queue.complete(offset)
                else:
                    queue.hide(offset, now + DEAD_LETTER_RETRY_MS, next(self.states.epochs))
                    self._revive.watch_entry(state, queue_id, offset, entry)
                    if settings.fifo and entry.ordered:
                        # Nothing after it may go out before it does.
                        for pending, _ in expired[index + 1 :]:
                            queue.requeue(pending)
                        return False
            else:
                epoch = next(self.states.epochs)
                queue.redeliver(offset, visible_at, epoch, holder)
                if entry.attempt >= settings.max_delivery_attempts:
                    self._revive.watch_entry(state, queue_id, offset, entry)
                out.append(self._finish_view(view, state.topic, entry, visible_at, invisible_ms))
        return True

    def _deliver_new(
        self,
        state: TopicConsumption,
        queue_id: int,
        queue: QueueConsumption,
        settings: PopGroupSettings,
        matcher: MessageFilter | None,
        batch_size: int,
        now: int,
        invisible_ms: int,
        holder: str,
        out: list[MessageView],
        deferred: list[tuple[int, int]],
    ) -> None:
        tag_hashes = matcher.tag_hash_codes if matcher is not None else None
        visible_at = now + invisible_ms
        topic = state.topic
        for _ in range(MAX_READS_PER_QUEUE):
            wanted = batch_size - len(out)
            if wanted <= 0:
                return
            cursor = queue.cursor
            result = self.states.store.get(
                topic, queue_id, cursor, max_messages=wanted, tag_hashes=tag_hashes
            )
            status = result.status
            if status is GetStatus.OFFSET_TOO_SMALL:
                # Retention removed messages the group never read.
                log.warning(
                    "group %s: %s/%d offsets %d..%d aged out before being consumed",
                    state.group,
                    topic,
                    queue_id,
                    cursor,
                    result.min_offset - 1,
                )
                queue.move_cursor(max(result.min_offset, cursor + 1))
                state.dirty = True
                continue
            if status is GetStatus.OFFSET_OVERFLOW:
                # The queue restarted below our cursor (topic deleted and recreated).
                queue.reset(result.max_offset)
                state.dirty = True
                return
            if status is GetStatus.NO_MESSAGE or status is GetStatus.NO_SUCH_QUEUE:
                return
            next_cursor = result.next_offset
            for stored in result.messages:
                if len(out) >= batch_size:
                    next_cursor = stored.queue_offset
                    break
                if queue.done_ahead and queue.skip_done(stored.queue_offset):
                    continue  # consumed by a transaction replayed after a crash
                view = MessageView.of(stored)
                if matcher is not None and not matcher.matches_message(view.tag, view.properties):
                    continue
                epoch = next(self.states.epochs)
                ordered = settings.fifo and (
                    settings.every_message_ordered or view.message_group is not None
                )
                due = _due_later(stored, now)
                if due is not None:
                    queue.defer(stored.queue_offset, stored.commit_log_offset, due, epoch, ordered)
                    deferred.append((queue_id, stored.queue_offset))
                    continue
                queue.deliver(
                    stored.queue_offset, stored.commit_log_offset, visible_at, epoch, ordered,
                    holder,
                )  # fmt: skip
                if settings.max_delivery_attempts <= 1:
                    self._revive.watch_entry(
                        state, queue_id, stored.queue_offset, queue.inflight[stored.queue_offset]
                    )
                view.delivery_attempt = 1
                view.invisible_duration_ms = invisible_ms
                view.receipt_handle = self.states.codec.encode(
                    ReceiptHandle(
                        topic,
                        queue_id,
                        stored.queue_offset,
                        epoch,
                        visible_at,
                        stored.commit_log_offset,
                    )
                )
                out.append(view)
            if next_cursor <= cursor:
                return
            queue.move_cursor(next_cursor)
            state.dirty = True

    def _finish_view(
        self, view: MessageView, topic: str, entry: InFlight, visible_at: int, invisible_ms: int
    ) -> MessageView:
        view.delivery_attempt = entry.attempt
        view.invisible_duration_ms = invisible_ms
        view.receipt_handle = self.states.codec.encode(
            ReceiptHandle(
                topic,
                view.queue_id,
                view.queue_offset,
                entry.epoch,
                visible_at,
                entry.commit_log_offset,
            )
        )
        return view
