"""Plain messages encoded where they arrive, so the broker that stores them does not.

In cluster mode one broker stores what many proxies receive, so its work per
message bounds the cluster. A proxy turns each *plain* message (normal or
FIFO, not delayed, no priority, lite topic or transaction) into an
:class:`EncodedMessage` before sending it to the broker: it checks what
depends on no topic or setting (the tag, keys and id, the property names,
the message group's presence) with the broker's own functions, and encodes
the record's properties once, as the store would. The broker then checks
what depends on its state and settings (the topic exists, is writable and
takes the type; the queue; the body, group and property sizes; that the
properties are UTF-8 and shaped as pairs), picks the queue and appends the
record without rebuilding it (``Store.append_encoded``): the same record,
byte for byte, as the message would have become on the broker.

Anything the short path cannot take — a topic the broker does not have (it
may create it), a refusal whose message the full path words, a store that
keeps messages rather than records — goes through the full send path after
:meth:`EncodedMessage.to_outgoing` turns it back into the message it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from halfmoon.broker.message import (
    PROPERTY_PRODUCER_GROUP,
    SYSTEM_PROPERTIES,
    MessageType,
    OutgoingMessage,
    new_message_id,
)
from halfmoon.broker.produce import check_labels
from halfmoon.broker.topics import check_topic_name
from halfmoon.store.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS
from halfmoon.store.record import MAX_PROPERTIES_BYTES, decode_properties
from halfmoon.store.recovery import index_keys
from halfmoon.store.validate import check_message

# The body limit is the broker's to check (a setting); the proxy only encodes.
_NO_BODY_LIMIT = 2**63


@dataclass(slots=True)
class EncodedMessage:
    """A plain message with its record properties encoded (see the module docstring)."""

    topic: str
    message_id: str
    message_type: MessageType  # NORMAL or FIFO
    message_group: str | None
    queue_id: int | None  # None: the broker picks
    body: bytes
    properties: bytes  # as the store encodes them: key \x01 value \x02 ...
    tag: str | None
    keys: list[str]  # what the message is indexed under: its KEYS, then its unique id
    born_host: str
    born_timestamp: int

    def to_outgoing(self) -> OutgoingMessage:
        """The message this was encoded from (for the full send path)."""
        props = decode_properties(self.properties)
        keys = props.get(PROPERTY_KEYS)
        return OutgoingMessage(
            topic=self.topic,
            body=self.body,
            message_id=self.message_id,
            tag=props.get(PROPERTY_TAGS),
            keys=[k for k in keys.split(KEY_SEPARATOR) if k] if keys else [],
            properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES},
            message_type=self.message_type,
            message_group=self.message_group,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            queue_id=self.queue_id,
            producer_group=props.get(PROPERTY_PRODUCER_GROUP),
        )


# What a send to a broker carries: a message, or a plain one a proxy encoded.
SentMessage = OutgoingMessage | EncodedMessage


def plain_type(kind: MessageType, group: str | None) -> bool:
    """A normal message without a group, or a FIFO one with a usable group: the types whose
    encoding the broker stores as it is (a peer's claim is checked again there)."""
    return (kind is MessageType.NORMAL and group is None) or (
        kind is MessageType.FIFO and group is not None and group.strip() != ""
    )


def is_plain(msg: OutgoingMessage) -> bool:
    """Whether ``msg`` can be sent encoded: what the short path stores as it is. A FIFO
    message without a usable group, or a normal one with a group, is left to the full path,
    which words the refusal."""
    return (
        plain_type(msg.message_type, msg.message_group)
        and msg.delivery_timestamp is None
        and msg.priority is None
        and msg.lite_topic is None
        and msg.transaction_group is None
        and msg.check_immunity_seconds is None
        and msg.resent_from is None
    )


def encode_message(msg: OutgoingMessage) -> EncodedMessage:
    """``msg`` (plain: :func:`is_plain`) checked and encoded; the broker's errors, with the
    broker's codes, for what is wrong with it."""
    check_topic_name(msg.topic)
    check_labels(msg)
    message_id = msg.message_id or new_message_id()
    record = msg.to_store(msg.topic, 0, message_id)  # refuses reserved property names
    properties = check_message(record, _NO_BODY_LIMIT, MAX_PROPERTIES_BYTES)
    props = record.properties
    return EncodedMessage(
        topic=msg.topic,
        message_id=message_id,
        message_type=msg.message_type,
        message_group=msg.message_group,
        queue_id=msg.queue_id,
        body=msg.body,
        properties=properties,
        tag=props.get(PROPERTY_TAGS),
        keys=index_keys(props) if PROPERTY_KEYS in props else [message_id],
        born_host=msg.born_host,
        born_timestamp=msg.born_timestamp,
    )


def encode_for_broker(messages: Sequence[OutgoingMessage]) -> list[SentMessage]:
    """A send's messages as a proxy hands them to its broker: each plain one encoded."""
    return [encode_message(m) if is_plain(m) else m for m in messages]
