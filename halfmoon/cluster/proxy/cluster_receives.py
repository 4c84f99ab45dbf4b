"""Consumption by pop through a proxy: a receive asks the brokers holding the topic in
turn, starting at a rotating one, until the batch is full; an ack, a change of invisible
time or a forward to the dead-letter queue goes to the broker its receipt handle names."""

from __future__ import annotations

import itertools
from dataclasses import replace

from halfmoon.broker.errors import IllegalQueueId
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView
from halfmoon.cluster.internal.wire import BrokerDeadlineExceeded, BrokerUnavailable
from halfmoon.cluster.proxy.broker_pool import BrokerPool
from halfmoon.cluster.proxy.cluster_topics import ClusterTopics
from halfmoon.cluster.proxy.routing import Layout, qualify, unqualify
from halfmoon.errors import NotFound


class ClusterReceives:
    """The pop operations of the facade over the pool's brokers, receipt handles qualified
    with the broker that issued them."""

    def __init__(self, pool: BrokerPool, topics: ClusterTopics) -> None:
        self.pool = pool
        self.topics = topics  # a topic's layout, TopicNotFound when it has none
        self._rotation = itertools.count()  # the broker a receive asks first

    def receive(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
        holder: str = "",
    ) -> list[MessageView]:
        layout = self.topics.known_layout(topic)
        if queue_id is not None:
            where = layout.locate(queue_id)
            if where is None:
                raise IllegalQueueId(f"topic {topic!r} has no queue {queue_id}")
            views = self.pool.broker(where.broker).receive(
                group, topic, filter, batch_size, invisible_ms, client_id, where.broker_queue,
                holder,
            )  # fmt: skip
            return [_qualified_view(where.broker, layout, v) for v in views]
        brokers = layout.brokers
        start = next(self._rotation) % len(brokers)
        got: list[MessageView] = []
        down = 0
        for broker in brokers[start:] + brokers[:start]:
            if len(got) >= batch_size:
                break
            if not self.pool.is_reachable(broker):
                down += 1  # its queues wait for it; the others keep serving
                continue
            try:
                views = self.pool.broker(broker).receive(
                    group, topic, filter, batch_size - len(got), invisible_ms, client_id, None,
                    holder,
                )  # fmt: skip
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
            for _, t in self.pool.fan_out(
                self.topics.known_layout(topic).brokers,
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
        self.pool.broker(broker).ack(group, topic, own, lite_topic)

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        broker, own = unqualify(receipt_handle, "receipt handle")
        fresh = self.pool.broker(broker).change_invisible_duration(
            group, topic, own, invisible_ms, lite_topic
        )
        return qualify(broker, fresh)

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.pool.broker(broker).forward_to_dead_letter(group, topic, own, lite_topic)


def _qualified_view(broker: str, layout: Layout, view: MessageView) -> MessageView:
    return replace(
        view,
        queue_id=layout.cluster_queue(broker, view.queue_id),
        receipt_handle=qualify(broker, view.receipt_handle) if view.receipt_handle else None,
        transaction_id=qualify(broker, view.transaction_id) if view.transaction_id else None,
    )
