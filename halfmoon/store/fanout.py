"""The destinations of a record stored once for several queues (``MessageStore.append_fanout``).

A fanout is one commit-log record and one consume-queue entry per destination,
so a message routed to N queues costs the log one record, not N (RocketMQ's
dispatcher builds its consume queues from records the same way). What the
destinations may be is checked here, before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence

from halfmoon.store.message import Message
from halfmoon.store.record import MAX_DESTINATIONS
from halfmoon.store.validate import IllegalMessageField, IllegalQueueId, check_topic

_MAX_I32 = 2**31 - 1


def check_destinations(
    message: Message, others: Sequence[tuple[str, int]]
) -> list[tuple[str, int]]:
    """Every destination of the record, the message's own first; raises InvalidArgument
    (a subclass with a stable code) for an illegal topic or queue id, a repeated
    destination, or more than the record format holds."""
    if len(others) > MAX_DESTINATIONS:
        raise IllegalMessageField(
            f"a message is stored for at most {MAX_DESTINATIONS + 1} queues at once, "
            f"not {len(others) + 1}; send it in several parts"
        )
    destinations = [(message.topic, message.queue_id)]
    for topic, queue_id in others:
        check_topic(topic)
        if type(queue_id) is not int or not 0 <= queue_id <= _MAX_I32:
            raise IllegalQueueId(f"queue id must be an integer in [0, 2**31), got {queue_id!r}")
        destinations.append((topic, queue_id))
    if len(set(destinations)) != len(destinations):
        raise IllegalMessageField(
            "a message names one queue twice among its destinations; name each once"
        )
    return destinations
