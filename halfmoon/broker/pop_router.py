"""Pop consumption over every kind of topic: a lite topic's messages live in
one queue per lite topic with their own pop service (:mod:`lite`); every other
topic's are popped by the broker's :class:`~halfmoon.broker.pop.PopService`.
This module sends each call to the one that owns the topic."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from halfmoon.broker import broker_metrics
from halfmoon.broker.access import check_queue
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.facade import Answer, Pending, Written, acked_each, received_by_calls
from halfmoon.broker.facade_types import ALREADY_DURABLE
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.lite import LiteTopics
from halfmoon.broker.message import MessageType, MessageView, Received
from halfmoon.broker.pop import PopService
from halfmoon.broker.topics import TopicConfig, TopicRegistry
from halfmoon.broker.trace import TraceRecorder, position_key


class PopRouter:
    def __init__(
        self,
        pop: PopService,
        lite: LiteTopics,
        topics: TopicRegistry,
        filters: FilterCache,
        config: BrokerConfig,
        *,
        check_consumable: Callable[[str, str], TopicConfig],
        delivered: Callable[[str, str, int], None],
        find_group: Callable[[str], object | None],
        trace: TraceRecorder | None = None,
        counted: Callable[[str, str, str, int], None] | None = None,
    ) -> None:
        self._pop = pop
        self._lite = lite
        self._topics = topics
        self._filters = filters
        self._config = config
        self._check_consumable = check_consumable
        self._delivered = delivered  # (group, topic, count): the traffic counters
        self._find_group = find_group  # no auto-creation
        self._trace = trace
        # (kind, group, topic, count) for "acked" and "redelivered": the rate charts' series.
        self._counted = counted or (lambda kind, group, topic, count: None)

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
        config = self._check_consumable(group, topic)
        if queue_id is not None:
            check_queue(config, queue_id)
        compiled = self._filters.get(filter)
        invisible_ms = invisible_ms or self._config.default_invisible_ms
        if config.message_type is MessageType.LITE:  # the lite topics client_id subscribes to
            views = self._lite.receive(
                group, topic, client_id, compiled.compiled, batch_size, invisible_ms
            )
        else:
            views = self._pop.receive(
                group, topic, compiled.compiled, batch_size, invisible_ms, queue_id, holder
            )
        self._after_delivery(group, topic, client_id, invisible_ms, views)
        return views

    def _after_delivery(
        self, group: str, topic: str, client_id: str, invisible_ms: int, views: list[MessageView]
    ) -> None:
        """The traffic counters and the message traces of a receive's deliveries."""
        self._delivered(group, topic, len(views))
        broker_metrics.received(group, topic, views)
        again = sum(1 for view in views if view.delivery_attempt > 1)
        if again:
            self._counted("redelivered", group, topic, again)
        trace = self._trace
        if views and trace is not None and trace.enabled(topic):
            for view in views:
                trace.add(
                    position_key(view.commit_log_offset),
                    "delivered",
                    {
                        "group": group,
                        "attempt": view.delivery_attempt,
                        "mode": "pop",
                        "client": client_id,
                        "invisible_ms": invisible_ms,
                    },
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
        holder: str = "",
    ) -> Answer[Received]:
        """:meth:`receive`, Written if it can neither block nor write; else Pending, its
        write the plain :meth:`receive` (on a worker thread). Only an existing group's
        receive from an existing ordinary topic qualifies: the rest may create metadata on
        disk, and a lite topic's receive walks its own service."""
        args = (group, topic, filter, batch_size, invisible_ms, client_id, queue_id, holder)
        received = self._received_now(*args)
        if received is not None:
            return Written(received, ALREADY_DURABLE)
        return Pending(partial(received_by_calls, self, *args))

    def _received_now(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str,
        queue_id: int | None,
        holder: str,
    ) -> Received | None:
        config = self._topics.find(topic)
        if config is None or config.message_type is MessageType.LITE:
            return None
        if self._find_group(group) is None:
            return None
        config = self._check_consumable(group, topic)
        if queue_id is not None:
            check_queue(config, queue_id)
        compiled = self._filters.get(filter)
        invisible_ms = invisible_ms or self._config.default_invisible_ms
        received = self._pop.receive_nowait(
            group, topic, compiled.compiled, batch_size, invisible_ms, queue_id, holder
        )
        if received is not None:
            self._after_delivery(group, topic, client_id, invisible_ms, received.views)
        return received

    def subscribe(self, group: str, topic: str) -> None:
        if self._check_consumable(group, topic).message_type is not MessageType.LITE:
            self._pop.subscribe(group, topic)  # lite topics: SyncLiteSubscription says what

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        if self._is_lite(topic):
            self._lite.ack(group, topic, lite_topic, receipt_handle)
        else:
            self._pop.ack(group, topic, receipt_handle)
        broker_metrics.acked(group, topic)
        self._counted("acked", group, topic, 1)

    def ack_nowait(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> Answer[list[Exception | None]]:
        handles = list(receipt_handles)
        batch = None if self._is_lite(topic) else self._pop.ack_many_nowait(group, topic, handles)
        if batch is None:  # a lite topic (per lite topic), or the group's state busy
            return Pending(partial(acked_each, self, group, topic, handles))
        acked = sum(1 for error in batch[0] if error is None)
        broker_metrics.acked(group, topic, acked)
        self._counted("acked", group, topic, acked)
        return Written(*batch)

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        if self._is_lite(topic):
            return self._lite.change_invisible_duration(
                group, topic, lite_topic, receipt_handle, invisible_ms
            )
        return self._pop.change_invisible_duration(group, topic, receipt_handle, invisible_ms)

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        if self._is_lite(topic):
            self._lite.forward_to_dead_letter(group, topic, lite_topic, receipt_handle)
        else:
            self._pop.forward_to_dead_letter(group, topic, receipt_handle)

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        if self._is_lite(topic):
            return self._lite.next_wakeup_ms(group, topic, client_id)
        return self._pop.next_wakeup_ms(group, topic)

    def _is_lite(self, topic: str) -> bool:
        """Whether ``topic`` is a lite parent (then a handle's ``lite_topic`` names its queue)."""
        config = self._topics.find(topic)
        return config is not None and config.message_type is MessageType.LITE
