"""The browsing operations of the ``Broker`` facade (an object the in-process
:class:`halfmoon.broker.broker.Broker` holds and delegates to): operators' reads of
stored messages by id, by key, at an offset and in scans, and a message's trace. The
reads themselves are :mod:`halfmoon.broker.browse`'s; this class finds the topics (and
a lite parent's queues) they read and never auto-creates a topic it only looks at.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import halfmoon.broker.browse as browse
from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.lite import LiteTopics
from halfmoon.broker.message import MessageType, MessageView
from halfmoon.broker.topics import TopicConfig, TopicRegistry
from halfmoon.broker.trace import TraceRecorder, position_key
from halfmoon.errors import NotFound
from halfmoon.store.api import Store


class StoredMessages:
    def __init__(
        self,
        store: Store,
        topics: TopicRegistry,
        list_topics: Callable[[], list[TopicConfig]],
        lite: LiteTopics,
        filters: FilterCache,
        trace: TraceRecorder,
    ) -> None:
        """``list_topics``: the topics an operator sees (internal ones left out)."""
        self._store = store
        self._topics = topics
        self._list_topics = list_topics
        self._lite = lite
        self._filters = filters
        self._trace = trace

    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        topics = self._list_topics() if topic is None else [self._existing_topic(topic)]
        return browse.by_id(self._store, self._store_topics(topics), message_id, topic)

    def message_trace(self, message_id: str) -> list[dict[str, Any]]:
        try:
            copies = browse.by_id(
                self._store, self._store_topics(self._list_topics()), message_id, None
            )
        except NotFound:
            copies = []  # its trace may still hold a transaction that was rolled back
        keys = [message_id, *(position_key(view.commit_log_offset) for view in copies)]
        return self._trace.events(keys)

    def messages_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int
    ) -> list[MessageView]:
        config = self._existing_topic(topic)
        return browse.by_key(self._store, config, key, begin_ms, end_ms, limit)

    def message_at(self, topic: str, queue_id: int, offset: int) -> MessageView:
        return browse.at(self._store, self._existing_topic(topic), queue_id, offset)

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
            self._store, config, queue_id, offset, begin_ms, end_ms, limit, compiled, with_messages
        )

    def _store_topics(self, topics: list[TopicConfig]) -> list[str]:
        """The store topics holding ``topics``' messages: each topic, and each lite topic's
        queue of a lite parent (one key-index lookup each, so a lookup by id costs one per
        lite topic of the parents searched)."""
        names = []
        for config in topics:
            names.append(config.name)
            if config.message_type is MessageType.LITE:
                names.extend(self._lite.queue_topics(config.name))
        return names

    def _existing_topic(self, name: str) -> TopicConfig:
        # Unlike get_topic, never auto-create what an operator only looks at.
        topic = self._topics.find(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic
