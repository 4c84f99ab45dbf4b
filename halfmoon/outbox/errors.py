"""The outbox toolkit's errors (their own module: the dialects raise them below the outbox)."""

from __future__ import annotations

from halfmoon.errors import HalfmoonError


class OutboxError(HalfmoonError):
    """Base of the outbox toolkit's errors."""

    code = "OUTBOX_ERROR"
    protocol_code = "INTERNAL_ERROR"


class UnsupportedDatabase(OutboxError):
    code = "OUTBOX_UNSUPPORTED_DATABASE"
    protocol_code = "BAD_REQUEST"
    http_status = 400


class InvalidOutboxMessage(OutboxError):
    code = "OUTBOX_INVALID_MESSAGE"
    protocol_code = "BAD_REQUEST"
    http_status = 400
