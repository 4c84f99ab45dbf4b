"""``ClusterBroker``: the ``Broker`` facade over every broker of a cluster, routed by etcd.

What a proxy's front end drives in cluster mode. Each operation goes to the
broker owning the queue, receipt handle, recall handle or transaction it
names (:mod:`halfmoon.cluster.routing`), or to every broker holding the
topic, answers merged. Topics and groups are written to etcd first (the
record every proxy routes by), then created on the brokers.

- **Sends**: a message without a queue gets one here, as a broker would pick
  it: a FIFO message by the CRC-32 of its message group over the topic's
  cluster queues (a group always on one queue), any other round-robin. The
  messages of one call are split by broker, each part going through that
  broker's coalescing sender.
- **Receives**: every broker holding the topic, starting at a rotating one,
  until the batch is full; the front end's long poll wakes on arrivals from
  any of them (the pool's translated listeners).
- **Transaction groups** go to any one broker, which forwards them to the
  group's coordinator broker (:mod:`halfmoon.cluster.txn_groups`); a
  transactional ack, reject or offset commit goes to the broker holding the
  message or queue (which must be the group's coordinator).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.errors import (
    GroupExists,
    GroupNotFound,
    IllegalQueueId,
    TopicExists,
    TopicNotFound,
)
from halfmoon.broker.facade import QueueProgress, QueueRoute, QueueStatus, Written, end_each
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.groups import GroupConfig, RetryPolicy
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.broker.statistics import TrafficRow
from halfmoon.broker.stats import BrokerStatus
from halfmoon.broker.topics import TopicConfig, check_queue_count, is_reserved
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import EndRequest, EndResult, TransactionInfo, TransactionStats
from halfmoon.cluster.cluster_reads import ClusterReads
from halfmoon.cluster.errors import CoordinatorConflict
from halfmoon.cluster.network_hop import NetworkHop
from halfmoon.cluster.placement import QueueAssignment, grow_queues
from halfmoon.cluster.routing import Layout, qualify, unqualify
from halfmoon.cluster.wire import BrokerDeadlineExceeded, BrokerUnavailable
from halfmoon.errors import HalfmoonError, NotFound
from halfmoon.store.api import StoreStats

# A topic created through this proxy is routable here before create_topic returns.
VIEW_CATCH_UP_S = 5.0
LAYOUTS_CACHED = 4096  # topics whose send layout a proxy keeps built

# A message of a send, planned: its index in the call, itself on its broker's queue, its layout.
_Planned = tuple[int, OutgoingMessage, Layout]


class _NeedsThread(Exception):
    """Planning a send on the loop needs a blocking call: the send goes to a thread."""


def _read_only(perm: str) -> str:
    return perm.replace("w", "") or "-"


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


class ClusterBroker(NetworkHop, ClusterReads):
    _round_robin = itertools.count()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # topic -> (the view's placement it was built from, the layout): sends on the loop
        self._layouts: dict[str, tuple[object, Layout]] = {}

    # -- lifecycle and settings ----------------------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        return self.any_broker().config

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        answers = self.fan_out(list(self.connected()), lambda b: b.update_config(changes))
        return answers[0][1]

    def close(self) -> None:
        self.close_connections()

    def tick(self) -> bool:
        return False  # every broker process ticks itself

    def status(self) -> BrokerStatus:
        return self.any_broker().status()

    def store_stats(self) -> StoreStats:
        return self.any_broker().store_stats()

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        rows: list[TrafficRow] = []
        for _, answer in self.fan_out(list(self.connected()), lambda b: b.traffic(topic, group)):
            rows.extend(answer)
        return rows

    # -- topics --------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = 8,
        perm: str = "rw",
        brokers: Sequence[str] = (),
    ) -> TopicConfig:
        stored, created = self.on_loop(
            self.metadata.create_topic(
                name,
                queues=queue_count,
                brokers=brokers,
                message_type=message_type.value,
                perm=perm,
            )
        )
        # Each owning broker holds the topic with exactly its share of queues.
        kind = MessageType(stored.message_type)
        for broker in stored.brokers:
            share = len(stored.queues_on(broker))
            # TopicExists: an earlier attempt got this far; creating is idempotent per broker.
            with contextlib.suppress(TopicExists):
                self.broker(broker).create_topic(name, kind, share, stored.perm)
        self.on_loop(self.view.wait_for(lambda v: v.topic(name) is not None, VIEW_CATCH_UP_S))
        if not created:
            raise TopicExists(name)
        return self._topic_config(name, self.layout(name), kind, stored.perm, stored.created_ms)

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
    ) -> TopicConfig:
        layout = self._known_layout(name)
        if queue_count is not None and queue_count != layout.writable:
            self._change_queue_count(name, queue_count)
            layout = self._known_layout(name)
        if perm is not None:
            self.on_loop(self.metadata.set_topic_perm(name, perm))
        if trace is not None:
            self.on_loop(self.metadata.set_topic_trace(name, trace))
            self.on_loop(
                self.view.wait_for(
                    lambda v: getattr(v.topic(name), "trace", trace) == trace, VIEW_CATCH_UP_S
                )
            )
        for broker in layout.brokers:
            # The trace switch lives on each broker holding the topic (its trace is theirs).
            self.broker(broker).update_topic(
                name, perm=perm, message_type=message_type, trace=trace
            )
        return self.get_topic(name)

    def _change_queue_count(self, name: str, queue_count: int) -> None:
        """Grow or shrink topic ``name`` to ``queue_count`` writable queues (placement.py:
        existing queues never move; removed ones stay readable until drained).

        Brokers taking new queues get them before etcd names them, so no proxy routes a
        queue its broker lacks; a change that loses etcd's compare-and-swap leaves only
        unrouted empty queues behind, which the next attempt reuses."""
        check_queue_count(queue_count)
        placed = self.view.topic(name)
        if placed is None:
            raise IllegalQueueId(
                f"topic {name!r} was not placed by the cluster (a broker made it): its queue "
                "count is the brokers'"
            )
        live = self.on_loop(self.metadata.live_brokers())
        changed = grow_queues(placed, queue_count, live)
        kind = MessageType(changed.message_type)
        for broker in changed.brokers:
            share = len(changed.queues_on(broker))
            if share == len(placed.queues_on(broker)):
                continue
            if not placed.queues_on(broker):
                with contextlib.suppress(TopicExists):
                    self.broker(broker).create_topic(name, kind, share, changed.perm)
            # A broker's queues all stay writable at the broker: read-only is the
            # cluster's word (routes and sends), so a later grow can reopen them.
            self.broker(broker).update_topic(name, queue_count=share)
        stored = self.on_loop(
            self.metadata.update_topic(
                name,
                lambda t: grow_queues(t, queue_count, live) if t.queues == placed.queues else t,
            )
        )
        if stored.queues != changed.queues or stored.writable != queue_count:
            raise CoordinatorConflict(
                f"topic {name!r} changed while its queue count was being changed; retry"
            )
        self.on_loop(
            self.view.wait_for(
                lambda v: (
                    getattr(v.topic(name), "writable", None) == queue_count
                    and len(getattr(v.topic(name), "queues", ())) == len(changed.queues)
                ),
                VIEW_CATCH_UP_S,
            )
        )

    def delete_topic(self, name: str) -> None:
        layout = self._known_layout(name)
        for broker in layout.brokers:
            with contextlib.suppress(TopicNotFound):
                self.broker(broker).delete_topic(name)
        self.on_loop(self.metadata.delete_topic(name))

    def unused_topics(self, *, delete: bool = False) -> list[tuple[str, str]]:
        """RocketMQ's cleanUnusedTopic: the (broker, topic) pairs a reachable broker holds
        though etcd has no record of the topic (a broker's own topics, ``%DLQ%``, ``%RETRY%``
        and the system ones, are never unused); with ``delete``, each is deleted there.

        etcd is read after the brokers were listed: a topic is written to etcd before any
        broker creates it and leaves etcd only after every broker deleted it, so a topic
        being created or deleted meanwhile is never taken for an unused one."""
        held = self.fan_out(
            sorted(self.connected()),
            lambda b: [t.name for t in b.list_topics()],
            skip_missing=True,
        )
        known = {t.name for t in self.on_loop(self.metadata.list_topics())}
        unused = [
            (broker, name)
            for broker, names in held
            for name in sorted(names)
            if name not in known and not is_reserved(name)
        ]
        if delete:
            for broker, name in unused:
                with contextlib.suppress(TopicNotFound):
                    self.broker(broker).delete_topic(name)
        return unused

    def get_topic(self, name: str) -> TopicConfig:
        found = self.find_topic(name) or self._auto_create(name)
        if found is None:
            raise TopicNotFound(name)
        return found

    def _auto_create(self, name: str) -> TopicConfig | None:
        """With ``broker.auto_create_topics``, create unknown topic ``name`` cluster-wide, as
        local mode does on first send or route query: a mixed topic of the default queue
        count, spread over the live brokers. Two proxies racing both end with the one record
        etcd's compare-and-swap kept (the loser's ``create_topic`` still makes sure every
        owning broker holds its share, then says ``TopicExists``)."""
        config = self.config
        if not config.auto_create_topics or is_reserved(name):
            return None
        with contextlib.suppress(TopicExists):
            self.create_topic(name, MessageType.MIXED, config.default_queue_count)
        return self.find_topic(name)

    def find_topic(self, name: str) -> TopicConfig | None:
        placed = self.view.topic(name)
        if placed is not None:
            return self._topic_config(
                name,
                Layout(name, placed.queues, placed.writable),
                MessageType(placed.message_type),
                placed.perm,
                placed.created_ms,
                placed.trace,
            )
        layout = self.layout(name)
        if not layout.queues:
            return None
        first = self.broker(layout.brokers[0]).find_topic(name)
        if first is None:
            return None
        return replace(first, queue_count=len(layout.queues), read_queue_count=len(layout.queues))

    def list_topics(self) -> list[TopicConfig]:
        topics = {t.name: t for t in (self.find_topic(n) for n in self.view.topics) if t}
        for _, answer in self.fan_out(list(self.connected()), lambda b: b.list_topics()):
            for topic in answer:
                if topic.name not in topics:
                    found = self.find_topic(topic.name)
                    if found is not None:
                        topics[topic.name] = found
        return [topics[name] for name in sorted(topics)]

    def topic_status(self, name: str) -> list[QueueStatus]:
        layout = self._known_layout(name)
        rows = []
        for broker, answer in self.fan_out(
            layout.brokers, lambda b: b.topic_status(name), skip_missing=True
        ):
            for row in answer:
                queue_id = layout.cluster_queue(broker, row.queue_id)
                perm = row.perm if queue_id < layout.writable else _read_only(row.perm)
                rows.append(replace(row, queue_id=queue_id, perm=perm))
        return sorted(rows, key=lambda row: row.queue_id)

    def route(self, topic: str) -> list[QueueRoute]:
        config = self.get_topic(topic)
        accepted = config.accepted_types()
        layout = self.layout(topic)
        # A drained broker's queues are read-only (as a wiped RocketMQ broker's are).
        perms = {
            b: config.perm if self.is_writable(b) else config.perm.replace("w", "") or "-"
            for b in layout.brokers
        }
        # Queues above the writable count are read-only until drained (a shrunk topic).
        return [
            QueueRoute(
                topic,
                q.queue_id,
                perms[q.broker] if q.queue_id < layout.writable else _read_only(perms[q.broker]),
                accepted,
                broker=q.broker,
            )
            for q in layout.queues
        ]

    def _known_layout(self, name: str) -> Layout:
        layout = self.layout(name)
        if not layout.queues:
            raise TopicNotFound(name)
        return layout

    @staticmethod
    def _topic_config(
        name: str,
        layout: Layout,
        kind: MessageType,
        perm: str,
        created_ms: int,
        trace: bool = True,
    ) -> TopicConfig:
        readable = len(layout.queues)
        return TopicConfig(name, kind, layout.writable, perm, readable, created_ms, trace)

    # -- consumer groups -----------------------------------------------------------------------

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
        settings: dict[str, Any] = {
            "fifo": fifo,
            "max_delivery_attempts": max_delivery_attempts,
            "retry_policy": retry_policy,
            "consume_from": consume_from or self.config.default_consume_from,
            "consume_enabled": consume_enabled,
            "broadcast": broadcast,
        }
        wanted = GroupConfig(name, **{k: v for k, v in settings.items() if v is not None})
        stored, created = self.on_loop(self.metadata.create_group(wanted))
        for broker in self.connected().values():
            # GroupExists: created by an earlier attempt, or by a consumer (auto-creation).
            with contextlib.suppress(GroupExists):
                broker.create_group(
                    name,
                    fifo=stored.fifo,
                    max_delivery_attempts=stored.max_delivery_attempts,
                    retry_policy=stored.retry_policy,
                    consume_from=stored.consume_from,
                    consume_enabled=stored.consume_enabled,
                    broadcast=stored.broadcast,
                )
        self.on_loop(self.view.wait_for(lambda v: name in v.groups, VIEW_CATCH_UP_S))
        if not created:
            raise GroupExists(name)
        return stored

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        if name in self.view.groups:
            self.on_loop(
                self.metadata.update_group(
                    name, lambda g: GroupConfig.from_dict({**g.to_dict(), **_plain(changes)})
                )
            )
        answers = self.fan_out(
            list(self.connected()), lambda b: b.update_group(name, **changes), skip_missing=True
        )
        if not answers:
            raise GroupNotFound(name)
        return answers[0][1]

    def delete_group(self, name: str) -> None:
        self.fan_out(list(self.connected()), lambda b: b.delete_group(name), skip_missing=True)
        self.on_loop(self.metadata.delete_group(name))

    def get_group(self, name: str) -> GroupConfig:
        stored = self.view.groups.get(name)
        if stored is not None:
            return stored
        return self.any_broker().get_group(name)  # auto-creation, when the brokers allow it

    def find_group(self, name: str) -> GroupConfig | None:
        stored = self.view.groups.get(name)
        if stored is not None:
            return stored
        return self.any_broker().find_group(name)

    def list_groups(self) -> list[GroupConfig]:
        groups = dict(self.view.groups)
        for _, answer in self.fan_out(list(self.connected()), lambda b: b.list_groups()):
            for group in answer:
                groups.setdefault(group.name, group)
        return [groups[name] for name in sorted(groups)]

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        rows = []
        for broker, answer in self.fan_out(
            list(self.connected()), lambda b: b.group_progress(group, topic), skip_missing=True
        ):
            for row in answer:
                queue = self.layout(row.topic, probe=False).cluster_queue(broker, row.queue_id)
                rows.append(replace(row, queue_id=queue))
        return sorted(rows, key=lambda row: (row.topic, row.queue_id))

    def subscribe(self, group: str, topic: str) -> None:
        self.fan_out(self._known_layout(topic).brokers, lambda b: b.subscribe(group, topic))

    # -- produce -------------------------------------------------------------------------------

    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        parts = self._plan_sends(messages, self._send_layout, self._takes_sends)
        results: list[SendResult | None] = [None] * len(messages)
        for broker, part in parts.items():
            answers = self.broker(broker).send([message for _, message, _ in part])
            for (index, _, layout), result in zip(part, answers, strict=True):
                results[index] = _qualified_result(broker, layout, result)
        return [result for result in results if result is not None]

    async def send_async(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """``send`` on the proxy's event loop: each broker's part through its stream sender.

        Planned from what the proxy already knows (the view's placement, the cached
        writability); when that needs a broker's answer first (a topic etcd does not
        place, writability not asked for a second), the whole call goes to a worker
        thread as ``send``."""
        try:
            parts = self._plan_sends(messages, self._placed_layout, self._takes_sends_now)
        except _NeedsThread:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self.send, messages)
        results: list[SendResult | None] = [None] * len(messages)

        async def send_part(broker: str, part: list[_Planned]) -> None:
            answers = await self.broker(broker).send_async([message for _, message, _ in part])
            for (index, _, layout), result in zip(part, answers, strict=True):
                results[index] = _qualified_result(broker, layout, result)

        if len(parts) == 1:
            [(broker, part)] = parts.items()
            await send_part(broker, part)
        else:
            await asyncio.gather(*(send_part(b, p) for b, p in parts.items()))
        return [result for result in results if result is not None]

    def _plan_sends(
        self,
        messages: Sequence[OutgoingMessage],
        layout_of: Callable[[str], Layout],
        takes_sends: Callable[[str], bool],
    ) -> dict[str, list[_Planned]]:
        """The messages split by broker, each with its queue on that broker."""
        parts: dict[str, list[_Planned]] = {}
        for index, message in enumerate(messages):
            layout = layout_of(message.topic)
            queue_id = message.queue_id
            if message.lite_topic is not None:
                # A lite topic lives on one broker (its store topic, its order, its count
                # against that broker's lite limits): the queue follows the lite topic's name.
                queue_id = self._pick_queue(message, layout.writable)
            elif queue_id is None or layout.writable <= queue_id < len(layout.queues):
                # A queue removed by a shrink takes no more sends (a client's stale route).
                queue_id = self._pick_queue(message, layout.writable)
            where = layout.locate(queue_id)
            if where is None:
                raise IllegalQueueId(
                    f"topic {message.topic!r} has no queue {queue_id} "
                    f"(queues 0..{len(layout.queues) - 1})"
                )
            if not (message.message_group or message.lite_topic) and not takes_sends(where.broker):
                where = self._steer(layout, where, takes_sends)
            if message.queue_id != where.broker_queue:
                message = replace(message, queue_id=where.broker_queue)
            parts.setdefault(where.broker, []).append((index, message, layout))
        return parts

    def _send_layout(self, topic: str) -> Layout:
        """The topic's layout for a send; an unknown topic is created when the cluster's
        settings say so (``broker.auto_create_topics``), as local mode does."""
        layout = self.layout(topic)
        if not layout.queues and self._auto_create(topic) is not None:
            layout = self.layout(topic)
        if not layout.queues:
            raise TopicNotFound(topic)
        return layout

    def _placed_layout(self, topic: str) -> Layout:
        """The topic's layout from the view alone (cached while its placement is the same)."""
        placed = self.view.topic(topic)
        if placed is None:
            raise _NeedsThread  # not placed by etcd: the brokers are asked (probe)
        cached = self._layouts.get(topic)
        if cached is not None and cached[0] is placed:
            return cached[1]
        layout = Layout(topic, placed.queues, placed.writable)
        if not layout.queues:
            raise TopicNotFound(topic)
        if len(self._layouts) >= LAYOUTS_CACHED:
            self._layouts.clear()
        self._layouts[topic] = (placed, layout)
        return layout

    def _takes_sends_now(self, broker: str) -> bool:
        if not self.is_reachable(broker):
            return False
        writable = self.writable_known(broker)
        if writable is None:
            raise _NeedsThread  # not asked for a second: asking blocks
        return writable

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Written[list[SendResult]]:
        # Each broker answers once its writes are durable, so the result is already durable.
        return Written(self.send(messages), _done())

    def _steer(
        self, layout: Layout, chosen: QueueAssignment, takes_sends: Callable[[str], bool]
    ) -> QueueAssignment:
        """A queue on a reachable broker instead of ``chosen``, whose broker is down.

        Only for messages without a message group: their queue carries no meaning, and a
        client retrying the same queue (as the official Python client does) would otherwise
        fail until its next route refresh. A FIFO message keeps its queue (its order)."""
        live = [q for q in layout.queues if q.queue_id < layout.writable and takes_sends(q.broker)]
        if not live:
            return chosen  # nothing better: the send fails with BROKER_UNAVAILABLE
        return live[next(self._round_robin) % len(live)]

    def _takes_sends(self, broker: str) -> bool:
        return self.is_reachable(broker) and self.is_writable(broker)

    def _pick_queue(self, message: OutgoingMessage, queue_count: int) -> int:
        if message.lite_topic is not None:
            return zlib.crc32(message.lite_topic.encode()) % queue_count
        if message.message_group:
            return zlib.crc32(message.message_group.encode()) % queue_count
        return next(self._round_robin) % queue_count

    def recall(self, topic: str, recall_handle: str) -> str:
        broker, own = unqualify(recall_handle, "recall handle")
        return self.broker(broker).recall(topic, own)

    # -- transactions --------------------------------------------------------------------------

    def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> TxnState:
        broker, own = unqualify(transaction_id, "transaction id")
        return self.broker(broker).end_transaction(
            topic, message_id, own, resolution, source, producer_group
        )

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> Written[EndResult]:
        broker, own = unqualify(transaction_id, "transaction id")
        return self.broker(broker).end_transaction_nowait(
            topic, message_id, own, resolution, source, producer_group
        )

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Written[EndResult] | HalfmoonError]:
        return end_each(self, requests)  # no batching across the internal protocol (yet)

    def end_transaction_group(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> int:
        return self.end_transaction_group_nowait(
            group_id, resolution, source, consume_actions
        ).result

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> Written[int]:
        # The seam with transaction groups spanning brokers: any broker takes the call and
        # forwards it to the group's coordinator broker (halfmoon/cluster/txn_groups.py),
        # which decides first and then has the participants apply the decision.
        decided = self.any_broker().end_transaction_group(
            group_id, resolution, source, consume_actions
        )
        return Written(decided, _done())

    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.broker(broker).transactional_ack(transaction_group, group, topic, own)

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.broker(broker).transactional_reject(
            transaction_group, group, topic, own, delay_ms, dead_letter
        )

    def transactional_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        _, where = self._queue(topic, queue_id)
        self.broker(where.broker).transactional_offset(
            transaction_group, group, topic, where.broker_queue, offset, expected
        )

    def list_transactions(
        self, topic: str | None = None, limit: int = 1000
    ) -> list[TransactionInfo]:
        found: list[TransactionInfo] = []
        for broker, answer in self.fan_out(
            list(self.connected()), lambda b: b.list_transactions(topic, limit), skip_missing=True
        ):
            found.extend(
                replace(t, transaction_id=qualify(broker, t.transaction_id)) for t in answer
            )
        return found[:limit]

    def parked_transactions(self, limit: int = 1000) -> list[TransactionInfo]:
        found: list[TransactionInfo] = []
        for broker, answer in self.fan_out(
            list(self.connected()), lambda b: b.parked_transactions(limit)
        ):
            found.extend(
                replace(t, transaction_id=qualify(broker, t.transaction_id)) for t in answer
            )
        return found[:limit]

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        broker, own = unqualify(transaction_id, "transaction id")
        info = self.broker(broker).resume_transaction(own)
        return replace(info, transaction_id=transaction_id)

    def transaction_stats(self) -> TransactionStats:
        return self.any_broker().transaction_stats()

    # -- consume by pop ------------------------------------------------------------------------

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
        layout = self._known_layout(topic)
        if queue_id is not None:
            where = layout.locate(queue_id)
            if where is None:
                raise IllegalQueueId(f"topic {topic!r} has no queue {queue_id}")
            views = self.broker(where.broker).receive(
                group, topic, filter, batch_size, invisible_ms, client_id, where.broker_queue
            )
            return [_qualified_view(where.broker, layout, v) for v in views]
        brokers = layout.brokers
        start = next(self._round_robin) % len(brokers)
        got: list[MessageView] = []
        down = 0
        for broker in brokers[start:] + brokers[:start]:
            if len(got) >= batch_size:
                break
            if not self.is_reachable(broker):
                down += 1  # its queues wait for it; the others keep serving
                continue
            try:
                views = self.broker(broker).receive(
                    group, topic, filter, batch_size - len(got), invisible_ms, client_id
                )
            except NotFound:
                continue  # this broker has not seen the group or topic yet
            except (BrokerUnavailable, BrokerDeadlineExceeded):
                down += 1  # went down meanwhile
                continue
            got.extend(_qualified_view(broker, layout, v) for v in views)
        if down == len(brokers):
            raise BrokerUnavailable(f"no broker holding topic {topic!r} is reachable")
        return got

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        times = [
            t
            for _, t in self.fan_out(
                self._known_layout(topic).brokers,
                lambda b: b.next_wakeup_ms(group, topic, client_id),
                skip_missing=True,
            )
            if t is not None
        ]
        return min(times, default=None)

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.broker(broker).ack(group, topic, own, lite_topic)

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        broker, own = unqualify(receipt_handle, "receipt handle")
        fresh = self.broker(broker).change_invisible_duration(
            group, topic, own, invisible_ms, lite_topic
        )
        return qualify(broker, fresh)

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.broker(broker).forward_to_dead_letter(group, topic, own, lite_topic)


def _plain(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Group changes as GroupConfig.from_dict reads them (a retry policy as its dict)."""
    return {
        key: value.to_dict() if isinstance(value, RetryPolicy) else value
        for key, value in changes.items()
        if value is not None
    }


def _qualified_result(broker: str, layout: Layout, result: SendResult) -> SendResult:
    return replace(
        result,
        queue_id=layout.cluster_queue(broker, result.queue_id),
        transaction_id=qualify(broker, result.transaction_id) if result.transaction_id else None,
        recall_handle=qualify(broker, result.recall_handle) if result.recall_handle else None,
    )


def _qualified_view(broker: str, layout: Layout, view: MessageView) -> MessageView:
    return replace(
        view,
        queue_id=layout.cluster_queue(broker, view.queue_id),
        receipt_handle=qualify(broker, view.receipt_handle) if view.receipt_handle else None,
        transaction_id=qualify(broker, view.transaction_id) if view.transaction_id else None,
    )


def _qualified_info(broker: str, info: TransactionInfo) -> TransactionInfo:
    return replace(info, transaction_id=qualify(broker, info.transaction_id))
