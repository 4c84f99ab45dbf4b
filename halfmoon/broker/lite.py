"""Lite topics (RocketMQ's RIP-83): many small queues under one parent topic.

A parent topic of type ``lite`` holds any number of *lite topics* (one per
chat session, device, user...). A producer sends a LITE message with a lite
topic name; the broker keeps one queue per lite topic (the store topic
``lite_names.lite_queue_topic``), created by its first message. A consumer
(LitePushConsumer / LiteSimpleConsumer) binds the parent topic and tells the
broker which lite topics it wants with ``SyncLiteSubscription``; a receive on
the parent then delivers from those lite topics only.

What RocketMQ does, and halfmoon with it (sources: apache/rocketmq
``LiteSubscriptionRegistryImpl``, ``LiteSubscriptionCtlProcessor``,
``PopLiteMessageProcessor``, ``AbstractLiteLifecycleManager``):

- Subscriptions are per *client* (client id → group, parent topic, set of
  lite topics), kept in memory; clients re-send their full set every 30 s
  (COMPLETE_ADD) and subscriptions not refreshed within
  ``lite_subscription_timeout_ms`` lapse. A client that terminates loses
  them at once.
- Actions: PARTIAL_ADD adds names, PARTIAL_REMOVE removes names,
  COMPLETE_ADD replaces the whole set, COMPLETE_REMOVE drops the client.
  Adding needs a group allowed to consume. An add beyond the consumer's
  quota (``lite_subscription_quota``) is refused with
  LITE_SUBSCRIPTION_QUOTA_EXCEEDED (RocketMQ counts a broker-wide total;
  halfmoon counts per client, the quota the client itself is told).
- A subscription may carry an offset option (min, max, an offset, the
  last N, a timestamp): the group's position in each added lite topic moves
  there. RocketMQ ignores the timestamp option for now; halfmoon honours it.
- Delivery is ordered per lite topic (RocketMQ's lite pop is always FIFO):
  while a message of a lite topic is in flight for a group, nothing after it
  in that lite topic goes out. A group's first receive from a lite topic
  starts where RocketMQ's ``getInitOffset(..., MAX)`` does (pop's "auto"):
  at its first message while the queue starts at 0 and that message is hot
  (always the case for a new lite topic), else at its last message.
- A send that would create more than ``max_lite_topics_per_topic`` lite
  topics under one parent is refused with LITE_TOPIC_QUOTA_EXCEEDED.
- NotifyUnsubscribeLiteCommand tells a client that the broker dropped one of
  its lite subscriptions. RocketMQ sends it when it removes a lite topic's
  subscriptions with notification (and on exclusive-group eviction, which
  halfmoon does not offer); halfmoon sends it when an operator deletes a
  lite topic or its parent topic.

Locking: one lock guards the subscription tables and the lite topic index;
it is never held while calling the pop service or the notifier.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from halfmoon.broker.clock import Clock
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.filter import MessageFilter
from halfmoon.broker.lite_names import (
    LiteSubscriptionQuotaExceeded,
    LiteTopicQuotaExceeded,
    check_lite_topic,
    lite_queue_topic,
    lite_queue_topic_unchecked,
    split_lite_queue_topic,
)
from halfmoon.broker.message import MessageView
from halfmoon.broker.pop import DeadLetter, PopGroupSettings, PopService
from halfmoon.broker.pop_journal import LITE_POP_QUEUE, PopJournal
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.broker.trace import TraceRecorder
from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.store.api import Store

log = logging.getLogger(__name__)

ACTIONS = ("partial_add", "partial_remove", "complete_add", "complete_remove")
OFFSET_KINDS = ("min", "max", "offset", "tail_n", "timestamp")

# (client id, group, parent topic, lite topic): tell that client it lost the lite topic.
UnsubscribeNotifier = Callable[[str, str, str, str], None]


@dataclass(frozen=True)
class OffsetOption:
    """Where a group starts in a lite topic it subscribes to (SyncLiteSubscription)."""

    kind: str  # one of OFFSET_KINDS
    value: int = 0  # the offset, N of tail_n, or ms since the epoch

    def __post_init__(self) -> None:
        if self.kind not in OFFSET_KINDS:
            raise InvalidArgument(
                f"unknown offset option {self.kind!r}: use {', '.join(OFFSET_KINDS)}"
            )
        if self.value < 0:
            raise InvalidArgument(f"offset option {self.kind} needs a value >= 0, got {self.value}")


@dataclass
class _Client:
    group: str
    topic: str
    lite_topics: set[str] = field(default_factory=set)
    updated_ms: int = 0
    rotation: int = 0  # where the next receive starts among the lite topics


class LiteTopics:
    """Lite subscriptions, the lite topic index, and receive/ack over lite queues."""

    STATE_FILE = "lite_consumption.json"

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: BrokerConfig,
        metadata_dir: Path | None,
        *,
        max_delivery_attempts: Callable[[str], int],
        dead_letter: DeadLetter,
        journal_positions: bool = False,
    ) -> None:
        """``journal_positions``: in a broker group, the lite pop state also goes to the
        commit log (:mod:`pop_journal`, a queue of its own), so it moves to a new master."""
        self._store = store
        self._clock = clock
        self._config = config
        self._max_attempts = max_delivery_attempts
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}
        self._notifier: UnsubscribeNotifier | None = None
        self._index: dict[str, set[str]] = {}  # parent topic -> its lite topics
        for name, _queue_id in store.queues():
            split = split_lite_queue_topic(name)
            if split is not None:
                self._index.setdefault(split[0], set()).add(split[1])
        # A pop service of its own: lite queues are FIFO and start as RocketMQ's lite
        # pop does, whatever the group's settings say (see the module docs).
        self._pop = PopService(
            store,
            clock,
            topic_queues=lambda topic: [0] if split_lite_queue_topic(topic) else [],
            group_settings=self._pop_settings,
            dead_letter=dead_letter,
            state_path=metadata_dir / self.STATE_FILE if metadata_dir is not None else None,
            min_receive_invisible_ms=config.min_receive_invisible_ms,
            hot_data_bytes=config.hot_data_bytes,
            journal=PopJournal(store, LITE_POP_QUEUE) if journal_positions else None,
        )
        self._last_tick_ms = clock.now_ms()

    def _pop_settings(self, group: str) -> PopGroupSettings:
        return PopGroupSettings(
            fifo=True,
            max_delivery_attempts=self._max_attempts(group),
            consume_from="auto",
            every_message_ordered=True,
        )

    def set_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        self._notifier = notifier

    # -- lifecycle -------------------------------------------------------------

    def tick(self, now: int) -> None:
        """Lapse stale subscriptions, dead-letter expired last deliveries, persist now and then."""
        self._pop.revive(now)
        timeout = self._config.lite_subscription_timeout_ms
        with self._lock:
            stale = [cid for cid, c in self._clients.items() if now - c.updated_ms > timeout]
            for client_id in stale:
                del self._clients[client_id]
        for client_id in stale:
            log.info("event=lite_subscription_lapsed client_id=%s", client_id)
        if now - self._last_tick_ms >= self._config.offset_persist_interval_ms:
            self._last_tick_ms = now
            self._pop.snapshot()

    def close(self) -> None:
        self._pop.close()

    # -- subscriptions (SyncLiteSubscription) ------------------------------------

    def sync(
        self,
        client_id: str,
        group: str,
        topic: str,
        action: str,
        lite_topics: Iterable[str],
        offset: OffsetOption | None = None,
    ) -> list[str]:
        """Apply one SyncLiteSubscription; returns the client's lite topics afterwards.

        The caller has checked that ``topic`` is a readable lite topic and that
        ``group`` may consume (adds only).
        """
        if action not in ACTIONS:
            raise InvalidArgument(f"unknown lite subscription action {action!r}")
        if not client_id:
            raise InvalidArgument(
                "SyncLiteSubscription needs the client id (x-mq-client-id header)",
                code="CLIENT_ID_REQUIRED",
            )
        size = self._config.max_lite_topic_length
        names = {check_lite_topic(name, topic, size) for name in lite_topics}
        quota = self._config.lite_subscription_quota
        now = self._clock.now_ms()
        with self._lock:
            client = self._clients.get(client_id)
            if action == "complete_remove":
                self._clients.pop(client_id, None)
                return []
            if client is None or (client.group, client.topic) != (group, topic):
                # One binding per client, as RocketMQ keys subscriptions by client id.
                client = _Client(group, topic)
            if action == "partial_add":
                wanted = client.lite_topics | names
            elif action == "complete_add":
                wanted = set(names)
            else:
                wanted = client.lite_topics - names
            if action != "partial_remove" and len(wanted) > quota:
                raise LiteSubscriptionQuotaExceeded(
                    f"client {client_id} would subscribe to {len(wanted)} lite topics; "
                    f"the quota is {quota}: unsubscribe lite topics it no longer needs"
                )
            added = wanted - client.lite_topics
            client.lite_topics = wanted
            client.updated_ms = now
            self._clients[client_id] = client
        if offset is not None and action in ("partial_add", "complete_add"):
            for name in sorted(added):
                self._apply_offset(group, lite_queue_topic_unchecked(topic, name), offset)
        return sorted(wanted)

    def remove_client(self, client_id: str) -> None:
        with self._lock:
            self._clients.pop(client_id, None)

    def subscriptions(self, topic: str | None = None) -> list[dict[str, object]]:
        """Every client's lite subscriptions (for the admin API)."""
        with self._lock:
            return [
                {
                    "client_id": client_id,
                    "group": c.group,
                    "topic": c.topic,
                    "lite_topics": sorted(c.lite_topics),
                    "updated_ms": c.updated_ms,
                }
                for client_id, c in sorted(self._clients.items())
                if topic is None or c.topic == topic
            ]

    def _subscribed(self, client_id: str, group: str, topic: str) -> list[str]:
        """The client's lite topics of ``topic``, starting one further each call."""
        with self._lock:
            client = self._clients.get(client_id)
            if client is None or client.group != group or client.topic != topic:
                return []
            names = sorted(client.lite_topics)
            if not names:
                return []
            start = client.rotation % len(names)
            client.rotation = start + 1
        return names[start:] + names[:start]

    def _apply_offset(self, group: str, queue_topic: str, option: OffsetOption) -> None:
        low = self._store.min_offset(queue_topic, 0)
        high = self._store.max_offset(queue_topic, 0)
        if option.kind == "min":
            target = low
        elif option.kind == "max":
            target = high
        elif option.kind == "offset":
            target = option.value
        elif option.kind == "tail_n":
            target = high - option.value
        else:
            target = self._store.offset_for_timestamp(queue_topic, 0, option.value)
        self._pop.reset(group, queue_topic, 0, max(low, min(target, high)))

    # -- the lite topic index (send side) ----------------------------------------

    def reserve(self, topic: str, lite_topic: str) -> None:
        """Count ``lite_topic`` under ``topic`` before its first message is written."""
        with self._lock:
            known = self._index.setdefault(topic, set())
            if lite_topic in known:
                return
            limit = self._config.max_lite_topics_per_topic
            if len(known) >= limit:
                raise LiteTopicQuotaExceeded(
                    f"topic {topic!r} already holds {len(known)} lite topics, its limit; "
                    "delete lite topics it no longer needs or raise "
                    "broker.max_lite_topics_per_topic"
                )
            known.add(lite_topic)

    def trace_with(self, recorder: TraceRecorder) -> None:
        """Record acks and invisibility changes of lite deliveries in the broker's trace."""
        self._pop.trace = recorder

    def queue_topics(self, topic: str) -> list[str]:
        """The store topic of each lite topic of ``topic`` (one queue each)."""
        with self._lock:
            names = sorted(self._index.get(topic, ()))
        return [lite_queue_topic_unchecked(topic, name) for name in names]

    def lite_topics(self, topic: str) -> list[dict[str, object]]:
        """Each lite topic of ``topic``: its offsets and how many clients subscribe to it."""
        with self._lock:
            names = sorted(self._index.get(topic, ()))
            counts = {name: 0 for name in names}
            for c in self._clients.values():
                if c.topic == topic:
                    for name in c.lite_topics & counts.keys():
                        counts[name] += 1
        out = []
        for name in names:
            queue_topic = lite_queue_topic_unchecked(topic, name)
            out.append(
                {
                    "lite_topic": name,
                    "min_offset": self._store.min_offset(queue_topic, 0),
                    "max_offset": self._store.max_offset(queue_topic, 0),
                    "subscribers": counts[name],
                }
            )
        return out

    def delete(self, topic: str, lite_topic: str) -> int:
        """Delete one lite topic's messages and subscriptions; returns the clients notified."""
        queue_topic = lite_queue_topic(topic, lite_topic, self._config.max_lite_topic_length)
        with self._lock:
            if lite_topic not in self._index.get(topic, ()):
                raise NotFound(f"topic {topic!r} has no lite topic {lite_topic!r}")
            self._index[topic].discard(lite_topic)
            dropped = self._drop_subscriptions(topic, {lite_topic})
        self._store.delete_topic(queue_topic)
        for _client_id, group, _name in dropped:
            self._pop.reset(group, queue_topic, 0, 0)
        return self._notify(topic, dropped)

    def delete_parent(self, topic: str) -> int:
        """Forget every lite topic of a deleted parent topic; returns the clients notified."""
        with self._lock:
            names = self._index.pop(topic, set())
            dropped = self._drop_subscriptions(topic, None)
            for client_id in [cid for cid, c in self._clients.items() if c.topic == topic]:
                del self._clients[client_id]
        for name in sorted(names):
            self._store.delete_topic(lite_queue_topic_unchecked(topic, name))
        return self._notify(topic, dropped)

    def _drop_subscriptions(self, topic: str, names: set[str] | None) -> list[tuple[str, str, str]]:
        dropped: list[tuple[str, str, str]] = []
        for client_id, c in self._clients.items():
            if c.topic != topic:
                continue
            lost = c.lite_topics if names is None else c.lite_topics & names
            dropped.extend((client_id, c.group, name) for name in sorted(lost))
            c.lite_topics = c.lite_topics - lost
        return dropped

    def _notify(self, topic: str, dropped: list[tuple[str, str, str]]) -> int:
        notifier = self._notifier
        if notifier is None:
            return 0
        sent = 0
        for client_id, group, name in dropped:
            try:
                notifier(client_id, group, topic, name)
                sent += 1
            except Exception:  # a notification is a courtesy; the subscription is gone anyway
                log.exception("event=lite_unsubscribe_notify_failed client_id=%s", client_id)
        return sent

    # -- consume ----------------------------------------------------------------

    def receive(
        self,
        group: str,
        topic: str,
        client_id: str,
        matcher: MessageFilter | None,
        batch_size: int,
        invisible_ms: int,
    ) -> list[MessageView]:
        """Up to ``batch_size`` messages from the lite topics ``client_id`` subscribes to."""
        out: list[MessageView] = []
        for name in self._subscribed(client_id, group, topic):
            queue_topic = lite_queue_topic_unchecked(topic, name)
            out.extend(
                self._pop.receive(group, queue_topic, matcher, batch_size - len(out), invisible_ms)
            )
            if len(out) >= batch_size:
                break
        return out

    def next_wakeup_ms(self, group: str, topic: str, client_id: str) -> int | None:
        wakeups = [
            self._pop.next_wakeup_ms(group, lite_queue_topic_unchecked(topic, name))
            for name in self._subscribed(client_id, group, topic)
        ]
        known = [w for w in wakeups if w is not None]
        return min(known) if known else None

    def _queue(self, topic: str, lite_topic: str | None, handle: str) -> str:
        """The lite queue an ack (or change, or forward) is about.

        The official clients send the message's lite topic (checked like any lite
        topic name). Without one (halfmoon's own renewal of auto_renew receives),
        the receipt handle names the queue; it must be one of ``topic``'s.
        """
        if lite_topic is not None:
            return lite_queue_topic(topic, lite_topic, self._config.max_lite_topic_length)
        queue_topic = self._pop.handle_topic(handle)
        split = split_lite_queue_topic(queue_topic)
        if split is None or split[0] != topic:
            raise InvalidReceiptHandle(
                f"receipt handle is not one of a lite topic of {topic!r}; "
                "send the message's lite_topic with it"
            )
        return queue_topic

    def ack(self, group: str, topic: str, lite_topic: str | None, handle: str) -> None:
        self._pop.ack(group, self._queue(topic, lite_topic, handle), handle)

    def change_invisible_duration(
        self, group: str, topic: str, lite_topic: str | None, handle: str, invisible_ms: int
    ) -> str:
        queue_topic = self._queue(topic, lite_topic, handle)
        return self._pop.change_invisible_duration(group, queue_topic, handle, invisible_ms)

    def forward_to_dead_letter(
        self, group: str, topic: str, lite_topic: str | None, handle: str
    ) -> None:
        queue_topic = self._queue(topic, lite_topic, handle)
        self._pop.forward_to_dead_letter(group, queue_topic, handle)

    def drop_group(self, group: str) -> None:
        self._pop.drop_group(group)
