"""Pop consumption: receive, ack, change invisible duration, dead-letter.

Consumers of a group share each queue; the broker decides who gets what.
State per (group, topic, queue) lives in :mod:`halfmoon.broker.consumption`.

receive(group, topic, filter, batch, invisible[, queue]):
  1. Walk the topic's readable queues, starting one further each call so
     concurrent consumers spread over the queues; or only ``queue`` when
     one is named (a consumer receiving per assigned queue).
  2. In each queue, first take in-flight deliveries whose invisible time is
     over: one at the group's max attempts goes to the dead-letter callback
     (then counts as consumed); any other is read again from its queue and
     delivered with attempt + 1 and a new handle (redelivery in place: no
     retry topic).
  3. Then new messages from the queue's cursor: the store skips tag
     mismatches on the consume queue, the matcher decides the rest; skipped
     messages count as consumed.
  4. Stop at the batch size. Every delivery is hidden for ``invisible_ms``.

FIFO groups order each *queue* (stricter than per message group, and
simpler): while an ordered message of a queue is in flight and not yet
visible again, nothing of that queue is delivered; when it comes back, it is
redelivered before anything after it. One receive may return a run of
consecutive messages of a queue, in order, to the same consumer (as
RocketMQ's orderly pop does); the queue stays blocked until all are acked or
dead-lettered.

Locking: one lock per (group, topic), held across the store reads of a
receive so two consumers never take the same offsets. Different groups and
topics never contend. The dead-letter callback runs with that lock held: it
must not call back into this service for the same group and topic.

A last delivery whose invisible time ends is dead-lettered in the
background too (:meth:`PopService.revive`, from ``Broker.tick``): see
:mod:`halfmoon.broker.revive`.

The state table, where a new group starts, the queries, administration and
the snapshot are :mod:`halfmoon.broker.pop_state`; this module delivers.

Invisible-time bounds are RocketMQ's proxy defaults: a receive hides a
message for 10 s .. 12 h, a change of invisible duration 0 .. 12 h.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from halfmoon.broker.clock import Clock
from halfmoon.broker.consumption import (
    InFlight,
    QueueConsumption,
    TopicConsumption,
)
from halfmoon.broker.filter import MessageFilter
from halfmoon.broker.message import MessageView, Received
from halfmoon.broker.pop_journal import PopJournal
from halfmoon.broker.pop_state import (
    PopGroupSettings,
    PopStates,
    default_hot_data_bytes,
    next_wakeup_locked,
)
from halfmoon.broker.receipt import (
    MIN_CHANGE_INVISIBLE_MS,
    MIN_RECEIVE_INVISIBLE_MS,
    InvalidReceiptHandle,
    ReceiptHandle,
    check_invisible_ms,
)
from halfmoon.broker.revive import ReviveQueue
from halfmoon.broker.trace import TraceRecorder, position_key
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import StoredMessage

log = logging.getLogger(__name__)

# A message whose dead-lettering failed is tried again this much later.
DEAD_LETTER_RETRY_MS = 1_000
# Store reads per queue per receive while looking for matching new messages
# (each read scans a bounded number of entries), so a filter that matches
# nothing cannot make one receive walk a whole queue.
MAX_READS_PER_QUEUE = 4
# receive_nowait declines a group this many messages (or more) behind a queue's end: what
# it would read was written long ago and may have to come from disk (a worker's job).
LOOP_BACKLOG_LIMIT = 4096

DeadLetter = Callable[[str, StoredMessage, int], None]

__all__ = [
    "DEAD_LETTER_RETRY_MS",
    "DeadLetter",
    "PopGroupSettings",
    "PopService",
    "default_hot_data_bytes",
]


def _nothing_in_flight(group: str, topic: str) -> InvalidReceiptHandle:
    return InvalidReceiptHandle(
        f"group {group!r} has nothing in flight on topic {topic!r}: "
        "the handle is from another group or its delivery is over"
    )


def _any_expired(state: TopicConsumption, queue_ids: list[int], now: int) -> bool:
    """Whether a delivery in one of these queues is visible again (due for redelivery)."""
    for queue_id in queue_ids:
        queue = state.queues.get(queue_id)
        if queue is not None and queue.inflight:
            visible_at = queue.next_visible_at()
            if visible_at is not None and visible_at <= now:
                return True
    return False


class PopService(PopStates):
    """Pop deliveries over :class:`~halfmoon.broker.pop_state.PopStates`."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        topic_queues: Callable[[str], list[int]],
        group_settings: Callable[[str], PopGroupSettings],
        dead_letter: DeadLetter,
        state_path: Path | None,
        min_receive_invisible_ms: int = MIN_RECEIVE_INVISIBLE_MS,
        hot_data_bytes: int = 0,
        priority_order: Callable[[str], bool] = lambda topic: False,
        journal: PopJournal | None = None,
    ) -> None:
        super().__init__(
            store,
            clock,
            topic_queues=topic_queues,
            group_settings=group_settings,
            state_path=state_path,
            hot_data_bytes=hot_data_bytes,
            journal=journal,
        )
        self._dead_letter = dead_letter
        self._min_receive_invisible_ms = min_receive_invisible_ms
        # Topics whose receives start at the first of topic_queues every time: priority
        # topics, which list their queues highest priority first (priority.py).
        self._priority_order = priority_order
        self._revive = ReviveQueue(
            self._states,
            lambda group: self._group_settings(group).max_delivery_attempts,
            self._read,
            self._send_to_dead_letter,
            lambda: next(self._epochs),
            retry_ms=DEAD_LETTER_RETRY_MS,
        )
        for state in self._states.values():  # restored from the snapshot
            self._revive.watch_restored(state)
        self.trace: TraceRecorder | None = None  # acks and changes of invisibility

    # -- receive -------------------------------------------------------------

    def receive(
        self,
        group: str,
        topic: str,
        matcher: MessageFilter | None,
        batch_size: int,
        invisible_ms: int,
        queue_id: int | None = None,
    ) -> list[MessageView]:
        """Up to ``batch_size`` messages, hidden from the group for ``invisible_ms``.

        ``queue_id`` limits the receive to that queue (none from a queue that is
        not readable). Non-blocking: [] when nothing is available (see
        :meth:`next_wakeup_ms`).
        """
        received = self._receive(group, topic, matcher, batch_size, invisible_ms, queue_id, True)
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
        next due (:meth:`next_wakeup_ms`, read under the same hold of the lock).
        """
        return self._receive(group, topic, matcher, batch_size, invisible_ms, queue_id, False)

    def _receive(
        self,
        group: str,
        topic: str,
        matcher: MessageFilter | None,
        batch_size: int,
        invisible_ms: int,
        queue_id: int | None,
        blocking: bool,
    ) -> Received | None:
        check_invisible_ms(invisible_ms, self._min_receive_invisible_ms)
        if batch_size < 1:
            raise InvalidArgument(f"batch size must be at least 1, got {batch_size}")
        queue_ids = self._topic_queues(topic)
        if not queue_ids:
            return Received([])
        settings = self._group_settings(group)
        state = self._state(group, topic)
        out: list[MessageView] = []
        if not state.lock.acquire(blocking):
            return None
        try:
            if not blocking and not state.queues:
                return None  # first contact: where the group starts may read the store's past
            self._ensure_queues(state, queue_ids, settings)
            now = self._clock.now_ms()
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
                    state, walked, settings, matcher, batch_size, now, invisible_ms, out
                )
                if len(out) >= batch_size:
                    break
            if out or blocking:
                return Received(out)
            return Received(out, next_wakeup_locked(state, now))
        finally:
            state.lock.release()

    def _far_behind(self, state: TopicConsumption, queue_ids: list[int]) -> bool:
        """Whether the group's cursor in one of these queues trails the queue's end by more
        than :data:`LOOP_BACKLOG_LIMIT` messages: old data may no longer be in the page
        cache, and a read that faults it in from disk must not stall an event loop."""
        max_offset = self._store.max_offset
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
        out: list[MessageView],
    ) -> None:
        queue = state.queues[queue_id]
        if settings.fifo and queue.ordered and queue.fifo_blocked(now):
            return
        if queue.inflight and not self._redeliver_expired(
            state, queue_id, queue, settings, batch_size, now, invisible_ms, out
        ):
            return
        if len(out) < batch_size:
            self._deliver_new(
                state, queue_id, queue, settings, matcher, batch_size, now, invisible_ms, out
            )

    def _redeliver_expired(
        self,
        state: TopicConsumption,
        queue_id: int,
        queue: QueueConsumption,
        settings: PopGroupSettings,
        batch_size: int,
        now: int,
        invisible_ms: int,
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
                stored = self._read(state.topic, queue_id, offset)
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
                if self._send_to_dead_letter(state.group, stored, entry.attempt):
                    queue.complete(offset)
                else:
                    queue.hide(offset, now + DEAD_LETTER_RETRY_MS, next(self._epochs))
                    self._watch(state, queue_id, offset, entry)
                    if settings.fifo and entry.ordered:
                        # Nothing after it may go out before it does.
                        for pending, _ in expired[index + 1 :]:
                            queue.requeue(pending)
                        return False
            else:
                epoch = next(self._epochs)
                queue.redeliver(offset, visible_at, epoch)
                if entry.attempt >= settings.max_delivery_attempts:
                    self._watch(state, queue_id, offset, entry)
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
        out: list[MessageView],
    ) -> None:
        tag_hashes = matcher.tag_hash_codes if matcher is not None else None
        visible_at = now + invisible_ms
        topic = state.topic
        for _ in range(MAX_READS_PER_QUEUE):
            wanted = batch_size - len(out)
            if wanted <= 0:
                return
            cursor = queue.cursor
            result = self._store.get(
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
                epoch = next(self._epochs)
                ordered = settings.fifo and (
                    settings.every_message_ordered or view.message_group is not None
                )
                queue.deliver(
                    stored.queue_offset, stored.commit_log_offset, visible_at, epoch, ordered
                )
                if settings.max_delivery_attempts <= 1:
                    self._watch(
                        state, queue_id, stored.queue_offset, queue.inflight[stored.queue_offset]
                    )
                view.delivery_attempt = 1
                view.invisible_duration_ms = invisible_ms
                view.receipt_handle = self._codec.encode(
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
        view.receipt_handle = self._codec.encode(
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

    def _send_to_dead_letter(self, group: str, stored: StoredMessage, attempts: int) -> bool:
        try:
            self._dead_letter(group, stored, attempts)
        except Exception:
            log.exception(
                "group %s: moving %s/%d offset %d to the dead-letter topic failed; "
                "retrying in %d ms",
                group,
                stored.topic,
                stored.queue_id,
                stored.queue_offset,
                DEAD_LETTER_RETRY_MS,
            )
            return False
        return True

    # -- the revive scan (revive.py) ------------------------------------------

    def revive(self, now: int) -> int:
        """Dead-letter last deliveries whose invisible time is over (``Broker.tick``).

        Bounded work per call; returns how many were dead-lettered (or tried).
        """
        return self._revive.run(now)

    def _watch(self, state: TopicConsumption, queue_id: int, offset: int, entry: InFlight) -> None:
        self._revive.watch_entry(state, queue_id, offset, entry)

    # -- ack and friends -----------------------------------------------------

    def ack(self, group: str, topic: str, handle: str) -> None:
        """Mark the delivery ``handle`` names as consumed."""
        receipt = self._decode(topic, handle)
        state = self._state_for_handle(group, topic)
        end = None
        with state.lock:
            queue, entry = self._in_flight(state, receipt)
            queue.complete(receipt.queue_offset)
            state.dirty = True
            if self._journal is not None:
                end = self._journal.record_acks(
                    group, topic, {receipt.queue_id: [receipt.queue_offset]}
                )
        if end is not None:
            self._wait_journaled(end)
        if self.trace is not None:
            self.trace.record(
                position_key(entry.commit_log_offset), topic, "acked",
                group=group, attempt=entry.attempt,
            )  # fmt: skip

    def _wait_journaled(self, end: int) -> None:
        """The ack answers once its record is durable as the store acknowledges writes (under
        sync replication: on the in-sync replicas; NOT_ENOUGH_REPLICAS when too few)."""
        assert self._journal is not None
        self._journal.wait(end)

    def ack_many(
        self, group: str, topic: str, handles: list[str], *, blocking: bool = True
    ) -> list[Exception | None] | None:
        """Ack every handle under one hold of the group's lock: per handle None (acked) or the
        error :meth:`ack` would have raised. Without ``blocking``, None at once when the lock
        is busy (nothing acked), so an event loop may call it; also None with a journal (a
        broker group), where the answer waits for the batch's record to be durable.
        With ``blocking`` and a journal, one record for the batch, waited for once: an error
        of that wait (e.g. NOT_ENOUGH_REPLICAS) is every acked handle's result."""
        results: list[Exception | None] = [None] * len(handles)
        receipts: list[tuple[int, ReceiptHandle]] = []
        for index, handle in enumerate(handles):
            try:
                receipts.append((index, self._decode(topic, handle)))
            except InvalidReceiptHandle as exc:
                results[index] = exc
        if not receipts:
            return results
        state = self._states.get((group, topic))
        if state is None:
            error = _nothing_in_flight(group, topic)
            return [error if r is None else r for r in results]
        if not blocking and self._journal is not None:
            return None  # appending and waiting for durability are a worker's job
        if not state.lock.acquire(blocking):
            return None
        acked: list[InFlight] = []
        acked_offsets: dict[int, list[int]] = {}
        end = None
        try:
            for index, receipt in receipts:
                try:
                    queue, entry = self._in_flight(state, receipt)
                except InvalidReceiptHandle as exc:
                    results[index] = exc
                    continue
                queue.complete(receipt.queue_offset)
                state.dirty = True
                acked.append(entry)
                acked_offsets.setdefault(receipt.queue_id, []).append(receipt.queue_offset)
            if self._journal is not None and acked_offsets:
                end = self._journal.record_acks(group, topic, acked_offsets)
        finally:
            state.lock.release()
        if end is not None:
            try:
                self._wait_journaled(end)
            except Exception as exc:  # noqa: BLE001 - the batch's answer: every ack it held
                failed = {index for index, _ in receipts if results[index] is None}
                return [exc if index in failed else r for index, r in enumerate(results)]
        if self.trace is not None:
            for entry in acked:
                self.trace.record(
                    position_key(entry.commit_log_offset), topic, "acked",
                    group=group, attempt=entry.attempt,
                )  # fmt: skip
        return results

    def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> str:
        """Hide the message ``invisible_ms`` from now; returns the new handle (the old one dies)."""
        check_invisible_ms(invisible_ms, MIN_CHANGE_INVISIBLE_MS)
        receipt = self._decode(topic, handle)
        state = self._state_for_handle(group, topic)
        max_attempts = self._group_settings(group).max_delivery_attempts
        with state.lock:
            queue, entry = self._in_flight(state, receipt)
            visible_at = self._clock.now_ms() + invisible_ms
            epoch = next(self._epochs)
            queue.hide(receipt.queue_offset, visible_at, epoch)
            if entry.attempt >= max_attempts:
                self._watch(state, receipt.queue_id, receipt.queue_offset, entry)
            state.dirty = True
            if self.trace is not None:
                self.trace.record(
                    position_key(entry.commit_log_offset), topic, "invisible_changed",
                    group=group, attempt=entry.attempt, invisible_ms=invisible_ms,
                )  # fmt: skip
            return self._codec.encode(
                ReceiptHandle(
                    topic,
                    receipt.queue_id,
                    receipt.queue_offset,
                    epoch,
                    visible_at,
                    entry.commit_log_offset,
                )
            )

    def forward_to_dead_letter(self, group: str, topic: str, handle: str) -> None:
        """Dead-letter the delivery ``handle`` names now (the client gave up on it)."""
        receipt = self._decode(topic, handle)
        state = self._state_for_handle(group, topic)
        with state.lock:
            queue, entry = self._in_flight(state, receipt)
            stored = self._read(topic, receipt.queue_id, receipt.queue_offset)
            if stored is not None:
                self._dead_letter(group, stored, entry.attempt)
            queue.complete(receipt.queue_offset)
            state.dirty = True

    # -- transactional consumption (broker/transactional_consume.py) -----------

    def delivery(self, group: str, topic: str, handle: str) -> tuple[ReceiptHandle, int]:
        """The live delivery ``handle`` names and its attempt (InvalidReceiptHandle if over)."""
        receipt = self._decode(topic, handle)
        state = self._state_for_handle(group, topic)
        with state.lock:
            _, entry = self._in_flight(state, receipt)
            return receipt, entry.attempt

    @contextmanager
    def locked(self, keys: Iterable[tuple[str, str]]) -> Iterator[None]:
        """Hold the consumption state of every (group, topic) in ``keys`` (taken in sorted order,
        so two holders never deadlock)."""
        with ExitStack() as stack:
            for group, topic in sorted(set(keys)):
                stack.enter_context(self._state(group, topic).lock)
            yield

    def holds(self, group: str, topic: str, queue_id: int, offset: int, epoch: int) -> bool:
        """Whether that delivery is still in flight under ``epoch``; inside :meth:`locked`."""
        state = self._states.get((group, topic))
        queue = state.queues.get(queue_id) if state is not None else None
        entry = queue.inflight.get(offset) if queue is not None else None
        return entry is not None and entry.epoch == epoch

    def complete_delivery(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Consume a delivery :meth:`holds` vouched for; inside :meth:`locked`."""
        state = self._states[(group, topic)]
        state.queues[queue_id].complete(offset)
        state.dirty = True

    def hide_delivery(
        self, group: str, topic: str, queue_id: int, offset: int, delay_ms: int, *, locked: bool
    ) -> None:
        """Make a delivery visible again ``delay_ms`` from now (a reject); a delivery no longer in
        flight is left alone. ``locked``: the caller is inside :meth:`locked`."""
        state = self._state(group, topic)
        with nullcontext() if locked else state.lock:
            queue = state.queues.get(queue_id)
            entry = queue.inflight.get(offset) if queue is not None else None
            if queue is None or entry is None:
                return
            queue.hide(offset, self._clock.now_ms() + delay_ms, next(self._epochs))
            if entry.attempt >= self._group_settings(group).max_delivery_attempts:
                self._watch(state, queue_id, offset, entry)
            state.dirty = True

    def replay_done(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Recovery: ``offset`` was consumed by a commit the state file may predate. Idempotent:
        done already is a no-op, in flight completes it, past the cursor it is marked done ahead
        (never delivered)."""
        state = self._state(group, topic)
        with state.lock:
            self._ensure_queues(state, self._topic_queues(topic), self._group_settings(group))
            queue = state.queues.get(queue_id)
            if queue is None:
                queue = state.queues[queue_id] = QueueConsumption(offset)
            queue.mark_done(offset)
            state.dirty = True

    def read(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The stored message at ``offset`` (None when retention removed it)."""
        return self._read(topic, queue_id, offset)

    def handle_topic(self, handle: str) -> str:
        """The topic a receipt handle of this service names (InvalidReceiptHandle if garbled)."""
        return self._codec.decode(handle).topic

    def _decode(self, topic: str, handle: str) -> ReceiptHandle:
        receipt = self._codec.decode(handle)
        if receipt.topic != topic:
            raise InvalidReceiptHandle(
                f"receipt handle belongs to topic {receipt.topic!r}, not {topic!r}"
            )
        return receipt

    def _state_for_handle(self, group: str, topic: str) -> TopicConsumption:
        state = self._states.get((group, topic))
        if state is None:
            raise _nothing_in_flight(group, topic)
        return state

    def _in_flight(
        self, state: TopicConsumption, receipt: ReceiptHandle
    ) -> tuple[QueueConsumption, InFlight]:
        queue = state.queues.get(receipt.queue_id)
        entry = queue.inflight.get(receipt.queue_offset) if queue is not None else None
        if queue is None or entry is None or entry.epoch != receipt.epoch:
            raise InvalidReceiptHandle(
                "receipt handle is no longer valid: the message was already acked, its "
                "invisible duration was changed (use the newest handle), or it became "
                "visible again and was redelivered; receive it again"
            )
        return queue, entry
