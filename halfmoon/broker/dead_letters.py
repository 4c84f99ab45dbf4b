"""Writing a message that failed every delivery attempt into its group's
dead-letter topic, ``%DLQ%<group>``, with where it came from in its properties."""

from __future__ import annotations

from halfmoon.broker.message import (
    PROPERTY_DELIVERY_ATTEMPT,
    PROPERTY_DLQ_ORIGIN_GROUP,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
)
from halfmoon.broker.topics import TopicRegistry
from halfmoon.store.api import Store
from halfmoon.store.message import Message, StoredMessage


def write_dead_letter(
    store: Store, topics: TopicRegistry, group: str, stored: StoredMessage, attempts: int
) -> None:
    """Copy a message that failed ``attempts`` times into ``%DLQ%<group>`` (durably)."""
    store.put([dead_letter_copy(topics, group, stored, attempts)])


def dead_letter_copy(
    topics: TopicRegistry, group: str, stored: StoredMessage, attempts: int
) -> Message:
    """The record of ``stored`` in ``%DLQ%<group>`` (the topic is created if needed)."""
    topic = topics.ensure_dead_letter_topic(group)
    props = dict(stored.properties)
    props[PROPERTY_DLQ_ORIGIN_GROUP] = group
    props[PROPERTY_DLQ_ORIGIN_TOPIC] = props.get(PROPERTY_REAL_TOPIC, stored.topic)
    props[PROPERTY_DELIVERY_ATTEMPT] = str(attempts)
    if stored.unique_id:
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, stored.unique_id)
    return Message(
        topic=topic.name,
        body=stored.body,
        queue_id=0,
        properties=props,
        flags=stored.flags,
        born_timestamp=stored.born_timestamp,
        born_host=stored.born_host,
        reconsume_times=attempts,
    )
