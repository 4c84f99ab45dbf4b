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
the snapshot are :mod:`halfmoon.broker.pop_state`; the receive walk is
:mod:`halfmoon.broker.pop_receive`; this module holds both and serves the rest
(acks, changes of invisible time, dead-lettering, transactional consumption).

Invisible-time bounds are RocketMQ's proxy defaults: a receive hides a
message for 10 s .. 12 h, a change of invisible duration 0 .. 12 h.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

from halfmoon.broker.clock import Clock
from halfmoon.broker.consumption import (
    REQUEUED_VISIBLE_AT,
    InFlight,
    QueueConsumption,
    TopicConsumption,
)
from halfmoon.broker.filter import MessageFilter
from halfmoon.broker.message import MessageView, Received
from halfmoon.broker.pop_journal import WAIT_TIMEOUT_S, PopJournal
from halfmoon.broker.pop_receive import DEAD_LETTER_RETRY_MS, PopReceiver
from halfmoon.broker.pop_state import (
    PopGroupSettings,
    PopStates,
    default_hot_data_bytes,
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
from halfmoon.store.api import Store
from halfmoon.store.message import StoredMessage

log = logging.getLogger(__name__)

DeadLetter = Callable[[str, StoredMessage, int], None]

__all__ = [
    "DEAD_LETTER_RETRY_MS",
    "DeadLetter",
    "PopGroupSettings",
    "PopService",
    "default_hot_data_bytes",
]


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


_DONE = _done()  # nothing to wait for: no journal, or nothing acked


def _acks_failed(results: list[Exception | None], error: Exception) -> list[Exception | None]:
    """A batch whose ack record failed to become durable: every ack it held answers ``error``
    (the acks stay applied in memory; a restart may deliver those messages again)."""
    return [error if result is None else result for result in results]


def _nothing_in_flight(group: str, topic: str) -> InvalidReceiptHandle:
    return InvalidReceiptHandle(
        f"group {group!r} has nothing in flight on topic {topic!r}: "
        "the handle is from another group or its delivery is over"
    )


class PopService:
    """Pop deliveries from a :class:`~halfmoon.broker.pop_state.PopStates` table it holds:
    receives through its :class:`~halfmoon.broker.pop_receive.PopReceiver`, acks and the
    rest here."""

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
        self.states = PopStates(
            store,
            clock,
            topic_queues=topic_queues,
            group_settings=group_settings,
            state_path=state_path,
            hot_data_bytes=hot_data_bytes,
            journal=journal,
        )
        self._dead_letter = dead_letter
        self._revive = ReviveQueue(
            self.states.table,
            lambda group: self.states.group_settings(group).max_delivery_attempts,
            self.states.read,
            self._send_to_dead_letter,
            lambda: next(self.states.epochs),
            retry_ms=DEAD_LETTER_RETRY_MS,
        )
        for state in self.states.table.values():  # restored from the snapshot
            self._revive.watch_restored(state)
        self._receiver = PopReceiver(
            self.states,
            self._revive,
            self._send_to_dead_letter,
            min_receive_invisible_ms=min_receive_invisible_ms,
            priority_order=priority_order,
        )
        self.trace: TraceRecorder | None = None  # acks and changes of invisibility

    # -- the state table (pop_state.py) ---------------------------------------

    def subscribe(self, group: str, topic: str) -> None:
        self.states.subscribe(group, topic)

    def next_wakeup_ms(self, group: str, topic: str) -> int | None:
        return self.states.next_wakeup_ms(group, topic)

    def progress(self, group: str, topic: str) -> list[tuple[int, int, int, int]]:
        return self.states.progress(group, topic)

    def retrying(self, group: str, topic: str) -> dict[int, int]:
        return self.states.retrying(group, topic)

    def ready(self, group: str, topic: str) -> dict[int, int]:
        return self.states.ready(group, topic)

    def drop_group(self, group: str) -> None:
        self.states.drop_group(group)

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.states.reset(group, topic, queue_id, offset)

    def snapshot(self) -> None:
        self.states.snapshot()

    def close(self) -> None:
        self.states.close()

    # -- receive (pop_receive.py) ---------------------------------------------

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
        return self._receiver.receive(
            group, topic, matcher, batch_size, invisible_ms, queue_id, holder
        )

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
        return self._receiver.receive_nowait(
            group, topic, matcher, batch_size, invisible_ms, queue_id, holder
        )

    # -- holders ---------------------------------------------------------------

    def holders(self) -> frozenset[str]:
        """Who has held deliveries in flight here (maybe none left) since last released."""
        return frozenset(self.states.holders)

    def release_held(self, holder: str) -> int:
        """Every delivery ``holder`` holds visible again now (its holder ended); how many."""
        return self.states.release(holder)

    def _unhold(self, state: TopicConsumption, queue_id: int, offset: int, entry: InFlight) -> None:
        """A held delivery hidden anew (a requeue): held by nobody now, and journaled so, or a
        restart would hide it again while its holder lives."""
        if not entry.holder:
            return
        entry.holder = ""
        if self.states.journal is not None:
            self.states.journal.record_entries(
                state.group, state.topic, {queue_id: [entry.journaled(offset)]}
            )

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
            if self.states.journal is not None:
                end = self.states.journal.record_acks(
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
        assert self.states.journal is not None
        self.states.journal.wait(end)

    def ack_many(self, group: str, topic: str, handles: list[str]) -> list[Exception | None]:
        """Ack every handle under one hold of the group's lock: per handle None (acked) or the
        error :meth:`ack` would have raised. With a journal, one record for the batch, waited
        for once: an error of that wait (e.g. NOT_ENOUGH_REPLICAS) is every acked handle's
        result."""
        batch = self._ack_batch(group, topic, handles, blocking=True)
        assert batch is not None  # a blocking call always gets the lock
        results, durable = batch
        try:
            durable.result(WAIT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the batch's answer: every ack it held
            return _acks_failed(results, exc)
        return results

    def ack_many_nowait(
        self, group: str, topic: str, handles: list[str]
    ) -> tuple[list[Exception | None], Future[None]] | None:
        """:meth:`ack_many` without blocking, so an event loop may call it: None at once when
        the group's lock is busy (nothing acked). Else the per-handle results and a future
        that completes once the batch's ack record is durable as the store acknowledges
        writes (at once without a journal); an ack answers only then
        (every acked handle then answers its error)."""
        return self._ack_batch(group, topic, handles, blocking=False)

    def _ack_batch(
        self, group: str, topic: str, handles: list[str], blocking: bool
    ) -> tuple[list[Exception | None], Future[None]] | None:
        results: list[Exception | None] = [None] * len(handles)
        receipts: list[tuple[int, ReceiptHandle]] = []
        for index, handle in enumerate(handles):
            try:
                receipts.append((index, self._decode(topic, handle)))
            except InvalidReceiptHandle as exc:
                results[index] = exc
        if not receipts:
            return results, _DONE
        state = self.states.table.get((group, topic))
        if state is None:
            error = _nothing_in_flight(group, topic)
            return [error if r is None else r for r in results], _DONE
        if not state.lock.acquire(blocking):
            return None
        acked: list[InFlight] = []
        acked_offsets: dict[int, list[int]] = {}
        durable = _DONE
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
            if self.states.journal is not None and acked_offsets:
                end = self.states.journal.record_acks(group, topic, acked_offsets)
                durable = self.states.journal.durable(end)
        finally:
            state.lock.release()
        if self.trace is not None:
            for entry in acked:
                self.trace.record(
                    position_key(entry.commit_log_offset), topic, "acked",
                    group=group, attempt=entry.attempt,
                )  # fmt: skip
        return results, durable

    def change_invisible_duration(
        self, group: str, topic: str, handle: str, invisible_ms: int
    ) -> str:
        """Hide the message ``invisible_ms`` from now; returns the new handle (the old one dies).
        0 requeues it: visible at once, in its place (``REQUEUED_VISIBLE_AT``)."""
        check_invisible_ms(invisible_ms, MIN_CHANGE_INVISIBLE_MS)
        receipt = self._decode(topic, handle)
        state = self._state_for_handle(group, topic)
        max_attempts = self.states.group_settings(group).max_delivery_attempts
        with state.lock:
            queue, entry = self._in_flight(state, receipt)
            visible_at = (
                self.states.clock.now_ms() + invisible_ms if invisible_ms else REQUEUED_VISIBLE_AT
            )
            epoch = next(self.states.epochs)
            queue.hide(receipt.queue_offset, visible_at, epoch)
            self._unhold(state, receipt.queue_id, receipt.queue_offset, entry)
            if entry.attempt >= max_attempts:
                self._watch(state, receipt.queue_id, receipt.queue_offset, entry)
            state.dirty = True
            if self.trace is not None:
                self.trace.record(
                    position_key(entry.commit_log_offset), topic, "invisible_changed",
                    group=group, attempt=entry.attempt, invisible_ms=invisible_ms,
                )  # fmt: skip
            return self.states.codec.encode(
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
            stored = self.states.read(topic, receipt.queue_id, receipt.queue_offset)
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
                stack.enter_context(self.states.state(group, topic).lock)
            yield

    def holds(self, group: str, topic: str, queue_id: int, offset: int, epoch: int) -> bool:
        """Whether that delivery is still in flight under ``epoch``; inside :meth:`locked`."""
        state = self.states.table.get((group, topic))
        queue = state.queues.get(queue_id) if state is not None else None
        entry = queue.inflight.get(offset) if queue is not None else None
        return entry is not None and entry.epoch == epoch

    def complete_delivery(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Consume a delivery :meth:`holds` vouched for; inside :meth:`locked`."""
        state = self.states.table[(group, topic)]
        state.queues[queue_id].complete(offset)
        state.dirty = True

    def hide_delivery(
        self, group: str, topic: str, queue_id: int, offset: int, delay_ms: int, *, locked: bool
    ) -> None:
        """Make a delivery visible again ``delay_ms`` from now (a reject); a delivery no longer in
        flight is left alone. ``locked``: the caller is inside :meth:`locked`."""
        state = self.states.state(group, topic)
        with nullcontext() if locked else state.lock:
            queue = state.queues.get(queue_id)
            entry = queue.inflight.get(offset) if queue is not None else None
            if queue is None or entry is None:
                return
            queue.hide(offset, self.states.clock.now_ms() + delay_ms, next(self.states.epochs))
            self._unhold(state, queue_id, offset, entry)
            if entry.attempt >= self.states.group_settings(group).max_delivery_attempts:
                self._watch(state, queue_id, offset, entry)
            state.dirty = True

    def replay_done(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Recovery: ``offset`` was consumed by a commit the state file may predate. Idempotent:
        done already is a no-op, in flight completes it, past the cursor it is marked done ahead
        (never delivered)."""
        state = self.states.state(group, topic)
        with state.lock:
            self.states.ensure_queues(
                state, self.states.topic_queues(topic), self.states.group_settings(group)
            )
            queue = state.queues.get(queue_id)
            if queue is None:
                queue = state.queues[queue_id] = QueueConsumption(offset)
            queue.mark_done(offset)
            state.dirty = True

    def read(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The stored message at ``offset`` (None when retention removed it)."""
        return self.states.read(topic, queue_id, offset)

    def handle_topic(self, handle: str) -> str:
        """The topic a receipt handle of this service names (InvalidReceiptHandle if garbled)."""
        return self.states.codec.decode(handle).topic

    def _decode(self, topic: str, handle: str) -> ReceiptHandle:
        receipt = self.states.codec.decode(handle)
        if receipt.topic != topic:
            raise InvalidReceiptHandle(
                f"the receipt handle is not one of topic {topic!r}; "
                "use the topic the message was received from"
            )
        return receipt

    def _state_for_handle(self, group: str, topic: str) -> TopicConsumption:
        state = self.states.table.get((group, topic))
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
