"""The outbox toolkit's errors (their own module: the dialects raise them below the outbox)."""

from __future__ import annotations

from halfmoon.errors import HalfmoonError


class OutboxError(HalfmoonError):
    """Base of the outbox toolkit's errors."""

    code = "OUTBOX_ERROR"


class UnsupportedDatabase(OutboxError):
    code = "OUTBOX_UNSUPPORTED_DATABASE"


class InvalidOutboxMessage(OutboxError):
    code = "OUTBOX_INVALID_MESSAGE"
