"""What the store refuses to write, each refusal a named error with a stable code.

Every message of a batch is checked before any is written, so a bad message
never leaves a partial batch (or a partial record) behind.
"""

from __future__ import annotations

import functools
import re

from halfmoon.errors import InvalidArgument
from halfmoon.store.message import Message, SysFlag
from halfmoon.store.record import PAIR_SEPARATOR, PROPERTY_SEPARATOR, encode_properties

TOPIC_PATTERN = re.compile(r"[%a-zA-Z0-9_-]{1,127}")  # matched whole (fullmatch)
_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)
_MAX_I32 = _I32[1]


class IllegalTopic(InvalidArgument):
    code = "ILLEGAL_TOPIC"


class IllegalQueueId(InvalidArgument):
    """A queue id the store cannot hold (outside [0, 2**31)), or, raised by the broker, one its
    topic does not have."""

    code = "BAD_REQUEST"  # the protocol has no queue-id Code


class MessageBodyTooLarge(InvalidArgument):
    code = "MESSAGE_BODY_TOO_LARGE"


class IllegalPropertyKey(InvalidArgument):
    code = "ILLEGAL_MESSAGE_PROPERTY_KEY"


class IllegalPropertyValue(InvalidArgument):
    code = "ILLEGAL_MESSAGE_PROPERTY_VALUE"
    protocol_code = "BAD_REQUEST"


class MessagePropertiesTooLarge(InvalidArgument):
    code = "MESSAGE_PROPERTIES_TOO_LARGE"


class IllegalMessageField(InvalidArgument):
    """A numeric field out of its stored range, a host too long, a body that is not bytes."""

    code = "ILLEGAL_MESSAGE_FIELD"
    protocol_code = "BAD_REQUEST"


@functools.lru_cache(maxsize=4096)
def check_topic(topic: str) -> str:
    """Return ``topic`` if it is a legal topic name, else raise IllegalTopic (cached: topics
    repeat)."""
    if not isinstance(topic, str) or TOPIC_PATTERN.fullmatch(topic) is None:
        raise IllegalTopic(
            f"topic {topic!r} is not a legal name: use 1 to 127 characters from "
            "letters, digits, '%', '_' and '-'"
        )
    return topic


def check_message(message: Message, max_body_size: int, max_properties_size: int) -> bytes:
    """Check one message; return its encoded properties (so they are encoded once).

    This runs once per appended message, so the common case is kept to a few
    C-level calls: the topic is looked up in a set of names already found
    legal, and the properties are checked on their encoded form (below).
    Anything unusual takes a slow path that names the exact problem.
    """
    _check_place(message.topic, message.queue_id)
    body = message.body
    if type(body) is not bytes and not isinstance(body, bytes | bytearray | memoryview):
        raise IllegalMessageField(f"message body must be bytes, got {type(body).__name__}")
    check_body_size(body, max_body_size)
    properties = message.properties
    if not properties and type(properties) is dict:
        return b""
    # Encode as record.encode_properties does, checking on the way: the join
    # raises TypeError unless every key and value is a string, and the text is
    # well formed exactly when it holds one PROPERTY_SEPARATOR per pair and
    # one PAIR_SEPARATOR between pairs (so no key or value contains either)
    # and no key is empty. Only a failing check runs the per-pair loop.
    try:
        text = PAIR_SEPARATOR.join(map(PROPERTY_SEPARATOR.join, properties.items()))
    except TypeError:
        text = None
    n = len(properties)
    if (
        text is None
        or "" in properties
        or text.count(PROPERTY_SEPARATOR) != n
        or text.count(PAIR_SEPARATOR) != n - 1
    ):
        _explain_properties(properties)
        text = encode_properties(properties).decode("utf-8")[:-1]  # not reached: it raised
    encoded = (text + PAIR_SEPARATOR).encode("utf-8")
    if len(encoded) > max_properties_size:
        raise MessagePropertiesTooLarge(
            f"properties take {len(encoded)} bytes encoded, more than the limit of "
            f"{max_properties_size}; move large values into the body"
        )
    return encoded


def check_encoded(
    topic: str,
    queue_id: int,
    body: bytes,
    properties: bytes,
    max_body_size: int,
    max_properties_size: int,
) -> None:
    """:func:`check_message` for a message whose properties arrive already encoded."""
    _check_place(topic, queue_id)
    if type(body) is not bytes:
        raise IllegalMessageField(f"message body must be bytes, got {type(body).__name__}")
    check_body_size(body, max_body_size)
    check_encoded_properties(properties, max_properties_size)


def _check_place(topic: str, queue_id: int) -> None:
    """A legal topic (looked up in the names already found legal) and queue id."""
    if topic not in _legal_topics:
        _remember_topic(topic)
    if type(queue_id) is not int or not 0 <= queue_id <= _MAX_I32:
        raise IllegalQueueId(f"queue id must be an integer in [0, 2**31), got {queue_id!r}")


def check_body_size(
    body: bytes | bytearray | memoryview, max_body_size: int, setting: str = "store.max_body_size"
) -> None:
    """The one body-size rule (the store's limit here; the broker's, ``setting``
    ``broker.max_body_size``, before it plans a send)."""
    if len(body) > max_body_size:
        raise MessageBodyTooLarge(
            f"message body of {len(body)} bytes exceeds the limit of {max_body_size} bytes; "
            f"send a smaller body or raise {setting}"
        )


def check_encoded_properties(properties: bytes, max_properties_size: int) -> None:
    """Check properties that arrive already encoded (a proxy encoded them as
    :func:`check_message` does): bytes, within the limit, UTF-8 (reading the
    record back decodes them, and that must never fail) and shaped as pairs
    (ending with a pair separator, as many property separators as pairs, no
    pair starting with one). C-level scans, no loop over the pairs."""
    if type(properties) is not bytes:
        raise IllegalMessageField("encoded properties must be bytes")
    if len(properties) > max_properties_size:
        raise MessagePropertiesTooLarge(
            f"properties take {len(properties)} bytes encoded, more than the limit of "
            f"{max_properties_size}; move large values into the body"
        )
    if not properties:
        return
    if (
        not properties.endswith(_PAIR)
        or properties.count(_PROPERTY) != properties.count(_PAIR)
        or properties.startswith(_PROPERTY)
        or _PAIR + _PROPERTY in properties
    ):
        raise IllegalMessageField("encoded properties are not key \\x01 value \\x02 pairs")
    try:
        properties.decode("utf-8")
    except UnicodeDecodeError:
        raise IllegalMessageField("encoded properties are not UTF-8") from None


_PAIR = PAIR_SEPARATOR.encode()
_PROPERTY = PROPERTY_SEPARATOR.encode()


# Topics already found legal: a set lookup instead of a regex (or an lru_cache
# call) per message. Bounded: cleared when it grows past the limit.
_legal_topics: set[str] = set()
_LEGAL_TOPICS_LIMIT = 4096


def _remember_topic(topic: str) -> None:
    check_topic(topic)
    if len(_legal_topics) >= _LEGAL_TOPICS_LIMIT:
        _legal_topics.clear()
    _legal_topics.add(topic)


def _explain_properties(properties: dict[str, str]) -> None:
    """Raise the error that names the first illegal property key or value."""
    for key, value in properties.items():
        if (
            not isinstance(key, str)
            or not key
            or PROPERTY_SEPARATOR in key
            or PAIR_SEPARATOR in key
        ):
            raise IllegalPropertyKey(
                f"property key {key!r} is illegal: keys must be non-empty strings without "
                "the characters \\x01 and \\x02"
            )
        if not isinstance(value, str) or PROPERTY_SEPARATOR in value or PAIR_SEPARATOR in value:
            raise IllegalPropertyValue(
                f"value of property {key!r} is illegal: values must be strings without "
                "the characters \\x01 and \\x02"
            )


def check_ranges(message: Message) -> None:
    """Check the numeric fields and the born host; the store calls it only when encoding failed."""
    for name, value, (low, high) in (
        ("flags", message.flags, _I32),
        ("sys_flag", message.sys_flag, _I32),
        ("reconsume_times", message.reconsume_times, _I32),
        ("born_timestamp", message.born_timestamp, _I64),
        ("prepared_transaction_offset", message.prepared_transaction_offset, _I64),
    ):
        if type(value) is not int or not low <= value <= high:
            raise IllegalMessageField(
                f"{name} must be an integer in [{low}, {high}], got {value!r}"
            )
    if message.sys_flag & SysFlag.DESTINATIONS:
        raise IllegalMessageField(
            "sys_flag bit 0x100 (DESTINATIONS) is the store's own: send to several queues "
            "with append_fanout"
        )
    if len(message.born_host.encode("utf-8")) > 255:
        raise IllegalMessageField("born_host must be at most 255 bytes of UTF-8")
