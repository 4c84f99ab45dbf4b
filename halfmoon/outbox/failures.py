"""Which publish failures are permanent: the target said the message itself cannot be
delivered as it is, so retrying it only holds its aggregate back for nothing.

- halfmoon: a ``BadRequest`` (an empty or too large body, a message type the topic does not
  take) or a ``NotFound`` (no such topic), by the protocol code the server answered;
- RabbitMQ: a mandatory message returned (NO_ROUTE, 312) or an unknown exchange
  (NOT_FOUND, 404).

Anything else (a server down, a timeout, a refused credential an operator can fix) is
transient and retried with backoff.
"""

from __future__ import annotations

from halfmoon.client.errors import BadRequest, NotFound
from halfmoon.outbox.targets import UnroutableMessage


def permanent_reason(error: BaseException) -> str | None:
    """The stable code that makes ``error`` permanent, or None if retrying can help."""
    if isinstance(error, BadRequest | NotFound | UnroutableMessage):
        return str(getattr(error, "code", type(error).__name__))
    try:
        import aiormq  # optional: only the RabbitMQ target raises its errors
    except ImportError:
        return None
    if isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
        return "NOT_FOUND"
    return None
