"""AMQP reply codes and the two errors that carry them: one closes a channel, one the connection.

The codes and their meaning are the spec's (and RabbitMQ's use of them):
channel errors (403, 404, 405, 406) close the channel that caused them and
leave the connection open; connection errors (320, 501-505, 530, 540, 541)
close the connection. Each error's text says what to change, as RabbitMQ's
do ("NOT_FOUND - no queue 'x' in vhost '/'").
"""

from __future__ import annotations

from halfmoon.errors import HalfmoonError

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

TEXTS = {
    REPLY_SUCCESS: "OK",
    NO_ROUTE: "NO_ROUTE",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


class AmqpError(Exception):
    """An AMQP error: the reply code, a sentence, and the method that caused it."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        """As RabbitMQ words it: ``NOT_FOUND - no queue 'x' in vhost '/'`` (at most 255 bytes)."""
        full = f"{TEXTS.get(self.code, 'ERROR')} - {self.text}"
        raw = full.encode()
        return full if len(raw) <= 255 else raw[:255].decode(errors="ignore")


class AmqpChannelError(AmqpError):
    """Closes the channel (Channel.Close); the connection stays open."""


class AmqpConnectionError(AmqpError):
    """Closes the connection (Connection.Close)."""


def from_halfmoon(exc: HalfmoonError, class_id: int = 0, method_id: int = 0) -> AmqpError:
    """A broker error as the AMQP error a client can act on (by its HTTP-like status)."""
    text = f"{exc.message} ({exc.code})"
    status = exc.http_status
    if status == 404:
        return AmqpChannelError(NOT_FOUND, text, class_id, method_id)
    if status in (401, 403):
        return AmqpChannelError(ACCESS_REFUSED, text, class_id, method_id)
    if 400 <= status < 500:
        return AmqpChannelError(PRECONDITION_FAILED, text, class_id, method_id)
    return AmqpConnectionError(INTERNAL_ERROR, text, class_id, method_id)
