"""The in-process broker: the :class:`~halfmoon.broker.facade.Broker` facade over a store.

Every operation is documented once, on the facade (:mod:`facade`); this
class keeps a method for each and hands it to plain synchronous objects it
holds over a :class:`~halfmoon.store.api.Store`: topics and groups
(:mod:`topics`, :mod:`groups`), the send path (:mod:`send_path`,
:mod:`produce`), delay messages (:mod:`timer`), pop consumption
(:mod:`pop_router`, :mod:`pop`, :mod:`lite`, :mod:`lite_operations`), pull
with committed offsets (:mod:`pull`, :mod:`offsets`), transactions
(:mod:`transaction_operations`), dead letters (:mod:`dead_letters`),
operators' reads (:mod:`browsing`), arrival wake-ups (:mod:`arrivals`), and
the status pages (:mod:`reports`, :mod:`stats`). A method that only passes
its call on is declared with :func:`~halfmoon.delegation.delegate`.
Time comes from the injected clock; background work happens only in
:meth:`Broker.tick`, which the server calls every ~100 ms from one thread.
The broker does not own the store: close the store after the broker.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import halfmoon.broker.reports as reports
from halfmoon.broker import broker_metrics
from halfmoon.broker.access import check_consumable, routes
from halfmoon.broker.arrivals import ArrivalListeners
from halfmoon.broker.browsing import StoredMessages
from halfmoon.broker.clock import Clock, SystemClock
from halfmoon.broker.config import DEFAULT_QUEUE_COUNT, BrokerConfig, apply_changes
from halfmoon.broker.dead_letters import dead_letter_copy, write_dead_letter
from halfmoon.broker.encoded import EncodedMessage
from halfmoon.broker.errors import (
    TopicExists,
    TopicNotFound,
)
from halfmoon.broker.facade import PullResult, QueueProgress, QueueRoute, QueueStatus
from halfmoon.broker.facade_types import Answer, Pending, waits_for
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.groups import (
    DEFAULT_MAX_DELIVERY_ATTEMPTS,
    GroupConfig,
    GroupRegistry,
    RetryPolicy,
)
from halfmoon.broker.lite import LiteTopics
from halfmoon.broker.lite_names import parent_topic_of
from halfmoon.broker.lite_operations import LiteOperations
from halfmoon.broker.message import (
    PROPERTY_REAL_TOPIC,
    MessageType,
    OutgoingMessage,
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
from halfmoon.delegation import delegate
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import Store, StoreStats
from halfmoon.store.message import StoredMessage

_DRAINED_CHECK_INTERVAL_MS = 60_000
# Re-exported: the facade's result types used to live here.
__all__ = ["Broker", "PullResult", "QueueProgress", "QueueRoute", "QueueStatus"]


class Broker:
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
        """``journal_offsets``: committed offsets, pop consumers' positions and acks and the
        delay timer's progress also go to the commit log (:mod:`offset_journal`,
        :mod:`pop_journal`, :mod:`timer_journal`): an answered ack or offset commit is then
        as durable as a send (it survives a crash under sync flush) and moves with the log
        to a broker group's replicas. ``halfmoon serve`` and ``halfmoon broker`` turn it
        on; without it (tests' brokers) they persist at the periodic snapshot.
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
        self._arrivals = ArrivalListeners()
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
        self._group_timeout_scan_ms = txn_config.group_timeout_scan_ms
        self._last_timeout_scan_ms = self._started_ms
        # Transaction groups past their timeout are rolled back by this broker's tick; in a cluster
        # the group's coordinator decides instead (cluster/internal/txn_groups.py clears it).
        self.expires_transaction_groups = True
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
            counted=self._counted,
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
        self._lite_operations = LiteOperations(self.lite, self.get_topic, self._check_consumable)
        self._stored_messages = StoredMessages(
            store, self.topics, self.list_topics, self.lite, self._filters, self.trace
        )
        self._txns = TransactionOperations(
            self.transactions,
            self.consuming,
            self._checks,
            self.topics,
            store,
            self._arrivals.wake,
        )
        store.add_batch_listener(self._arrivals.appended)

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
            if (
                self.expires_transaction_groups
                and now - self._last_timeout_scan_ms >= self._group_timeout_scan_ms
            ):
                self._last_timeout_scan_ms = now
                self.consuming.expire(now)  # undecided groups past their transaction timeout
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
        queue_count: int = DEFAULT_QUEUE_COUNT,
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
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
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
            self.store,
            group,
            names,
            pulled,
            self._pop.progress,
            self._pop.retrying,
            self._pop.ready,
        )

    # -- produce -----------------------------------------------------------------
    def send_nowait(
        self, messages: Sequence[OutgoingMessage | EncodedMessage]
    ) -> Answer[list[SendResult]]:
        """Store ``messages`` (a proxy's plain ones arrive encoded: halfmoon.broker.encoded)
        now when that only appends (tens of microseconds, less than two thread hand-offs);
        a topic to create or a transaction group's index lookup is left to the answer."""
        sender = self._sender
        if sender.sends_cheaply(messages):
            return sender.send_nowait(messages)
        return Pending(partial(sender.send_nowait, messages))

    send = waits_for(send_nowait)

    def send_fanout_nowait(
        self, message: OutgoingMessage, others: Sequence[str]
    ) -> Answer[list[SendResult]]:
        sender = self._sender
        if sender.sends_cheaply([message], others):
            return sender.fanout_nowait(message, others)
        return Pending(partial(sender.fanout_nowait, message, others))

    send_fanout = waits_for(send_fanout_nowait)

    # -- transactions (halfmoon/broker/transaction_operations.py) -------------------
    end_transaction = delegate("_txns", TransactionOperations.end_transaction)
    end_transaction_nowait = delegate("_txns", TransactionOperations.end_transaction_nowait)
    end_transactions_nowait = delegate("_txns", TransactionOperations.end_transactions_nowait)
    end_transaction_group = delegate("_txns", TransactionOperations.end_transaction_group)
    end_transaction_group_nowait = delegate(
        "_txns", TransactionOperations.end_transaction_group_nowait
    )
    transactional_ack = delegate("_txns", TransactionOperations.transactional_ack)
    transactional_reject = delegate("_txns", TransactionOperations.transactional_reject)
    transactional_offset = delegate("_txns", TransactionOperations.transactional_offset)
    list_transactions = delegate("_txns", TransactionOperations.list_transactions)
    parked_transactions = delegate("_txns", TransactionOperations.parked_transactions)
    resume_transaction = delegate("_txns", TransactionOperations.resume_transaction)
    set_check_sender = delegate("_txns", TransactionOperations.set_check_sender)
    transaction_stats = delegate("_txns", TransactionOperations.transaction_stats)

    # -- recall (halfmoon/broker/recall.py) ------------------------------------------
    def recall(self, topic: str, recall_handle: str) -> str:
        self.get_topic(topic)
        handle = check_handle(recall_handle, topic, self.config.name, self.store)
        self.timer.cancel(handle.timer_key, handle.message_id)
        return handle.message_id

    # -- pop (halfmoon/broker/pop_router.py) -------------------------------------
    receive = delegate("_consume", PopRouter.receive)
    subscribe = delegate("_consume", PopRouter.subscribe)
    ack = delegate("_consume", PopRouter.ack)

    receive_nowait = delegate("_consume", PopRouter.receive_nowait)
    ack_nowait = delegate("_consume", PopRouter.ack_nowait)
    change_invisible_duration = delegate("_consume", PopRouter.change_invisible_duration)
    forward_to_dead_letter = delegate("_consume", PopRouter.forward_to_dead_letter)
    next_wakeup_ms = delegate("_consume", PopRouter.next_wakeup_ms)

    def delivery_holders(self) -> frozenset[str]:
        """The holders of deliveries in flight (``receive``'s ``holder``), for whoever watches
        them end (a cluster broker: :mod:`halfmoon.cluster.internal.delivery_holders`)."""
        return self._pop.holders()

    def release_held(self, holder: str) -> int:
        """``holder`` ended: each delivery it held is visible again now; how many."""
        return self._pop.release_held(holder)

    # -- lite topics (halfmoon/broker/lite_operations.py) -----------------------------
    sync_lite_subscription = delegate("_lite_operations", LiteOperations.sync_lite_subscription)
    client_terminated = delegate("_lite_operations", LiteOperations.client_terminated)
    lite_subscriptions = delegate("_lite_operations", LiteOperations.lite_subscriptions)
    set_lite_unsubscribe_notifier = delegate(
        "_lite_operations", LiteOperations.set_lite_unsubscribe_notifier
    )
    list_lite_topics = delegate("_lite_operations", LiteOperations.list_lite_topics)
    delete_lite_topic = delegate("_lite_operations", LiteOperations.delete_lite_topic)

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

    bulk_read = delegate("_pull", PullService.bulk_read)
    get_offset = delegate("_pull", PullService.get_offset)
    update_offset = delegate("_pull", PullService.update_offset)
    query_offset = delegate("_pull", PullService.query_offset)
    reset_offset = delegate("_pull", PullService.reset_offset)
    seek_group = delegate("_pull", PullService.seek_group)

    # -- reading stored messages (halfmoon/broker/browsing.py) ------------------------
    messages_by_id = delegate("_stored_messages", StoredMessages.messages_by_id)
    message_trace = delegate("_stored_messages", StoredMessages.message_trace)
    messages_by_key = delegate("_stored_messages", StoredMessages.messages_by_key)
    message_at = delegate("_stored_messages", StoredMessages.message_at)
    scan = delegate("_stored_messages", StoredMessages.scan)

    # -- routes, notifications, status -------------------------------------------
    def route(self, topic: str) -> list[QueueRoute]:
        return routes(self.get_topic(topic), writable=self.config.writable)

    add_arrival_listener = delegate("_arrivals", ArrivalListeners.add_arrival_listener)

    def store_stats(self) -> StoreStats:
        return self.store.stats()

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        return self.statistics.rows(topic=topic, group=group)

    def traffic_history(
        self, topic: str | None = None, group: str | None = None, minutes: int = 60
    ) -> dict[str, Any]:
        return self.statistics.history(topic, group, minutes)

    def counted_metrics(self) -> list[list[Any]]:
        return broker_metrics.snapshot()

    def status(self) -> BrokerStatus:
        topics = self.list_topics()
        return reports.broker_status(
            self.config.name,
            self.clock.now_ms() - self._started_ms,
            self.store.stats(),
            topics=len(topics),
            # Configured queues, whether or not a message reached them yet.
            queues=sum(max(t.queue_count, t.read_queue_count) for t in topics),
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
        first = topics[0] if topics else ""
        if all(t == first for t in topics):  # the usual send: one topic
            broker_metrics.stored(first, len(topics))
        else:
            for topic in set(topics):
                broker_metrics.stored(topic, topics.count(topic))

    def _delivered(self, group: str, topic: str, count: int) -> None:
        self._out.add(count)
        self.statistics.record_out(group, topic, count)
        broker_metrics.delivered(group, topic, count)

    def _counted(self, kind: str, group: str, topic: str, count: int) -> None:
        self.statistics.record(kind, group, topic, count)

    def _pop_settings(self, group: str) -> PopGroupSettings:
        config = self.get_group(group)
        return PopGroupSettings(config.fifo, config.max_delivery_attempts, config.consume_from)

    def _dead_letter(self, group: str, stored: StoredMessage, attempts: int) -> None:
        write_dead_letter(self.store, self.topics, group, stored, attempts)
        broker_metrics.dead_lettered(group)
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
