"""Recall handles: the token a producer gets for a delay message, to cancel it before its time.

A delay message waits in ``%HM_TIMER%`` (see :mod:`timer`). SendMessage gives
the producer a recall handle that names exactly that timer record; the
RecallMessage RPC hands it back and the timer skips the record when its time
comes. Apache RocketMQ's handle is ``v1 topic broker time message-id`` in
URL-safe base64 and recall appends a delete marker that the timer matches by
message id. halfmoon's timer orders entries by ``(due, timer offset)``, so the
handle carries that key, plus the commit-log offset of the timer record so
the broker can check the handle against what is stored.

Format (version 1): URL-safe base64, no padding, of::

    version:u8  timer_offset:u64  commit_log_offset:u64  due_ms:u64
    broker, topic, message_id: each u16 length + UTF-8
    checksum: the first 8 bytes of BLAKE2b over everything before it

The checksum makes a garbled or truncated handle a clean
:class:`IllegalRecallHandle` rather than a lookup of random offsets. It is
not a signature: the broker still verifies every field against the stored
timer record, so a handle forged with a valid checksum but naming no delay
message fails the same way.

Wire codes: a malformed, forged or mismatched handle is ``ILLEGAL_RECALL_HANDLE``,
which the protocol does not have, so the server answers ``BAD_REQUEST``
(RocketMQ answers ILLEGAL_OPERATION, which the gRPC proxy reports as a bad
request too). A handle whose message was already delivered (or whose record
retention removed) is ``NOT_FOUND``, as RocketMQ's "message already delivered".
Recalling the same message twice succeeds both times (idempotent, as in
RocketMQ) while the timer still remembers the recall: until an hour after
its delivery time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from halfmoon.broker.message import PROPERTY_DELIVERY_TIME, PROPERTY_REAL_TOPIC
from halfmoon.broker.topics import TIMER_TOPIC
from halfmoon.errors import HalfmoonError, NotFound
from halfmoon.store.api import AppendResult, Store
from halfmoon.store.message import Message, StoredMessage

VERSION = 1
MAX_HANDLE_LENGTH = 2048  # characters; a real handle is ~100
_HEADER = struct.Struct(">BQQQ")
_LENGTH = struct.Struct(">H")
_CHECKSUM_SIZE = 8
_VISIBLE_TIMEOUT_S = 10.0


class IllegalRecallHandle(HalfmoonError):
    """The recall handle is malformed, forged, or names a different topic or broker."""

    code = "ILLEGAL_RECALL_HANDLE"
    protocol_code = "BAD_REQUEST"
    http_status = 400


class RecallTooLate(NotFound):
    """The delay message the handle names is no longer waiting (delivered, or removed)."""

    code = "NOT_FOUND"


@dataclass(frozen=True)
class RecallHandle:
    broker: str
    topic: str
    timer_offset: int  # queue offset in %HM_TIMER% queue 0
    commit_log_offset: int  # where the timer record starts
    due_ms: int
    message_id: str

    @property
    def timer_key(self) -> tuple[int, int]:
        """The timer's ordering key of the record: ``(due_ms, timer_offset)``."""
        return (self.due_ms, self.timer_offset)


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_CHECKSUM_SIZE).digest()


def encode(handle: RecallHandle) -> str:
    parts = [_HEADER.pack(VERSION, handle.timer_offset, handle.commit_log_offset, handle.due_ms)]
    for text in (handle.broker, handle.topic, handle.message_id):
        raw = text.encode("utf-8")
        parts.append(_LENGTH.pack(len(raw)) + raw)
    payload = b"".join(parts)
    return base64.urlsafe_b64encode(payload + _checksum(payload)).rstrip(b"=").decode("ascii")


def decode(text: str) -> RecallHandle:
    """Parse a handle; raises :class:`IllegalRecallHandle` for anything encode did not produce."""
    bad = IllegalRecallHandle(
        "the recall handle is not valid (garbled, truncated or not issued by halfmoon); "
        "use the recall_handle of the delay message's SendReceipt unchanged"
    )
    if not text or len(text) > MAX_HANDLE_LENGTH:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise bad from None
    payload, checksum = raw[:-_CHECKSUM_SIZE], raw[-_CHECKSUM_SIZE:]
    if len(payload) < _HEADER.size or _checksum(payload) != checksum:
        raise bad
    version, timer_offset, commit_log_offset, due_ms = _HEADER.unpack_from(payload)
    if version != VERSION:
        raise IllegalRecallHandle(
            f"recall handle version {version} is not supported (this broker reads {VERSION})"
        )
    texts = []
    at = _HEADER.size
    try:
        for _ in range(3):
            (size,) = _LENGTH.unpack_from(payload, at)
            at += _LENGTH.size
            if at + size > len(payload):
                raise bad
            texts.append(payload[at : at + size].decode("utf-8"))
            at += size
    except (struct.error, UnicodeDecodeError):
        raise bad from None
    if at != len(payload):
        raise bad
    broker, topic, message_id = texts
    return RecallHandle(broker, topic, timer_offset, commit_log_offset, due_ms, message_id)


def recall_handle(
    broker: str, topic: str, message_id: str, record: Message, appended: AppendResult
) -> str:
    """The handle a delay message's sender gets back to recall it before it is due."""
    due = int(record.properties[PROPERTY_DELIVERY_TIME])
    handle = RecallHandle(
        broker,
        topic,
        appended.queue_offset,
        appended.commit_log_offset,
        due,
        message_id,
    )
    return encode(handle)


def names_record(handle: RecallHandle, stored: StoredMessage) -> bool:
    """Whether ``stored`` is the timer record ``handle`` was issued for."""
    return (
        stored.topic == TIMER_TOPIC
        and stored.queue_offset == handle.timer_offset
        and stored.commit_log_offset == handle.commit_log_offset
        and stored.unique_id == handle.message_id
        and stored.properties.get(PROPERTY_REAL_TOPIC) == handle.topic
        and stored.properties.get(PROPERTY_DELIVERY_TIME) == str(handle.due_ms)
    )


def check_handle(text: str, topic: str, broker: str, store: Store) -> RecallHandle:
    """Decode ``text`` and check it against the stored timer record it names.

    Raises :class:`IllegalRecallHandle` unless the handle was issued by broker
    ``broker`` for a delay message of ``topic`` whose timer record is still
    stored; :class:`RecallTooLate` when retention already removed the record.
    Whether the message is still waiting is the timer's call.
    """
    handle = decode(text)
    if handle.topic != topic:
        # Named by the caller's topic only: the answer says nothing of a topic it may not see.
        raise IllegalRecallHandle(
            f"the recall handle names no delay message of topic {topic!r}; "
            "recall with the topic the message was sent to"
        )
    if handle.broker != broker:
        raise IllegalRecallHandle(
            f"the recall handle was issued by broker {handle.broker!r}, not {broker!r}; "
            "send the recall to the broker that stored the message"
        )
    stored = _read_record(store, handle)
    if stored is None or not names_record(handle, stored):
        raise IllegalRecallHandle(
            "the recall handle names no delay message of this broker; "
            "use the recall_handle of the delay message's SendReceipt unchanged"
        )
    return handle


def _read_record(store: Store, handle: RecallHandle) -> StoredMessage | None:
    """The record at the handle's offset, or None when none starts there (a forged offset)."""
    for attempt in range(2):
        try:
            return store.read_at(handle.commit_log_offset)
        except NotFound:
            stats = store.stats()
            if handle.commit_log_offset < stats.commit_log_min_offset:
                raise RecallTooLate(
                    f"delay message {handle.message_id} is gone from the store (delivered long ago "
                    "and "
                    "removed by retention); it cannot be recalled"
                ) from None
            if attempt or handle.commit_log_offset >= stats.commit_log_max_offset:
                return None
            # Written but not yet visible (a sync store shows records once flushed).
            store.wait_durable(stats.commit_log_max_offset, timeout=_VISIBLE_TIMEOUT_S)
        except (HalfmoonError, ValueError, OverflowError):
            return None  # an offset inside another record
    return None
