"""Topics and consumer groups of a cluster: written to etcd first, the record every proxy
routes by, then created on the brokers that hold them.

A topic's queues are placed over the brokers by :mod:`halfmoon.cluster.coordination.placement`; a
change of its queue count never moves a queue. Groups live on every broker. What etcd
does not know (a broker's own dead-letter and retry topics) is read from the brokers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from halfmoon.broker.config import DEFAULT_QUEUE_COUNT
from halfmoon.broker.errors import (
    GroupExists,
    GroupNotFound,
    IllegalQueueId,
    TopicExists,
    TopicNotFound,
)
from halfmoon.broker.facade import QueueProgress, QueueRoute, QueueStatus
from halfmoon.broker.groups import DEFAULT_MAX_DELIVERY_ATTEMPTS, GroupConfig, RetryPolicy
from halfmoon.broker.message import MessageType
from halfmoon.broker.topics import TopicConfig, check_queue_count, is_reserved
from halfmoon.cluster.coordination.placement import grow_queues
from halfmoon.cluster.errors import CoordinatorConflict
from halfmoon.cluster.proxy.broker_pool import BrokerPool
from halfmoon.cluster.proxy.routing import Layout

# A topic created through this proxy is routable here before create_topic returns.
VIEW_CATCH_UP_S = 5.0


def _read_only(perm: str) -> str:
    return perm.replace("w", "") or "-"


class ClusterTopics:
    """The topic and group operations of the facade, over etcd and the pool's brokers."""

    def __init__(self, pool: BrokerPool) -> None:
        self.pool = pool

    # -- topics --------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = DEFAULT_QUEUE_COUNT,
        perm: str = "rw",
        brokers: Sequence[str] = (),
    ) -> TopicConfig:
        stored, created = self.pool.on_loop(
            self.pool.metadata.create_topic(
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
                self.pool.broker(broker).create_topic(name, kind, share, stored.perm)
        self.pool.on_loop(
            self.pool.view.wait_for(lambda v: v.topic(name) is not None, VIEW_CATCH_UP_S)
        )
        if not created:
            raise TopicExists(name)
        return self._topic_config(
            name, self.pool.layout(name), kind, stored.perm, stored.created_ms
        )

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
    ) -> TopicConfig:
        layout = self.known_layout(name)
        if queue_count is not None and queue_count != layout.writable:
            self._change_queue_count(name, queue_count)
            layout = self.known_layout(name)
        if perm is not None:
            self.pool.on_loop(self.pool.metadata.set_topic_perm(name, perm))
        if trace is not None:
            self.pool.on_loop(self.pool.metadata.set_topic_trace(name, trace))
            self.pool.on_loop(
                self.pool.view.wait_for(
                    lambda v: getattr(v.topic(name), "trace", trace) == trace, VIEW_CATCH_UP_S
                )
            )
        for broker in layout.brokers:
            # The trace switch lives on each broker holding the topic (its trace is theirs).
            self.pool.broker(broker).update_topic(
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
        placed = self.pool.view.topic(name)
        if placed is None:
            raise IllegalQueueId(
                f"topic {name!r} was not placed by the cluster (a broker made it): its queue "
                "count is the brokers'"
            )
        live = self.pool.on_loop(self.pool.metadata.live_brokers())
        changed = grow_queues(placed, queue_count, live)
        kind = MessageType(changed.message_type)
        for broker in changed.brokers:
            share = len(changed.queues_on(broker))
            if share == len(placed.queues_on(broker)):
                continue
            if not placed.queues_on(broker):
                with contextlib.suppress(TopicExists):
                    self.pool.broker(broker).create_topic(name, kind, share, changed.perm)
            # A broker's queues all stay writable at the broker: read-only is the
            # cluster's word (routes and sends), so a later grow can reopen them.
            self.pool.broker(broker).update_topic(name, queue_count=share)
        stored = self.pool.on_loop(
            self.pool.metadata.update_topic(
                name,
                lambda t: grow_queues(t, queue_count, live) if t.queues == placed.queues else t,
            )
        )
        if stored.queues != changed.queues or stored.writable != queue_count:
            raise CoordinatorConflict(
                f"topic {name!r} changed while its queue count was being changed; retry"
            )
        self.pool.on_loop(
            self.pool.view.wait_for(
                lambda v: (
                    getattr(v.topic(name), "writable", None) == queue_count
                    and len(getattr(v.topic(name), "queues", ())) == len(changed.queues)
                ),
                VIEW_CATCH_UP_S,
            )
        )

    def delete_topic(self, name: str) -> None:
        layout = self.known_layout(name)
        for broker in layout.brokers:
            with contextlib.suppress(TopicNotFound):
                self.pool.broker(broker).delete_topic(name)
        self.pool.on_loop(self.pool.metadata.delete_topic(name))

    def unused_topics(self, *, delete: bool = False) -> list[tuple[str, str]]:
        """RocketMQ's cleanUnusedTopic: the (broker, topic) pairs a reachable broker holds
        though etcd has no record of the topic (a broker's own topics, ``%DLQ%``, ``%RETRY%``
        and the system ones, are never unused); with ``delete``, each is deleted there.

        etcd is read after the brokers were listed: a topic is written to etcd before any
        broker creates it and leaves etcd only after every broker deleted it, so a topic
        being created or deleted meanwhile is never taken for an unused one."""
        held = self.pool.fan_out(
            sorted(self.pool.connected()),
            lambda b: [t.name for t in b.list_topics()],
            skip_missing=True,
        )
        known = {t.name for t in self.pool.on_loop(self.pool.metadata.list_topics())}
        unused = [
            (broker, name)
            for broker, names in held
            for name in sorted(names)
            if name not in known and not is_reserved(name)
        ]
        if delete:
            for broker, name in unused:
                with contextlib.suppress(TopicNotFound):
                    self.pool.broker(broker).delete_topic(name)
        return unused

    def get_topic(self, name: str) -> TopicConfig:
        found = self.find_topic(name) or self.auto_create(name)
        if found is None:
            raise TopicNotFound(name)
        return found

    def auto_create(self, name: str) -> TopicConfig | None:
        """With ``broker.auto_create_topics``, create unknown topic ``name`` cluster-wide, as
        local mode does on first send or route query: a mixed topic of the default queue
        count, spread over the live brokers. Two proxies racing both end with the one record
        etcd's compare-and-swap kept (the loser's ``create_topic`` still makes sure every
        owning broker holds its share, then says ``TopicExists``)."""
        config = self.pool.any_broker().config
        if not config.auto_create_topics or is_reserved(name):
            return None
        with contextlib.suppress(TopicExists):
            self.create_topic(name, MessageType.MIXED, config.default_queue_count)
        return self.find_topic(name)

    def find_topic(self, name: str) -> TopicConfig | None:
        placed = self.pool.view.topic(name)
        if placed is not None:
            return self._topic_config(
                name,
                Layout(name, placed.queues, placed.writable),
                MessageType(placed.message_type),
                placed.perm,
                placed.created_ms,
                placed.trace,
            )
        layout = self.pool.layout(name)
        if not layout.queues:
            return None
        first = self.pool.broker(layout.brokers[0]).find_topic(name)
        if first is None:
            return None
        return replace(first, queue_count=len(layout.queues), read_queue_count=len(layout.queues))

    def list_topics(self) -> list[TopicConfig]:
        topics = {t.name: t for t in (self.find_topic(n) for n in self.pool.view.topics) if t}
        for _, answer in self.pool.fan_out(list(self.pool.connected()), lambda b: b.list_topics()):
            for topic in answer:
                if topic.name not in topics:
                    found = self.find_topic(topic.name)
                    if found is not None:
                        topics[topic.name] = found
        return [topics[name] for name in sorted(topics)]

    def topic_status(self, name: str) -> list[QueueStatus]:
        layout = self.known_layout(name)
        rows = []
        for broker, answer in self.pool.fan_out(
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
        layout = self.pool.layout(topic)
        # A drained broker's queues are read-only (as a wiped RocketMQ broker's are).
        perms = {
            b: config.perm if self.pool.is_writable(b) else config.perm.replace("w", "") or "-"
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

    def known_layout(self, name: str) -> Layout:
        layout = self.pool.layout(name)
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
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        retry_policy: RetryPolicy | None = None,
        consume_from: str | None = None,
        consume_enabled: bool = True,
        broadcast: bool = False,
    ) -> GroupConfig:
        settings: dict[str, Any] = {
            "fifo": fifo,
            "max_delivery_attempts": max_delivery_attempts,
            "retry_policy": retry_policy,
            "consume_from": consume_from or self.pool.any_broker().config.default_consume_from,
            "consume_enabled": consume_enabled,
            "broadcast": broadcast,
        }
        wanted = GroupConfig(name, **{k: v for k, v in settings.items() if v is not None})
        stored, created = self.pool.on_loop(self.pool.metadata.create_group(wanted))
        for broker in self.pool.connected().values():
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
        self.pool.on_loop(self.pool.view.wait_for(lambda v: name in v.groups, VIEW_CATCH_UP_S))
        if not created:
            raise GroupExists(name)
        return stored

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        if name in self.pool.view.groups:
            self.pool.on_loop(
                self.pool.metadata.update_group(
                    name, lambda g: GroupConfig.from_dict({**g.to_dict(), **_plain(changes)})
                )
            )
        answers = self.pool.fan_out(
            list(self.pool.connected()),
            lambda b: b.update_group(name, **changes),
            skip_missing=True,
        )
        if not answers:
            raise GroupNotFound(name)
        return answers[0][1]

    def delete_group(self, name: str) -> None:
        self.pool.fan_out(
            list(self.pool.connected()), lambda b: b.delete_group(name), skip_missing=True
        )
        self.pool.on_loop(self.pool.metadata.delete_group(name))

    def get_group(self, name: str) -> GroupConfig:
        stored = self.pool.view.groups.get(name)
        if stored is not None:
            return stored
        return self.pool.any_broker().get_group(name)  # auto-creation, when the brokers allow it

    def find_group(self, name: str) -> GroupConfig | None:
        stored = self.pool.view.groups.get(name)
        if stored is not None:
            return stored
        return self.pool.any_broker().find_group(name)

    def list_groups(self) -> list[GroupConfig]:
        groups = dict(self.pool.view.groups)
        for _, answer in self.pool.fan_out(list(self.pool.connected()), lambda b: b.list_groups()):
            for group in answer:
                groups.setdefault(group.name, group)
        return [groups[name] for name in sorted(groups)]

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        rows = []
        for broker, answer in self.pool.fan_out(
            list(self.pool.connected()), lambda b: b.group_progress(group, topic), skip_missing=True
        ):
            for row in answer:
                queue = self.pool.layout(row.topic, probe=False).cluster_queue(broker, row.queue_id)
                rows.append(replace(row, queue_id=queue))
        return sorted(rows, key=lambda row: (row.topic, row.queue_id))

    def subscribe(self, group: str, topic: str) -> None:
        self.pool.fan_out(self.known_layout(topic).brokers, lambda b: b.subscribe(group, topic))


def _plain(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Group changes as GroupConfig.from_dict reads them (a retry policy as its dict)."""
    return {
        key: value.to_dict() if isinstance(value, RetryPolicy) else value
        for key, value in changes.items()
        if value is not None
    }
