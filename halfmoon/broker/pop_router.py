"""Pop consumption over every kind of topic: a lite topic's messages live in
one queue per lite topic with their own pop service (:mod:`lite`); every other
topic's are popped by the broker's :class:`~halfmoon.broker.pop.PopService`.
This module sends each call to the one that owns the topic."""

from __future__ import annotations

from collections.abc import Callable

from halfmoon.broker.access import check_queue
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.lite import LiteTopics
from halfmoon.broker.message import MessageType, MessageView
from halfmoon.broker.pop import PopService
from halfmoon.broker.topics import TopicConfig, TopicRegistry


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
    ) -> None:
        self._pop = pop
        self._lite = lite
        self._topics = topics
        self._filters = filters
        self._config = config
        self._check_consumable = check_consumable
        self._delivered = delivered  # (group, topic, count): the traffic counters

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
            check_queue(config, queue_id)
        compiled = self._filters.get(filter)
        invisible_ms = invisible_ms or self._config.default_invisible_ms
        if config.message_type is MessageType.LITE:  # the lite topics client_id subscribes to
            views = self._lite.receive(
                group, topic, client_id, compiled.compiled, batch_size, invisible_ms
            )
        else:
            views = self._pop.receive(
                group, topic, compiled.compiled, batch_size, invisible_ms, queue_id
            )
        self._delivered(group, topic, len(views))
        return views

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
