"""Receipt handles: the opaque token a consumer acks a received message with.

A handle names one *delivery* of one message: the queue position
(topic, queue id, queue offset), the delivery's epoch (unique per delivery,
so a handle from an earlier delivery no longer matches), when the delivery
becomes visible again, and the record's commit-log offset.

Layout (big-endian), then URL-safe base64 without padding::

    version u8 | queue_id u32 | queue_offset i64 | epoch u64 | visible_at i64
    | commit_log_offset i64 | topic (utf-8, rest) | mac 8 bytes

The mac is a keyed BLAKE2b over everything before it. The key is the
broker's own (kept with the consumption state), so a garbled handle and a
forged one are both rejected with :class:`InvalidReceiptHandle` before any
field is trusted. Decoding accepts only the canonical text of a handle.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
from dataclasses import dataclass

from halfmoon.errors import InvalidArgument

# RocketMQ's proxy bounds (ProxyConfig): a receive must hide a message for at
# least 10 s; no invisible time (receive or change) may exceed 12 h.
MIN_RECEIVE_INVISIBLE_MS = 10_000
MIN_CHANGE_INVISIBLE_MS = 0
MAX_INVISIBLE_MS = 12 * 60 * 60 * 1000

_VERSION = 1
_HEADER = struct.Struct(">BIqQqq")
_MAC_SIZE = 8
_KEY_SIZE = 16
_MAX_TOPIC_BYTES = 1024
# Longest text a valid handle can have; longer input is rejected unread.
_MAX_TEXT = (_HEADER.size + _MAX_TOPIC_BYTES + _MAC_SIZE) * 4 // 3 + 4


class InvalidReceiptHandle(InvalidArgument):
    """The handle is garbled, forged, or names a delivery that is over."""

    code = "INVALID_RECEIPT_HANDLE"


class IllegalInvisibleTime(InvalidArgument):
    code = "ILLEGAL_INVISIBLE_TIME"


def check_invisible_ms(invisible_ms: int, minimum: int) -> None:
    """Raise :class:`IllegalInvisibleTime` unless ``minimum <= invisible_ms <= 12 h``."""
    if not isinstance(invisible_ms, int) or isinstance(invisible_ms, bool):
        raise IllegalInvisibleTime(
            f"invisible duration must be an integer of ms, got {invisible_ms!r}"
        )
    if invisible_ms < minimum:
        raise IllegalInvisibleTime(
            f"invisible duration {invisible_ms} ms is too short: the minimum is {minimum} ms"
        )
    if invisible_ms > MAX_INVISIBLE_MS:
        raise IllegalInvisibleTime(
            f"invisible duration {invisible_ms} ms is too long: the maximum is "
            f"{MAX_INVISIBLE_MS} ms (12 h)"
        )


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    topic: str
    queue_id: int
    queue_offset: int
    epoch: int
    visible_at: int  # ms since the epoch when this delivery's invisibility ends
    commit_log_offset: int


def new_receipt_key() -> bytes:
    return os.urandom(_KEY_SIZE)


class ReceiptCodec:
    """Encodes and verifies receipt handles under one secret key."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not 1 <= len(key) <= 64:
            raise ValueError("receipt key must be 1..64 bytes")
        self._key = key

    @property
    def key(self) -> bytes:
        return self._key

    @property
    def issuer(self) -> str:
        """A name of this key that does not reveal it: what a journal record says issued the
        handles of the deliveries it holds (another broker's cannot be acked here)."""
        return hashlib.blake2b(b"issuer", key=self._key, digest_size=8).hexdigest()

    def _mac(self, payload: bytes) -> bytes:
        return hashlib.blake2b(payload, key=self._key, digest_size=_MAC_SIZE).digest()

    def encode(self, handle: ReceiptHandle) -> str:
        topic = handle.topic.encode("utf-8")
        if len(topic) > _MAX_TOPIC_BYTES:
            raise ValueError("topic name too long for a receipt handle")
        payload = (
            _HEADER.pack(
                _VERSION,
                handle.queue_id,
                handle.queue_offset,
                handle.epoch,
                handle.visible_at,
                handle.commit_log_offset,
            )
            + topic
        )
        raw = payload + self._mac(payload)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def decode(self, text: object) -> ReceiptHandle:
        """The handle ``text`` stands for; :class:`InvalidReceiptHandle` for anything else."""
        if not isinstance(text, str) or not text or len(text) > _MAX_TEXT:
            raise _garbled()
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise _garbled() from None
        if len(raw) < _HEADER.size + _MAC_SIZE:
            raise _garbled()
        payload, mac = raw[:-_MAC_SIZE], raw[-_MAC_SIZE:]
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise _garbled()
        # Only the canonical spelling is a handle (base64 decoding skips stray
        # characters and ignores trailing bits, so check the round trip).
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
            raise _garbled()
        version, queue_id, queue_offset, epoch, visible_at, commit_log_offset = _HEADER.unpack_from(
            payload
        )
        if version != _VERSION:
            raise _garbled()
        try:
            topic = payload[_HEADER.size :].decode("utf-8")
        except UnicodeDecodeError:
            raise _garbled() from None
        return ReceiptHandle(topic, queue_id, queue_offset, epoch, visible_at, commit_log_offset)


def _garbled() -> InvalidReceiptHandle:
    return InvalidReceiptHandle(
        "receipt handle is malformed or was not issued by this broker: "
        "pass the handle of a received message unchanged"
    )
