"""The in-process broker: the :class:`~halfmoon.broker.facade.Broker` facade over a store.

Every operation is documented once, on the facade (:mod:`facade`). Plain
synchronous objects over a :class:`~halfmoon.store.api.Store`: topics and
groups (:mod:`topics`, :mod:`groups`), the send path (:mod:`produce`), delay
messages (:mod:`timer`), pop consumption (:mod:`pop`), pull with committed
offsets (:mod:`offsets`), operators' reads (:mod:`browse`), and the status
page (:mod:`stats`).
Time comes from the injected clock; background work happens only in
:meth:`Broker.tick`, which the server calls every ~100 ms from one thread.
The broker does not own the store: close the store after the broker.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import halfmoon.broker.browse as browse
from halfmoon.broker.clock import Clock, SystemClock
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.errors import (
    IllegalOffset,
    IllegalQueueId,
    IllegalTopic,
    OffsetNotFound,
    PermissionDenied,
    TopicExists,
    TopicNotFound,
)
from halfmoon.broker.facade import PullResult, QueueProgress, QueueRoute, QueueStatus, Written
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.groups import GroupConfig, GroupRegistry, RetryPolicy
from halfmoon.broker.lite import LiteTopics, OffsetOption, UnsubscribeNotifier
from halfmoon.broker.lite_names import parent_topic_of, split_lite_queue_topic
from halfmoon.broker.message import (
    PROPERTY_DELIVERY_ATTEMPT,
    PROPERTY_DELIVERY_TIME,
    PROPERTY_DLQ_ORIGIN_GROUP,
    PROPERTY_ORIGIN_MESSAGE_ID,
    MessageType,
    MessageView,
    OutgoingMessage,
)
from halfmoon.broker.offsets import OffsetTable
from halfmoon.broker.pop import PopGroupSettings, PopService, default_hot_data_bytes
from halfmoon.broker.priority import scan_order
from halfmoon.broker.produce import SendResult, plan_send
from halfmoon.broker.queue_select import QueueSelector
from halfmoon.broker.recall import RecallHandle, check_handle
from halfmoon.broker.recall import encode as encode_recall_handle
from halfmoon.broker.statistics import TrafficRow, TrafficStatistics
from halfmoon.broker.stats import BrokerStatus, RateCounter
from halfmoon.broker.timer import DelayTimer
from halfmoon.broker.topics import (
    TIMER_TOPIC,
    TopicConfig,
    TopicRegistry,
    is_internal_topic,
    is_reserved,
)
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactional_consume import TransactionalConsume
from halfmoon.broker.transactions import (
    CheckSender,
    CheckService,
    EndResult,
    TransactionConfig,
    TransactionInfo,
    TransactionService,
    TransactionStats,
)
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import AppendResult, GetStatus, Store, StoreStats
from halfmoon.store.message import Message, StoredMessage

log = logging.getLogger(__name__)

MAX_PULL_BATCH = 1024
_DRAINED_CHECK_INTERVAL_MS = 60_000
# Re-exported: the facade's result types used to live here.
__all__ = ["Broker", "PullResult", "QueueProgress", "QueueRoute", "QueueStatus"]


def _completed() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


# What a write that needs no flush waits for (nothing written, or nothing to append).
_DURABLE = _completed()


class Broker:
    def __init__(
        self,
        store: Store,
        metadata_dir: Path | None,
        config: BrokerConfig | None = None,
        clock: Clock | None = None,
        transaction_config: TransactionConfig | None = None,
    ) -> None:
        self.store = store
        self.config = config = config if config is not None else BrokerConfig()
        self.clock = clock = clock if clock is not None else SystemClock()
        if metadata_dir is not None:
            metadata_dir.mkdir(parents=True, exist_ok=True)
        self._started_ms = clock.now_ms()
        self.topics = TopicRegistry(metadata_dir, clock.now_ms)
        self.groups = GroupRegistry(metadata_dir, clock.now_ms)
        self.offsets = OffsetTable(metadata_dir, config.offset_persist_interval_ms)
        self._selector = QueueSelector()
        self._filters = FilterCache()
        self._in = RateCounter(clock.now_ms)
        self._out = RateCounter(clock.now_ms)
        self.statistics = TrafficStatistics(clock.now_ms)  # per topic/group, 24 h
        self._listeners: list[Callable[[str, int], None]] = []
        self._tick_lock = threading.Lock()
        self._last_snapshot_ms = self._last_drained_check_ms = self._started_ms
        self.timer = DelayTimer(
            store,
            metadata_dir,
            self._delay_route,
            window_ms=config.timer_window_ms,
            max_heap=config.timer_max_heap,
            persist_interval_ms=config.offset_persist_interval_ms,
        )
        self._pop = PopService(
            store,
            clock,
            topic_queues=self._readable_queue_ids,
            group_settings=self._pop_settings,
            dead_letter=self._dead_letter,
            state_path=metadata_dir / "consumption.json" if metadata_dir is not None else None,
            hot_data_bytes=config.hot_data_bytes or default_hot_data_bytes(),
            min_receive_invisible_ms=config.min_receive_invisible_ms,
            priority_order=self._is_priority_topic,
        )
        # Lite topics (RIP-83): subscriptions and a pop service over their queues.
        self.lite = LiteTopics(
            store,
            clock,
            config,
            metadata_dir,
            max_delivery_attempts=lambda group: self.get_group(group).max_delivery_attempts,
            dead_letter=self._dead_letter,
        )
        txn_config = transaction_config if transaction_config is not None else TransactionConfig()
        self.transactions = TransactionService(store, metadata_dir, txn_config, clock)
        self._checks = CheckService(self.transactions, txn_config, self._started_ms)
        # Acks, rejects and offset commits decided with a transaction group.
        self.consuming = TransactionalConsume(
            store,
            self._pop,
            self.offsets,
            self.transactions,
            metadata_dir,
            dead_letter_copy=self._dead_letter_copy,
            retry_delay_ms=lambda group, attempt: self.get_group(
                group
            ).retry_policy.delay_for_attempt(attempt),
            check_queue=self._check_offset,
        )
        self.consuming.recover()
        store.add_listener(self._on_append)

    # -- lifecycle ---------------------------------------------------------------
    def close(self) -> None:
        """Persist metadata, offsets, timer progress and consumption state."""
        with self._tick_lock:
            self.timer.persist()
            self.consuming.persist(self._write_consumption_state)
            self.lite.close()
            self.transactions.close()
            self.topics.close()
            self.groups.close()

    def tick(self) -> bool:
        with self._tick_lock:
            now = self.clock.now_ms()
            self.timer.tick(now)
            self._pop.revive(now)  # dead-letter expired last deliveries (broker/revive.py)
            self._checks.tick(now)
            self.lite.tick(now)
            self.transactions.maybe_snapshot(now)
            if now - self._last_snapshot_ms >= self.config.offset_persist_interval_ms:
                self._last_snapshot_ms = now
                # Offsets and pop state together, with the transactional-commit marker
                # (transactional_consume.py).
                self.consuming.persist(self._write_consumption_state)
            if now - self._last_drained_check_ms >= _DRAINED_CHECK_INTERVAL_MS:
                self._last_drained_check_ms = now
                for topic in self.topics.all():
                    if topic.read_queue_count > topic.queue_count:
                        self.topics.drop_drained_queues(
                            topic.name, self._queue_has_messages(topic.name)
                        )
            return self._checks.scanning

    def _write_consumption_state(self) -> None:
        self.offsets.persist()
        self._pop.snapshot()

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        fields = {f.name for f in dataclasses.fields(BrokerConfig)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise InvalidArgument(f"no broker setting {', '.join(map(repr, unknown))}")
        for name, value in changes.items():
            setattr(self.config, name, value)
        return self.config

    # -- topics ------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = 8,
        perm: str = "rw",
    ) -> TopicConfig:
        return self.topics.create(name, message_type, queue_count, perm)

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
    ) -> TopicConfig:
        return self.topics.update(
            name,
            queue_count=queue_count,
            perm=perm,
            message_type=message_type,
            has_messages=self._queue_has_messages(name),
        )

    def delete_topic(self, name: str) -> None:
        deleted = self.topics.delete(name)
        if deleted.message_type is MessageType.LITE:
            self.lite.delete_parent(name)
        self.store.delete_topic(name)
        self.offsets.forget(topic=name)
        self._selector.forget(name)

    def get_topic(self, name: str) -> TopicConfig:
        topic = self.topics.find(name)
        if topic is not None:
            return topic
        if not self.config.auto_create_topics or is_reserved(name):
            raise TopicNotFound(name)
        try:
            return self.topics.create(name, MessageType.MIXED, self.config.default_queue_count)
        except TopicExists:
            return self.topics.get(name)

    def find_topic(self, name: str) -> TopicConfig | None:
        return self.topics.find(name)

    def list_topics(self) -> list[TopicConfig]:
        return [t for t in self.topics.all() if not is_internal_topic(t.name)]

    def topic_status(self, name: str) -> list[QueueStatus]:
        topic = self.get_topic(name)
        statuses = []
        for queue_id in topic.readable_queues():
            low = self.store.min_offset(name, queue_id)
            high = self.store.max_offset(name, queue_id)
            last = None
            if high > low:
                got = self.store.get(name, queue_id, high - 1, max_messages=1)
                last = got.messages[0].store_timestamp if got.messages else None
            statuses.append(
                QueueStatus(name, queue_id, low, high, last, topic.queue_perm(queue_id))
            )
        return statuses

    # -- groups ------------------------------------------------------------------
    def create_group(
        self,
        name: str,
        *,
        fifo: bool = False,
        max_delivery_attempts: int = 17,
        retry_policy: RetryPolicy | None = None,
        consume_from: str | None = None,
        consume_enabled: bool = True,
        broadcast: bool = False,
    ) -> GroupConfig:
        return self.groups.create(
            name,
            fifo=fifo,
            max_delivery_attempts=max_delivery_attempts,
            retry_policy=retry_policy,
            consume_from=consume_from or self.config.default_consume_from,
            consume_enabled=consume_enabled,
            broadcast=broadcast,
        )

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        return self.groups.update(name, **changes)

    def delete_group(self, name: str) -> None:
        self.groups.delete(name)
        self.offsets.forget(group=name)
        self._pop.drop_group(name)
        self.lite.drop_group(name)

    def get_group(self, name: str) -> GroupConfig:
        return self.groups.get(
            name,
            auto_create=self.config.auto_create_groups,
            consume_from=self.config.default_consume_from,
        )

    def find_group(self, name: str) -> GroupConfig | None:
        return self.groups.find(name)

    def list_groups(self) -> list[GroupConfig]:
        return self.groups.all()

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        self.groups.get(group)
        names = [topic] if topic is not None else [t.name for t in self.list_topics()]
        pulled = self.offsets.of_group(group, topic)
        out = []
        for name in names:
            seen: dict[int, tuple[int, int]] = {
                queue_id: (committed, inflight)
                for queue_id, committed, _cursor, inflight in self._pop.progress(group, name)
            }
            for (t, queue_id), committed in pulled.items():
                if t == name and queue_id not in seen:
                    seen[queue_id] = (committed, 0)
            for queue_id, (committed, inflight) in sorted(seen.items()):
                high = self.store.max_offset(name, queue_id)
                out.append(
                    QueueProgress(
                        group, name, queue_id, committed, high, max(0, high - committed), inflight
                    )
                )
        return out

    # -- produce -----------------------------------------------------------------
    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        written = self.send_nowait(messages)
        written.durable.result()
        return written.result

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Written[list[SendResult]]:
        results = self._send(messages)
        if not results:
            return Written(results, _DURABLE)
        return Written(results, self.store.durable(max(r.end_offset for r in results)))

    def sends_cheaply(self, messages: Sequence[OutgoingMessage]) -> bool:
        find = self.topics.find
        pending = self.transactions.group_pending
        return all(
            find(m.topic) is not None
            and (
                m.message_type is not MessageType.TRANSACTION
                or m.transaction_group is None
                or pending(m.transaction_group)  # a known open group: no index lookup
            )
            for m in messages
        )

    def _send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        if not messages:
            return []
        planned = plan_send(
            list(messages), self.get_topic, self._selector, self.config, self.clock.now_ms()
        )
        for p in planned:
            lite = split_lite_queue_topic(p.record.topic)
            if lite is not None:
                self.lite.reserve(*lite)
        transaction_ids: list[str | None] = [None] * len(planned)
        if any(m.message_type is MessageType.TRANSACTION for m in messages):
            appended, transaction_ids = self.transactions.append(
                messages, planned
            )  # halves: invisible
        else:
            appended = self.store.append([p.record for p in planned])
        self._in.add(len(planned))
        self.statistics.record_in(p.topic for p in planned)
        return [
            SendResult(
                message_id=p.message_id,
                topic=p.topic,
                queue_id=p.queue_id,
                queue_offset=-1
                if p.delayed
                else r.queue_offset,  # a half message: its half-queue offset
                commit_log_offset=r.commit_log_offset,
                end_offset=r.end_offset,
                transaction_id=txn,
                recall_handle=self._recall_handle(p.topic, p.message_id, p.record, r)
                if p.delayed and r.topic == TIMER_TOPIC
                else None,
            )
            for p, r, txn in zip(planned, appended, transaction_ids, strict=True)
        ]

    # -- recall (halfmoon/broker/recall.py) ------------------------------------------
    def recall(self, topic: str, recall_handle: str) -> str:
        self.get_topic(topic)
        handle = check_handle(recall_handle, topic, self.config.name, self.store)
        self.timer.cancel(handle.timer_key, handle.message_id)
        return handle.message_id

    def _recall_handle(
        self, topic: str, message_id: str, record: Message, appended: AppendResult
    ) -> str:
        due = int(record.properties[PROPERTY_DELIVERY_TIME])
        handle = RecallHandle(
            self.config.name,
            topic,
            appended.queue_offset,
            appended.commit_log_offset,
            due,
            message_id,
        )
        return encode_recall_handle(handle)

    # -- transactions (halfmoon/broker/transactions) -------------------------------
    def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> TxnState:
        written = self.end_transaction_nowait(
            topic, message_id, transaction_id, resolution, source, producer_group
        )
        written.durable.result()
        return written.result.state

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> Written[EndResult]:
        result = self.transactions.end(
            transaction_id, resolution, source, message_id=message_id, topic=topic
        )
        return Written(result, self._durable(result.end_offset))

    def transaction_ends_cheaply(self, transaction_id: str) -> bool:
        return self.transactions.ends_cheaply(transaction_id)

    def end_transaction_group(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> int:
        written = self.end_transaction_group_nowait(group_id, resolution, source, consume_actions)
        written.durable.result()
        return written.result

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> Written[int]:
        if consume_actions is None and not self.consuming.holds_actions(group_id):
            count, end_offset = self.transactions.end_group(group_id, resolution, source)
            return Written(count, self._durable(end_offset))
        ended = self.consuming.end(group_id, resolution, source, consume_actions)
        for topic in ended.topics:  # acks free FIFO queues, rejects change wake-up times
            self._notify(topic)
        return Written(ended.members, self._durable(ended.end_offset))

    # -- transactional consumption (halfmoon/broker/transactional_consume.py) -------------
    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        self._check_transactional(group, topic)
        self.consuming.ack(transaction_group, group, topic, receipt_handle)

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        self._check_transactional(group, topic)
        if dead_letter:
            self.consuming.dead_letter(transaction_group, group, topic, receipt_handle)
        else:
            self.consuming.nack(transaction_group, group, topic, receipt_handle, delay_ms)

    def transactional_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        self.consuming.commit_offset(transaction_group, group, topic, queue_id, offset, expected)

    def _check_transactional(self, group: str, topic: str) -> None:
        if self._check_consumable(group, topic).message_type is MessageType.LITE:
            raise InvalidArgument(
                f"{topic!r} is a lite topic: its acks cannot join a transaction (ack it plainly)"
            )

    def _notify(self, topic: str) -> None:
        for queue_id in self._readable_queue_ids(topic):
            for callback in list(self._listeners):
                try:
                    callback(topic, queue_id)
                except Exception:
                    log.exception("arrival listener failed")

    def _durable(self, end_offset: int) -> Future[None]:
        return self.store.durable(end_offset) if end_offset else _DURABLE

    def list_transactions(
        self, topic: str | None = None, limit: int = 1000
    ) -> list[TransactionInfo]:
        return self.transactions.list(topic=topic, limit=limit)

    def parked_transactions(self, limit: int = 1000) -> list[TransactionInfo]:
        return self.transactions.list(state=TxnState.PARKED, limit=limit)

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        return self.transactions.resume(transaction_id)

    def set_check_sender(self, sender: CheckSender | None) -> None:
        self._checks.set_sender(sender)

    def transaction_stats(self) -> TransactionStats:
        return self.transactions.stats()

    # -- pop ---------------------------------------------------------------------
    def receive(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
    ) -> list[MessageView]:
        config = self._check_consumable(group, topic)
        if queue_id is not None:
            self._check_queue(config, queue_id)
        compiled = self._filters.get(filter)
        invisible_ms = invisible_ms or self.config.default_invisible_ms
        if config.message_type is MessageType.LITE:  # the lite topics client_id subscribes to
            views = self.lite.receive(
                group, topic, client_id, compiled.compiled, batch_size, invisible_ms
            )
        else:
            views = self._pop.receive(
                group, topic, compiled.compiled, batch_size, invisible_ms, queue_id
            )
        self._out.add(len(views))
        self.statistics.record_out(group, topic, len(views))
        return views

    def subscribe(self, group: str, topic: str) -> None:
        """Fix a new group's start position in ``topic`` now (call when a consumer subscribes)."""
        if self._check_consumable(group, topic).message_type is not MessageType.LITE:
            self._pop.subscribe(group, topic)  # lite topics: SyncLiteSubscription says what

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        if self._is_lite(topic, lite_topic):
            self.lite.ack(group, topic, lite_topic, receipt_handle)
        else:
            self._pop.ack(group, topic, receipt_handle)

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        if self._is_lite(topic, lite_topic):
            return self.lite.change_invisible_duration(
                group, topic, lite_topic, receipt_handle, invisible_ms
            )
        return self._pop.change_invisible_duration(group, topic, receipt_handle, invisible_ms)

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        if self._is_lite(topic, lite_topic):
            self.lite.forward_to_dead_letter(group, topic, lite_topic, receipt_handle)
        else:
            self._pop.forward_to_dead_letter(group, topic, receipt_handle)

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        config = self.topics.find(topic)
        if config is not None and config.message_type is MessageType.LITE:
            return self.lite.next_wakeup_ms(group, topic, client_id)
        return self._pop.next_wakeup_ms(group, topic)

    # -- lite topics (halfmoon/broker/lite.py) -------------------------------------
    def sync_lite_subscription(
        self,
        client_id: str,
        group: str,
        topic: str,
        action: str,
        lite_topics: Sequence[str],
        offset: OffsetOption | None = None,
    ) -> list[str]:
        """Apply a consumer's SyncLiteSubscription; returns its lite topics afterwards."""
        self._lite_parent(topic)
        if action in ("partial_add", "complete_add"):
            self._check_consumable(group, topic)
        return self.lite.sync(client_id, group, topic, action, lite_topics, offset)

    def client_terminated(self, client_id: str) -> None:
        self.lite.remove_client(client_id)

    def lite_subscriptions(self, topic: str) -> list[dict[str, object]]:
        self._lite_parent(topic)
        return self.lite.subscriptions(topic)

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        self.lite.set_notifier(notifier)

    def list_lite_topics(self, topic: str) -> list[dict[str, object]]:
        self._lite_parent(topic)
        return self.lite.lite_topics(topic)

    def delete_lite_topic(self, topic: str, lite_topic: str) -> int:
        """Delete a lite topic; its subscribers are told (NotifyUnsubscribeLite).

        Returns how many were told.
        """
        self._lite_parent(topic)
        return self.lite.delete(topic, lite_topic)

    def _lite_parent(self, topic: str) -> TopicConfig:
        config = self.get_topic(topic)
        if config.message_type is not MessageType.LITE:
            raise IllegalTopic(
                f"topic {topic!r} is a {config.message_type.value} topic, not a lite topic; "
                "create the parent with type lite"
            )
        return config

    def _is_lite(self, topic: str, lite_topic: str | None) -> bool:
        """Whether ``topic`` is a lite parent (then ``lite_topic`` names the queue; required)."""
        config = self.topics.find(topic)
        return config is not None and config.message_type is MessageType.LITE

    # -- pull --------------------------------------------------------------------
    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        config = self._check_consumable(group, topic)
        self._check_queue(config, queue_id)
        if offset < 0:
            raise IllegalOffset(f"offset must be >= 0, got {offset}")
        if not 1 <= batch_size <= MAX_PULL_BATCH:
            raise InvalidArgument(f"batch size must be 1 to {MAX_PULL_BATCH}, got {batch_size}")
        compiled = self._filters.get(filter)
        got = self.store.get(
            topic,
            queue_id,
            offset,
            batch_size,
            tag_hashes=compiled.tag_hashes,
            predicate=compiled.predicate,
        )
        status = got.status
        if status is GetStatus.NO_SUCH_QUEUE:  # a queue of a known topic that has no data yet
            status = GetStatus.NO_MESSAGE if offset == 0 else GetStatus.OFFSET_OVERFLOW
        views = [MessageView.of(m) for m in got.messages]
        self._out.add(len(views))
        self.statistics.record_out(group, topic, len(views))
        return PullResult(status, views, got.next_offset, got.min_offset, got.max_offset)

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        self.get_group(group)
        self._check_queue(self.get_topic(topic), queue_id)
        offset = self.offsets.get(group, topic, queue_id)
        if offset is None:
            raise OffsetNotFound(
                f"group {group!r} has no committed offset for {topic!r} queue {queue_id}; "
                "start with query_offset"
            )
        return offset

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._check_offset(group, topic, queue_id, offset)
        self.offsets.set(group, topic, queue_id, offset)

    def _check_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.get_group(group)
        self._check_queue(self.get_topic(topic), queue_id)
        high = self.store.max_offset(topic, queue_id)
        if not 0 <= offset <= high:
            raise IllegalOffset(
                f"offset {offset} is outside queue {queue_id} of {topic!r} (0 to {high})"
            )

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        self._check_queue(self.get_topic(topic), queue_id)
        if policy == "beginning":
            return self.store.min_offset(topic, queue_id)
        if policy == "end":
            return self.store.max_offset(topic, queue_id)
        if policy == "timestamp":
            if timestamp is None:
                raise InvalidArgument("query_offset by timestamp needs a timestamp")
            return self.store.offset_for_timestamp(topic, queue_id, timestamp)
        raise InvalidArgument(f"unknown offset policy {policy!r}: use beginning, end or timestamp")

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        self.get_group(group)
        config = self.get_topic(topic)
        offsets = {}
        for queue_id in config.readable_queues():
            offset = self.store.offset_for_timestamp(topic, queue_id, timestamp)
            offsets[queue_id] = offset
            self.offsets.set(group, topic, queue_id, offset)
            self._pop.reset(group, topic, queue_id, offset)
        return offsets

    # -- reading stored messages (halfmoon/broker/browse.py) ------------------------
    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        topics = self.list_topics() if topic is None else [self._existing_topic(topic)]
        return browse.by_id(self.store, topics, message_id, topic)

    def messages_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int
    ) -> list[MessageView]:
        config = self._existing_topic(topic)
        return browse.by_key(self.store, config, key, begin_ms, end_ms, limit)

    def message_at(self, topic: str, queue_id: int, offset: int) -> MessageView:
        return browse.at(self.store, self._existing_topic(topic), queue_id, offset)

    def scan(
        self,
        topic: str,
        queue_id: int | None,
        offset: int | None,
        begin_ms: int,
        end_ms: int,
        limit: int,
        filter: FilterSpec,
        with_messages: bool = True,
    ) -> browse.ScanResult:
        config, compiled = self._existing_topic(topic), self._filters.get(filter)
        return browse.scan(
            self.store, config, queue_id, offset, begin_ms, end_ms, limit, compiled, with_messages
        )

    def _existing_topic(self, name: str) -> TopicConfig:
        # Unlike get_topic, never auto-create what an operator only looks at.
        topic = self.topics.find(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    # -- routes, notifications, status -------------------------------------------
    def route(self, topic: str) -> list[QueueRoute]:
        config = self.get_topic(topic)
        accepted = config.accepted_types()
        return [
            QueueRoute(topic, q, config.queue_perm(q), list(accepted))
            for q in config.readable_queues()
        ]

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self._listeners.append(callback)

    def store_stats(self) -> StoreStats:
        return self.store.stats()

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        return self.statistics.rows(topic=topic, group=group)

    def status(self) -> BrokerStatus:
        stats = self.store.stats()
        return BrokerStatus(
            name=self.config.name,
            uptime_ms=self.clock.now_ms() - self._started_ms,
            topics=len(self.list_topics()),
            groups=len(self.groups.all()),
            queues=stats.queues,
            messages_in_total=self._in.total,
            messages_out_total=self._out.total,
            tps_in=self._in.per_second(),
            tps_out=self._out.per_second(),
            disk_bytes=stats.disk_bytes,
            commit_log_min_offset=stats.commit_log_min_offset,
            commit_log_max_offset=stats.commit_log_max_offset,
            commit_log_flushed_offset=stats.commit_log_flushed_offset,
            pending_delay_messages=self.timer.pending,
        )

    # -- internals -----------------------------------------------------------------
    def _check_consumable(self, group: str, topic: str) -> TopicConfig:
        config = self.get_topic(topic)
        if not config.readable:
            raise PermissionDenied(f"topic {topic!r} is not readable (perm {config.perm!r})")
        if is_internal_topic(config.name):
            raise PermissionDenied(f"topic {topic!r} is internal to the broker")
        if not self.get_group(group).consume_enabled:
            raise PermissionDenied(f"consumer group {group!r} has consuming disabled")
        return config

    @staticmethod
    def _check_queue(config: TopicConfig, queue_id: int) -> None:
        if queue_id not in config.readable_queues():
            raise IllegalQueueId(
                f"topic {config.name!r} has no queue {queue_id} "
                f"(0 to {len(config.readable_queues()) - 1})"
            )

    def _queue_has_messages(self, topic: str) -> Callable[[int], bool]:
        return lambda q: self.store.max_offset(topic, q) > self.store.min_offset(topic, q)

    def _readable_queue_ids(self, topic: str) -> list[int]:
        config = self.topics.find(topic)
        if config is None or not config.readable:
            return []
        if config.message_type is MessageType.PRIORITY:
            return scan_order(list(config.readable_queues()))
        return list(config.readable_queues())

    def _is_priority_topic(self, topic: str) -> bool:
        config = self.topics.find(topic)
        return config is not None and config.message_type is MessageType.PRIORITY

    def _pop_settings(self, group: str) -> PopGroupSettings:
        config = self.get_group(group)
        return PopGroupSettings(config.fifo, config.max_delivery_attempts, config.consume_from)

    def _dead_letter(self, group: str, stored: StoredMessage, attempts: int) -> None:
        """Copy a message that failed ``attempts`` times into ``%DLQ%<group>`` (durably)."""
        self.store.put([self._dead_letter_copy(group, stored, attempts)])

    def _dead_letter_copy(self, group: str, stored: StoredMessage, attempts: int) -> Message:
        """The record of ``stored`` in ``%DLQ%<group>`` (the topic is created if needed)."""
        topic = self.topics.ensure_dead_letter_topic(group)
        props = dict(stored.properties)
        props[PROPERTY_DLQ_ORIGIN_GROUP] = group
        props[PROPERTY_DELIVERY_ATTEMPT] = str(attempts)
        if stored.unique_id:
            props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, stored.unique_id)
        return Message(
            topic=topic.name,
            body=stored.body,
            queue_id=0,
            properties=props,
            flags=stored.flags,
            born_timestamp=stored.born_timestamp,
            born_host=stored.born_host,
            reconsume_times=attempts,
        )

    def _delay_route(self, topic: str, queue_id: int) -> int | None:
        config = self.topics.find(topic)
        if config is None:
            return None
        return queue_id if queue_id < config.queue_count else queue_id % config.queue_count

    def _on_append(self, result: AppendResult) -> None:
        if is_internal_topic(result.topic):
            return  # timer, half, op and parked records: no consumer waits on them
        topic = parent_topic_of(result.topic) or result.topic  # lite consumers wait on the parent
        for callback in list(self._listeners):
            try:
                callback(topic, result.queue_id)
            except Exception:
                log.exception("arrival listener failed")
