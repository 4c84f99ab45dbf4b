"""The reads of :class:`~halfmoon.cluster.proxy.cluster_broker.ClusterBroker` that address queues
by (broker, queue): pull, offsets, stored messages, lite topics.

A cluster queue id is translated to its broker and that broker's queue id on
the way in and back on the way out (:class:`~halfmoon.cluster.proxy.routing.Layout`);
whole-topic operations ask every broker holding the topic and merge.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import grpc

from halfmoon.broker.browse import ScanResult
from halfmoon.broker.errors import IllegalQueueId, TopicNotFound
from halfmoon.broker.facade import PullResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.lite import OffsetOption
from halfmoon.broker.message import MessageView
from halfmoon.cluster.coordination.placement import QueueAssignment
from halfmoon.cluster.internal.replica_reads import COMMIT_WAIT_S, READS
from halfmoon.cluster.proxy.broker_pool import BrokerPool
from halfmoon.cluster.proxy.routing import Layout
from halfmoon.errors import HalfmoonError
from halfmoon.store.reader import MessageNotFound

log = logging.getLogger("halfmoon.cluster.reads")


class ClusterReads:
    """Pull, offsets, stored messages and lite topics over the pool's brokers."""

    def __init__(self, pool: BrokerPool) -> None:
        self.pool = pool

    def locate(self, topic: str, queue_id: int) -> tuple[Layout, QueueAssignment]:
        """The topic's layout, and the broker and broker queue of its cluster queue
        ``queue_id`` (TopicNotFound, IllegalQueueId when there is none)."""
        layout = self.pool.layout(topic)
        if not layout.queues:
            raise TopicNotFound(topic)
        where = layout.locate(queue_id)
        if where is None:
            raise IllegalQueueId(
                f"topic {topic!r} has no queue {queue_id} (queues 0..{len(layout.queues) - 1})"
            )
        return layout, where

    def _view(self, broker: str, layout: Layout, view: MessageView) -> MessageView:
        return replace(view, queue_id=layout.cluster_queue(broker, view.queue_id))

    def _from_replica(self, broker: str, operation: str, args: list[Any]) -> PullResult | None:
        """The read served by one of the group's in-sync replicas when the group enables
        replica reads; None (ask the master) otherwise, or when the replica answers an error.
        The queue was checked against the cluster's placement (``locate``); a replica has no
        topic or group table of its own."""
        endpoint = self.pool.replica_reads.pick(broker)
        if endpoint is None:
            return None
        try:
            result = self.pool.replica_reads.read(endpoint, operation, args)
            if not result.messages:
                # Nothing here yet: if the master holds more, the replica may not have heard
                # the group acknowledge it (a long poll woken by the master's arrival notice
                # gets here first); it waits a moment for its committed point.
                _, topic, queue_id = args[:3]
                if (
                    self.pool.broker(broker).query_offset(topic, queue_id, "end")
                    > result.max_offset
                ):
                    result = self.pool.replica_reads.read(endpoint, operation, args, COMMIT_WAIT_S)
        except (grpc.RpcError, HalfmoonError, TypeError, ValueError) as error:
            log.info(
                "event=replica_read_failed broker=%s replica=%s error=%s", broker, endpoint, error
            )
            READS.inc(group=broker, answered_by="master")
            return None
        READS.inc(group=broker, answered_by="replica")
        return result

    # -- consume by pull (offsets) -------------------------------------------------------------

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        layout, where = self.locate(topic, queue_id)
        args: list[Any] = [group, topic, where.broker_queue, offset, batch_size, filter]
        result = self._from_replica(where.broker, "pull", args)
        if result is None:
            result = self.pool.broker(where.broker).pull(*args)
        result.messages = [self._view(where.broker, layout, m) for m in result.messages]
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
        layout, where = self.locate(topic, queue_id)
        queue = where.broker_queue
        args: list[Any] = [group, topic, queue, offset, max_messages, max_bytes, filter, end_offset]
        result = self._from_replica(where.broker, "bulk_read", args)
        if result is None:
            result = self.pool.broker(where.broker).bulk_read(*args)
        result.messages = [self._view(where.broker, layout, m) for m in result.messages]
        return result

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        _, where = self.locate(topic, queue_id)
        return self.pool.broker(where.broker).get_offset(group, topic, where.broker_queue)

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        _, where = self.locate(topic, queue_id)
        self.pool.broker(where.broker).update_offset(group, topic, where.broker_queue, offset)

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        _, where = self.locate(topic, queue_id)
        return self.pool.broker(where.broker).query_offset(
            topic, where.broker_queue, policy, timestamp
        )

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        layout = self.pool.layout(topic)
        applied: dict[int, int] = {}
        for broker, answer in self.pool.fan_out(
            layout.brokers, lambda b: b.reset_offset(group, topic, timestamp)
        ):
            for queue, offset in answer.items():
                applied[layout.cluster_queue(broker, queue)] = offset
        return applied

    def seek_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        layout = self.pool.layout(topic)
        by_broker: dict[str, dict[int, int]] = {}
        for queue_id, offset in offsets.items():
            _, where = self.locate(topic, queue_id)
            by_broker.setdefault(where.broker, {})[where.broker_queue] = offset
        # Not atomic across brokers: each broker checks and applies its own queues.
        applied: dict[int, int] = {}
        for broker, part in by_broker.items():
            for queue, offset in self.pool.broker(broker).seek_group(group, topic, part).items():
                applied[layout.cluster_queue(broker, queue)] = offset
        return applied

    # -- reading stored messages ---------------------------------------------------------------

    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        brokers = (
            self.pool.layout(topic).brokers if topic is not None else list(self.pool.connected())
        )
        if topic is not None and not brokers:
            raise TopicNotFound(topic)
        found: list[MessageView] = []
        for broker, answer in self.pool.fan_out(
            brokers, lambda b: b.messages_by_id(message_id, topic), skip_missing=True
        ):
            found.extend(
                self._view(broker, self.pool.layout(v.topic, probe=False), v) for v in answer
            )
        if not found:
            raise MessageNotFound(f"no message with id {message_id!r}")
        return found

    def message_trace(self, message_id: str) -> list[dict[str, Any]]:
        # Each broker traces what it stores: a message's copies and its transaction may live
        # on different brokers; every event says which.
        events = [
            {**event, "broker": broker}
            for broker, answer in self.pool.fan_out(
                list(self.pool.connected()),
                lambda b: b.message_trace(message_id),
                skip_missing=True,
            )
            for event in answer
        ]
        return sorted(events, key=lambda e: e["time_ms"])

    def messages_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int
    ) -> list[MessageView]:
        layout = self.pool.layout(topic)
        found: list[MessageView] = []
        for broker, answer in self.pool.fan_out(
            layout.brokers, lambda b: b.messages_by_key(topic, key, begin_ms, end_ms, limit)
        ):
            found.extend(self._view(broker, layout, v) for v in answer)
        found.sort(key=lambda v: v.store_timestamp)
        return found[:limit]

    def message_at(self, topic: str, queue_id: int, offset: int) -> MessageView:
        layout, where = self.locate(topic, queue_id)
        view = self.pool.broker(where.broker).message_at(topic, where.broker_queue, offset)
        return self._view(where.broker, layout, view)

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
    ) -> ScanResult:
        if queue_id is not None:
            layout, where = self.locate(topic, queue_id)
            parts = [
                (
                    where.broker,
                    self.pool.broker(where.broker).scan(
                        topic,
                        where.broker_queue,
                        offset,
                        begin_ms,
                        end_ms,
                        limit,
                        filter,
                        with_messages,
                    ),
                )
            ]
        else:
            layout = self.pool.layout(topic)
            if not layout.queues:
                raise TopicNotFound(topic)
            parts = self.pool.fan_out(
                layout.brokers,
                lambda b: b.scan(topic, None, None, begin_ms, end_ms, limit, filter, with_messages),
            )
        merged = ScanResult([], 0, 0, {})
        for broker, part in parts:
            merged.messages.extend(self._view(broker, layout, m) for m in part.messages)
            merged.matched += part.matched
            merged.examined += part.examined
            for tag, count in part.tag_counts.items():
                merged.tag_counts[tag] = merged.tag_counts.get(tag, 0) + count
            for queue, next_offset in part.next_offsets.items():
                merged.next_offsets[layout.cluster_queue(broker, queue)] = next_offset
            merged.complete = merged.complete and part.complete
        merged.messages.sort(key=lambda m: m.store_timestamp)
        del merged.messages[limit:]
        merged.tag_counts = dict(sorted(merged.tag_counts.items(), key=lambda kv: -kv[1]))
        return merged

    # -- lite topics (each broker holding the parent topic keeps its own) -------------------------

    def sync_lite_subscription(
        self,
        client_id: str,
        group: str,
        topic: str,
        action: str,
        lite_topics: Sequence[str],
        offset: OffsetOption | None = None,
    ) -> list[str]:
        answers = self.pool.fan_out(
            self.pool.layout(topic).brokers,
            lambda b: b.sync_lite_subscription(
                client_id, group, topic, action, lite_topics, offset
            ),
        )
        if not answers:
            raise TopicNotFound(topic)
        return answers[0][1]

    def list_lite_topics(self, topic: str) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for _, answer in self.pool.fan_out(
            self.pool.layout(topic).brokers, lambda b: b.list_lite_topics(topic)
        ):
            rows.extend(answer)
        return rows

    def client_terminated(self, client_id: str) -> None:
        self.pool.fan_out(list(self.pool.connected()), lambda b: b.client_terminated(client_id))

    def lite_subscriptions(self, topic: str) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for _, answer in self.pool.fan_out(
            self.pool.layout(topic).brokers, lambda b: b.lite_subscriptions(topic)
        ):
            rows.extend(answer)
        return rows

    def delete_lite_topic(self, topic: str, lite_topic: str) -> int:
        return sum(
            told
            for _, told in self.pool.fan_out(
                self.pool.layout(topic).brokers,
                lambda b: b.delete_lite_topic(topic, lite_topic),
                skip_missing=True,
            )
        )
