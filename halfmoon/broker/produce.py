"""The send path's rules: validate a batch, pick queues, route delay messages to the timer.

Every message of a batch is checked before anything is written (the store
checks its own rules again, all-or-nothing). Queue choice: a message group
maps to a stable queue (:mod:`queue_select`); else the producer's queue id if
it gave one; else round robin. A delay message whose delivery time is still in
the future is stored in ``%HM_TIMER%`` with its real topic and queue in the
``REAL_TOPIC`` / ``REAL_QID`` properties; :mod:`timer` moves it later. One
whose time has already come goes straight to its queue.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.errors import (
    BodyDigestMismatch,
    IllegalDeliveryTime,
    IllegalMessageGroup,
    IllegalMessageId,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalQueueId,
    MessageTypeMismatch,
    PermissionDenied,
)
from halfmoon.broker.lite_names import check_lite_topic, lite_queue_topic_unchecked
from halfmoon.broker.message import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    MessageType,
    OutgoingMessage,
    new_message_id,
)
from halfmoon.broker.priority import IllegalPriority, check_priority, priority_queue
from halfmoon.broker.queue_select import QueueSelector
from halfmoon.broker.topics import TIMER_TOPIC, TopicConfig, check_topic_name
from halfmoon.errors import InvalidArgument
from halfmoon.store.message import Message
from halfmoon.store.validate import check_body_size

# What str.isspace() calls whitespace (re's \s on str patterns is the same Unicode class):
# one C scan per key instead of a Python-level loop over its characters.
_WHITESPACE = re.compile(r"\s")

MAX_MESSAGE_ID_LENGTH = 128
MAX_TAG_LENGTH = 255
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class SendResult:
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int  # -1 for a delay message still waiting in the timer
    commit_log_offset: int
    end_offset: int  # wait for store.durable(end_offset) before acknowledging
    transaction_id: str | None = None
    recall_handle: str | None = None  # a delay message still waiting: cancel it with Broker.recall


@dataclass(frozen=True)
class PlannedMessage:
    """A validated message: the record to append and what to tell the producer."""

    record: Message
    message_id: str
    topic: str
    queue_id: int
    delayed: bool


def verify_body_digest(body: bytes, algorithm: str, expected: str) -> None:
    """Check a producer's body digest (RocketMQ's CRC32, MD5 or SHA1; hex, any case)."""
    kind = algorithm.upper().replace("-", "")
    if kind == "CRC32":
        actual = format(zlib.crc32(body) & 0xFFFFFFFF, "X")
        matches = expected.strip().upper().lstrip("0") == actual.lstrip("0")
    elif kind in ("MD5", "SHA1"):
        actual = hashlib.new(kind.lower(), body).hexdigest()
        given = expected.strip().lower()
        if given != actual:  # some clients send base64 rather than hex
            with contextlib.suppress(ValueError):
                given = base64.b64decode(expected.strip(), validate=True).hex()
        matches = given == actual
    else:
        raise InvalidArgument(f"unknown body digest type {algorithm!r}: use CRC32, MD5 or SHA1")
    if not matches:
        raise BodyDigestMismatch(
            f"message body does not match its {kind} digest: the body was corrupted in transit; "
            "send it again"
        )


def _check_fields(
    msg: OutgoingMessage, topic: TopicConfig, now_ms: int, config: BrokerConfig
) -> None:
    kind = msg.message_type
    if not topic.writable:
        raise PermissionDenied(f"topic {topic.name!r} is not writable (perm {topic.perm!r})")
    if not isinstance(kind, MessageType) or kind is MessageType.MIXED:
        raise MessageTypeMismatch(f"illegal message type {kind!r}")
    if not topic.accepts(kind) and not _prioritised(msg, topic):
        raise MessageTypeMismatch(
            f"topic {topic.name!r} accepts {topic.message_type.value} messages, not "
            f"{kind.value}; send to a topic of that type or create the topic as mixed"
        )
    if kind is MessageType.FIFO and not msg.message_group:
        raise MessageTypeMismatch("a FIFO message needs a message group; set one on the message")
    if kind is not MessageType.FIFO and msg.message_group:
        raise MessageTypeMismatch(
            f"a {kind.value} message cannot have a message group; send it as FIFO"
        )
    if msg.message_group is not None and (
        not msg.message_group.strip() or len(msg.message_group) > config.max_message_group_length
    ):
        raise IllegalMessageGroup(
            f"message group must be 1 to {config.max_message_group_length} non-blank characters"
        )
    if kind is MessageType.DELAY and msg.delivery_timestamp is None:
        raise MessageTypeMismatch("a delay message needs a delivery timestamp")
    if (
        kind is not MessageType.DELAY
        and msg.delivery_timestamp is not None
        and not (kind is MessageType.TRANSACTION and msg.transaction_group)
    ):
        raise MessageTypeMismatch(
            f"a {kind.value} message cannot have a delivery timestamp; send it as delay"
        )
    _check_priority_and_lite(msg, topic, config)
    if msg.delivery_timestamp is not None and (
        msg.delivery_timestamp < 0 or msg.delivery_timestamp > now_ms + config.max_delay_ms
    ):
        raise IllegalDeliveryTime(
            f"delivery timestamp {msg.delivery_timestamp} is more than "
            f"{config.max_delay_ms // 1000} s ahead (or negative); pick an earlier time"
        )
    check_body_size(msg.body, config.max_body_size, "broker.max_body_size")
    check_labels(msg)
    if msg.queue_id is not None and not 0 <= msg.queue_id < topic.queue_count:
        raise IllegalQueueId(
            f"queue {msg.queue_id} is not a writable queue of topic {topic.name!r} "
            f"(0 to {topic.queue_count - 1})"
        )


def check_labels(msg: OutgoingMessage) -> None:
    """The checks of a message's tag, keys and id, which depend on no topic or setting (a
    proxy that encodes a message for its broker runs them too: halfmoon.broker.encoded)."""
    if msg.tag is not None and (
        not msg.tag.strip() or "|" in msg.tag or len(msg.tag) > MAX_TAG_LENGTH
    ):
        raise IllegalMessageTag(
            f"illegal tag {msg.tag!r}: use 1 to {MAX_TAG_LENGTH} characters without '|'"
        )
    for key in msg.keys:
        if not key or _WHITESPACE.search(key) is not None or len(key) > MAX_KEY_LENGTH:
            raise IllegalMessageKey(
                f"illegal message key {key!r}: keys are 1 to {MAX_KEY_LENGTH} characters, no spaces"
            )
    if msg.message_id and (
        len(msg.message_id) > MAX_MESSAGE_ID_LENGTH or not msg.message_id.isprintable()
    ):
        raise IllegalMessageId(f"illegal message id {msg.message_id!r}")


def _prioritised(msg: OutgoingMessage, topic: TopicConfig) -> bool:
    """A half or delay message with a priority, to a priority topic: stored in its priority's
    queue when committed or due. RocketMQ has no such message (a priority topic takes
    priority messages only); AMQP's priority queues need it for transactions, x-delay and
    dead-lettering (halfmoon.amqp)."""
    return (
        msg.priority is not None
        and topic.message_type is MessageType.PRIORITY
        and msg.message_type in (MessageType.TRANSACTION, MessageType.DELAY)
    )


def _check_priority_and_lite(
    msg: OutgoingMessage, topic: TopicConfig, config: BrokerConfig
) -> None:
    kind = msg.message_type
    if kind is MessageType.PRIORITY:
        if msg.priority is None:
            raise IllegalPriority("a priority message needs a priority (0 or more); set one")
        check_priority(msg.priority)
    elif _prioritised(msg, topic):
        check_priority(msg.priority)
    elif msg.priority is not None:
        raise MessageTypeMismatch(
            f"a {kind.value} message cannot have a priority; send it as a priority message"
        )
    if kind is MessageType.LITE:
        check_lite_topic(msg.lite_topic, topic.name, config.max_lite_topic_length)
    elif msg.lite_topic is not None:
        raise MessageTypeMismatch(
            f"a {kind.value} message cannot have a lite topic; send it as a lite message"
        )


def fanout_copies(message: OutgoingMessage, others: Sequence[str]) -> list[OutgoingMessage]:
    """A copy of ``message`` for its topic and each of ``others``, all with one message id
    (``Broker.send_fanout``); INVALID_ARGUMENT when a topic is named twice."""
    topics = [message.topic, *others]
    if len(set(topics)) != len(topics):
        raise InvalidArgument("a fanout names a topic twice; name each destination topic once")
    message_id = message.message_id or new_message_id()
    return [replace(message, topic=t, message_id=message_id) for t in topics]


def plan_send(
    messages: list[OutgoingMessage],
    get_topic: Callable[[str], TopicConfig],
    selector: QueueSelector,
    config: BrokerConfig,
    now_ms: int,
) -> list[PlannedMessage]:
    """Validate every message, then decide each one's record and queue."""
    if not config.writable and messages:
        raise PermissionDenied(
            f"broker {config.name!r} accepts no new messages: its write permission was wiped "
            "to drain it; send through another broker, or restore it with "
            "'halfmoon cluster write-perm --add'"
        )
    checked = []
    for msg in messages:
        check_topic_name(msg.topic)
        topic = get_topic(msg.topic)
        _check_fields(msg, topic, now_ms, config)
        checked.append((msg, topic))
    planned = []
    for msg, topic in checked:
        store_topic = topic.name
        if msg.lite_topic is not None:  # one queue per lite topic (lite_names.py)
            store_topic, queue_id = lite_queue_topic_unchecked(topic.name, msg.lite_topic), 0
        elif msg.priority is not None:
            queue_id = priority_queue(msg.priority, topic.queue_count)
        elif msg.message_group:
            queue_id = selector.select(topic.name, topic.queue_count, msg.message_group)
        elif msg.queue_id is not None:
            queue_id = msg.queue_id
        else:
            queue_id = selector.select(topic.name, topic.queue_count)
        message_id = msg.message_id or new_message_id()
        # A transaction group member with a delivery time is stored as a half message like
        # any other; committed, it waits for its time in its queue (pop_receive.py).
        delayed = (
            msg.delivery_timestamp is not None
            and msg.delivery_timestamp > now_ms
            and msg.message_type is not MessageType.TRANSACTION
        )
        if delayed:
            record = msg.to_store(TIMER_TOPIC, 0, message_id)
            record.properties[PROPERTY_REAL_TOPIC] = topic.name
            record.properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        else:
            record = msg.to_store(store_topic, queue_id, message_id)
        planned.append(PlannedMessage(record, message_id, topic.name, queue_id, delayed))
    return planned
