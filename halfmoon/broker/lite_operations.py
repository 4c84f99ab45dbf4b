"""The lite-topic operations of the ``Broker`` facade (an object the in-process
:class:`halfmoon.broker.broker.Broker` holds and delegates to): consumers'
subscriptions to lite topics (RIP-83) and an operator's listing and deletion. The
subscriptions and queues are :class:`halfmoon.broker.lite.LiteTopics`'; this class
checks first that the topic named is a lite parent the group may consume.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from halfmoon.broker.errors import IllegalTopic
from halfmoon.broker.lite import LiteTopics, OffsetOption, UnsubscribeNotifier
from halfmoon.broker.message import MessageType
from halfmoon.broker.topics import TopicConfig


class LiteOperations:
    def __init__(
        self,
        lite: LiteTopics,
        get_topic: Callable[[str], TopicConfig],
        check_consumable: Callable[[str, str], TopicConfig],
    ) -> None:
        """``get_topic``: the topic's config (auto-created where the broker's settings say
        so); ``check_consumable``: raises unless the group may consume the topic."""
        self._lite = lite
        self._get_topic = get_topic
        self._check_consumable = check_consumable

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
        return self._lite.sync(client_id, group, topic, action, lite_topics, offset)

    def client_terminated(self, client_id: str) -> None:
        self._lite.remove_client(client_id)

    def lite_subscriptions(self, topic: str) -> list[dict[str, object]]:
        self._lite_parent(topic)
        return self._lite.subscriptions(topic)

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        self._lite.set_notifier(notifier)

    def list_lite_topics(self, topic: str) -> list[dict[str, object]]:
        self._lite_parent(topic)
        return self._lite.lite_topics(topic)

    def delete_lite_topic(self, topic: str, lite_topic: str) -> int:
        """Delete a lite topic; its subscribers are told (NotifyUnsubscribeLite).

        Returns how many were told.
        """
        self._lite_parent(topic)
        return self._lite.delete(topic, lite_topic)

    def _lite_parent(self, topic: str) -> TopicConfig:
        config = self._get_topic(topic)
        if config.message_type is not MessageType.LITE:
            raise IllegalTopic(
                f"topic {topic!r} is a {config.message_type.value} topic, not a lite topic; "
                "create the parent with type lite"
            )
        return config
