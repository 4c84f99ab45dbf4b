"""The in-process broker: the :class:`~halfmoon.broker.facade.Broker` facade over a store.

Every operation is documented once, on the facade (:mod:`facade`); this
class keeps a method for each and hands it to plain synchronous objects over
a :class:`~halfmoon.store.api.Store`: topics and groups (:mod:`topics`,
:mod:`groups`), the send path (:mod:`send_path`, :mod:`produce`), delay
messages (:mod:`timer`), pop consumption (:mod:`pop_router`, :mod:`pop`,
:mod:`lite`), pull with committed offsets (:mod:`pull`, :mod:`offsets`),
dead letters (:mod:`dead_letters`), operators' reads (:mod:`browse`), and
the status pages (:mod:`reports`, :mod:`stats`).
Time comes from the injected clock; background work happens only in
:meth:`Broker.tick`, which the server calls every ~100 ms from one thread.
The broker does not own the store: close the store after the broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import halfmoon.broker.browse as browse
import halfmoon.broker.reports as reports
from halfmoon.broker.access import check_consumable, routes
from halfmoon.broker.clock import Clock, SystemClock
from halfmoon.broker.config import BrokerConfig, apply_changes
from halfmoon.broker.dead_letters import dead_letter_copy, write_dead_letter
from halfmoon.broker.encoded import EncodedMessage
from halfmoon.broker.errors import (
    IllegalTopic,
    TopicExists,
    TopicNotFound,
)
from halfmoon.broker.facade import PullResult, QueueProgress, QueueRoute, QueueStatus, Written
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.groups import GroupConfig, GroupRegistry, RetryPolicy
from halfmoon.broker.lite import LiteTopics, OffsetOption, UnsubscribeNotifier
from halfmoon.broker.lite_names import parent_topic_of
from halfmoon.broker.message import (
    PROPERTY_REAL_TOPIC,
    MessageType,
    MessageView,
    OutgoingMessage,
    Received,
)
from halfmoon.broker.offset_journal import OffsetJournal
from halfmoon.broker.offsets import OffsetTable
from halfmoon.broker.pop import PopGroupSettings, PopService, default_hot_data_bytes
from halfmoon.broker.pop_journal import PopJournal
from halfmoon.broker.pop_router import PopRouter
from halfmoon.broker.produce import SendResult
from halfmoon.broker.pull import PullService
from halfmoon.broker.queue_select import QueueSelector
from halfmoon.broker.recall import check_handle
from halfmoon.broker.send_path import SendPath
from halfmoon.broker.statistics import TrafficRow, TrafficStatistics
from halfmoon.broker.stats import BrokerStatus, RateCounter
from halfmoon.broker.timer import DelayTimer
from halfmoon.broker.timer_journal import TimerJournal
from halfmoon.broker.topics import (
    TopicConfig,
    TopicRegistry,
    dead_letter_topic,
    is_internal_topic,
    is_reserved,
)
from halfmoon.broker.trace import TraceRecorder, position_key
from halfmoon.broker.transaction_operations import TransactionOperations
from halfmoon.broker.transactional_consume import TransactionalConsume
from halfmoon.broker.transactions import (
    CheckService,
    TransactionConfig,
    TransactionService,
)
from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.store.api import AppendResult, Store, StoreStats
from halfmoon.store.message import StoredMessage

log = logging.getLogger(__name__)

_DRAINED_CHECK_INTERVAL_MS = 60_000
# Re-exported: the facade's result types used to live here.
__all__ = ["Broker", "PullResult", "QueueProgress", "QueueRoute", "QueueStatus"]


class Broker(TransactionOperations):
    def __init__(
        self,
        store: Store,
        metadata_dir: Path | None,
        config: BrokerConfig | None = None,
        clock: Clock | None = None,
        transaction_config: TransactionConfig | None = None,
        *,
        journal_offsets: bool = False,
        admit_send: Callable[[], None] | None = None,
    ) -> None:
        """``journal_offsets``: committed offsets, pop consumers' positions and the delay
        timer's progress also go to the commit log (:mod:`offset_journal`,
        :mod:`pop_journal`, :mod:`timer_journal`), as a broker group's master needs.
        ``admit_send``: run before a send is written, raising to refuse it (a broker
        group's master short of in-sync replicas)."""
        self.store = store
        self.config = config = config if config is not None else BrokerConfig()
        self.clock = clock = clock if clock is not None else SystemClock()
        if metadata_dir is not None:
            metadata_dir.mkdir(parents=True, exist_ok=True)
        self._started_ms = clock.now_ms()
        self.topics = TopicRegistry(metadata_dir, clock.now_ms)
        self.groups = GroupRegistry(metadata_dir, clock.now_ms)
        self.offsets = OffsetTable(
            metadata_dir,
            config.offset_persist_interval_ms,
            OffsetJournal(store) if journal_offsets else None,
        )
        self._selector = QueueSelector()
        self._filters = FilterCache()
        self._in = RateCounter(clock.now_ms)
        self._out = RateCounter(clock.now_ms)
        self.statistics = TrafficStatistics(clock.now_ms)  # per topic/group, 24 h
        self._listeners: list[Callable[[str, int], None]] = []
        self._tick_lock = threading.Lock()
        self.trace = TraceRecorder(store, clock, self._traced)
        self._last_snapshot_ms = self._last_drained_check_ms = self._started_ms
        self.timer = DelayTimer(
            store,
            metadata_dir,
            self.topics.delay_route,
            window_ms=config.timer_window_ms,
            max_heap=config.timer_max_heap,
            persist_interval_ms=config.offset_persist_interval_ms,
            journal=TimerJournal(store) if journal_offsets else None,
        )
        self._pop = PopService(
            store,
            clock,
            topic_queues=self.topics.readable_queue_ids,
            group_settings=self._pop_settings,
            dead_letter=self._dead_letter,
            state_path=metadata_dir / "consumption.json" if metadata_dir is not None else None,
            hot_data_bytes=config.hot_data_bytes or default_hot_data_bytes(),
            min_receive_invisible_ms=config.min_receive_invisible_ms,
            priority_order=self.topics.is_priority,
            journal=PopJournal(store) if journal_offsets else None,
        )
        self._pop.trace = self.trace
        # Lite topics (RIP-83): subscriptions and a pop service over their queues.
        self.lite = LiteTopics(
            store,
            clock,
            config,
            metadata_dir,
            max_delivery_attempts=lambda group: self.get_group(group).max_delivery_attempts,
            dead_letter=self._dead_letter,
            journal_positions=journal_offsets,
        )
        self.lite.trace_with(self.trace)
        txn_config = transaction_config if transaction_config is not None else TransactionConfig()
        self.transactions = TransactionService(store, metadata_dir, txn_config, clock)
        self.transactions.trace = self.trace.record
        self._checks = CheckService(self.transactions, txn_config, self._started_ms)
        self._sender = SendPath(
            store,
            config,
            clock,
            self.topics,
            self.get_topic,
            self._selector,
            self.lite,
            self.transactions,
            self._received,
            self.trace,
            admit=admit_send,
        )
        self._consume = PopRouter(
            self._pop,
            self.lite,
            self.topics,
            self._filters,
            config,
            check_consumable=self._check_consumable,
            delivered=self._delivered,
            find_group=self.find_group,
            trace=self.trace,
        )
        self._pull = PullService(
            store,
            self.offsets,
            self._filters,
            get_topic=self.get_topic,
            get_group=self.get_group,
            check_consumable=self._check_consumable,
            delivered=self._delivered,
            reset_pop=self._pop.reset,
        )
        # Acks, rejects and offset commits decided with a transaction group.
        self.consuming = TransactionalConsume(
            store,
            self._pop,
            self.offsets,
            self.transactions,
            metadata_dir,
            dead_letter_copy=partial(dead_letter_copy, self.topics),
            retry_delay_ms=lambda g, attempt: self.get_group(g).retry_policy.delay_for_attempt(
                attempt
            ),
            check_queue=self._pull.check_offset,
            check_consumable=self._check_consumable,
        )
        self.consuming.recover()
        store.add_batch_listener(self._on_appended)

    # -- lifecycle ---------------------------------------------------------------
    def close(self) -> None:
        """Persist metadata, offsets, timer progress and consumption state."""
        with self._tick_lock:
            self.trace.flush()
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
            self.trace.flush()
            self.transactions.maybe_snapshot(now)
            if now - self._last_snapshot_ms >= self.config.offset_persist_interval_ms:
                self._last_snapshot_ms = now  # offsets and pop state, then the commit marker
                self.consuming.persist(self._write_consumption_state)
                self.consuming.sweep()  # roll back groups whose consumer lost a message
            if now - self._last_drained_check_ms >= _DRAINED_CHECK_INTERVAL_MS:
                self._last_drained_check_ms = now
                self.topics.drop_all_drained_queues(self._queue_has_messages)
            return self._checks.scanning

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        return apply_changes(self.config, changes)

    # -- topics ------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = 8,
        perm: str = "rw",
        brokers: Sequence[str] = (),
    ) -> TopicConfig:
        if brokers:
            raise InvalidArgument("placing queues on named brokers applies to a cluster only")
        return self.topics.create(name, message_type, queue_count, perm)

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
    ) -> TopicConfig:
        return self.topics.update(
            name,
            queue_count=queue_count,
            perm=perm,
            message_type=message_type,
            trace=trace,
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
        return reports.topic_status(self.store, self.get_topic(name))

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
        return reports.group_progress(
            self.store, group, names, pulled, self._pop.progress, self._pop.retrying
        )

    # -- produce -----------------------------------------------------------------
    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        written = self.send_nowait(messages)
        written.durable.result()
        return written.result

    def send_nowait(
        self, messages: Sequence[OutgoingMessage | EncodedMessage]
    ) -> Written[list[SendResult]]:
        """Store ``messages`` (a proxy's plain ones arrive encoded: halfmoon.broker.encoded)."""
        return self._sender.send_nowait(messages)

    def sends_cheaply(self, messages: Sequence[OutgoingMessage]) -> bool:
        return self._sender.sends_cheaply(messages)

    # -- recall (halfmoon/broker/recall.py) ------------------------------------------
    def recall(self, topic: str, recall_handle: str) -> str:
        self.get_topic(topic)
        handle = check_handle(recall_handle, topic, self.config.name, self.store)
        self.timer.cancel(handle.timer_key, handle.message_id)
        return handle.message_id

    # -- pop (halfmoon/broker/pop_router.py) -------------------------------------
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
        return self._consume.receive(
            group, topic, filter, batch_size, invisible_ms, client_id, queue_id
        )

    def receive_nowait(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
    ) -> Received | None:
        return self._consume.receive_nowait(
            group, topic, filter, batch_size, invisible_ms, client_id, queue_id
        )

    def subscribe(self, group: str, topic: str) -> None:
        """Fix a new group's start position in ``topic`` now (call when a consumer subscribes)."""
        self._consume.subscribe(group, topic)

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        self._consume.ack(group, topic, receipt_handle, lite_topic)

    def ack_nowait(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[Exception | None] | None:
        return self._consume.ack_nowait(group, topic, list(receipt_handles))

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        return self._consume.change_invisible_duration(
            group, topic, receipt_handle, invisible_ms, lite_topic
        )

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        self._consume.forward_to_dead_letter(group, topic, receipt_handle, lite_topic)

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        return self._consume.next_wakeup_ms(group, topic, client_id)

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

    # -- pull (halfmoon/broker/pull.py) -------------------------------------------
    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        result = self._pull.pull(group, topic, queue_id, offset, batch_size, filter)
        if result.messages and self.trace.enabled(topic):
            for view in result.messages:
                self.trace.add(
                    position_key(view.commit_log_offset),
                    "delivered",
                    {"group": group, "mode": "pull", "queue_offset": view.queue_offset},
                )
        return result

    def bulk_read(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        filter: FilterSpec,
        end_offset: int | None = None,
    ) -> PullResult:
        return self._pull.bulk_read(
            group, topic, queue_id, offset, max_messages, max_bytes, filter, end_offset
        )

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self._pull.get_offset(group, topic, queue_id)

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._pull.update_offset(group, topic, queue_id, offset)

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        return self._pull.query_offset(topic, queue_id, policy, timestamp)

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        return self._pull.reset_offset(group, topic, timestamp)

    def seek_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        return self._pull.seek_group(group, topic, offsets)

    # -- reading stored messages (halfmoon/broker/browse.py) ------------------------
    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        topics = self.list_topics() if topic is None else [self._existing_topic(topic)]
        return browse.by_id(self.store, self._store_topics(topics), message_id, topic)

    def _store_topics(self, topics: list[TopicConfig]) -> list[str]:
        """The store topics holding ``topics``' messages: each topic, and each lite topic's
        queue of a lite parent (one key-index lookup each, so a lookup by id costs one per
        lite topic of the parents searched)."""
        names = []
        for config in topics:
            names.append(config.name)
            if config.message_type is MessageType.LITE:
                names.extend(self.lite.queue_topics(config.name))
        return names

    def message_trace(self, message_id: str) -> list[dict[str, Any]]:
        try:
            copies = browse.by_id(
                self.store, self._store_topics(self.list_topics()), message_id, None
            )
        except NotFound:
            copies = []  # its trace may still hold a transaction that was rolled back
        keys = [message_id, *(position_key(view.commit_log_offset) for view in copies)]
        return self.trace.events(keys)

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
        return routes(self.get_topic(topic), writable=self.config.writable)

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self._listeners.append(callback)

    def store_stats(self) -> StoreStats:
        return self.store.stats()

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        return self.statistics.rows(topic=topic, group=group)

    def status(self) -> BrokerStatus:
        return reports.broker_status(
            self.config.name,
            self.clock.now_ms() - self._started_ms,
            self.store.stats(),
            topics=len(self.list_topics()),
            groups=len(self.groups.all()),
            received=self._in,
            delivered=self._out,
            pending_delay_messages=self.timer.pending,
            extra=self.trace.stats(),
        )

    # -- internals -----------------------------------------------------------------
    def _check_consumable(self, group: str, topic: str) -> TopicConfig:
        return check_consumable(self.get_topic, self.get_group, group, topic)

    def _queue_has_messages(self, topic: str) -> Callable[[int], bool]:
        return lambda q: self.store.max_offset(topic, q) > self.store.min_offset(topic, q)

    def _received(self, topics: list[str]) -> None:
        self._in.add(len(topics))
        self.statistics.record_in(topics)

    def _delivered(self, group: str, topic: str, count: int) -> None:
        self._out.add(count)
        self.statistics.record_out(group, topic, count)

    def _pop_settings(self, group: str) -> PopGroupSettings:
        config = self.get_group(group)
        return PopGroupSettings(config.fifo, config.max_delivery_attempts, config.consume_from)

    def _dead_letter(self, group: str, stored: StoredMessage, attempts: int) -> None:
        write_dead_letter(self.store, self.topics, group, stored, attempts)
        topic = stored.properties.get(PROPERTY_REAL_TOPIC, stored.topic)
        topic = parent_topic_of(topic) or topic  # a lite topic's queue: trace by the parent
        self.trace.record(
            position_key(stored.commit_log_offset), topic, "dead_lettered",
            group=group, attempts=attempts, dead_letter_topic=dead_letter_topic(group),
        )  # fmt: skip

    def _traced(self, topic: str) -> bool:
        # A lite topic's queue (``%LITE%parent%lite``) follows its parent's switch: acks and
        # invisibility changes name the queue, deliveries the parent.
        config = self.topics.find(parent_topic_of(topic) or topic)
        return config is not None and config.trace and not config.internal

    def _write_consumption_state(self) -> None:
        self.offsets.persist()
        self._pop.snapshot()

    def _on_appended(self, results: list[AppendResult]) -> None:
        # One wake-up per queue that grew, not per message: a batch of a hundred sends to a
        # topic of eight queues wakes each parked poll (and each proxy's watcher) once.
        grown = dict.fromkeys((r.topic, r.queue_id) for r in results)
        for topic, queue_id in grown:
            if is_internal_topic(topic):
                continue  # timer, half, op and parked records: no consumer waits on them
            # lite consumers wait on the parent
            self._wake(parent_topic_of(topic) or topic, queue_id)

    def _wake(self, topic: str, queue_id: int) -> None:
        for callback in list(self._listeners):
            try:
                callback(topic, queue_id)
            except Exception:
                log.exception("arrival listener failed")
