"""A Queue.Declare's ``x-`` arguments checked as RabbitMQ checks them (406 when invalid).

Arguments are stored with the queue and compared on redeclare
(:mod:`halfmoon.amqp.topology`); what each one does is the business of the
module named beside it. Unknown arguments are kept and ignored, as RabbitMQ
does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from halfmoon.amqp import length_limit
from halfmoon.amqp.reply_codes import PRECONDITION_FAILED, AmqpChannelError

QUEUE_TYPES = ("classic", "quorum")
MAX_PRIORITY = 255  # RabbitMQ's limit


def invalid(queue: str, argument: str, value: object, expected: str) -> AmqpChannelError:
    return AmqpChannelError(
        PRECONDITION_FAILED,
        f"invalid arg {argument!r} for queue {queue!r}: {value!r} is not {expected}",
        50,
        10,
    )


def is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text(value: object) -> object:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def check(name: str, arguments: Mapping[str, Any]) -> None:
    """406 PRECONDITION_FAILED for the first invalid argument."""
    queue_type = text(arguments.get("x-queue-type", "classic"))
    if queue_type not in QUEUE_TYPES:
        raise invalid(name, "x-queue-type", queue_type, "one of " + ", ".join(QUEUE_TYPES))
    ttl = arguments.get("x-message-ttl")
    if ttl is not None and (not is_integer(ttl) or ttl < 0):
        raise invalid(name, "x-message-ttl", ttl, "a non-negative integer of milliseconds")
    expires = arguments.get("x-expires")
    if expires is not None and (not is_integer(expires) or expires <= 0):
        raise invalid(name, "x-expires", expires, "a positive integer of milliseconds")
    priority = arguments.get("x-max-priority")
    if priority is not None and (not is_integer(priority) or not 1 <= priority <= MAX_PRIORITY):
        raise invalid(name, "x-max-priority", priority, f"an integer from 1 to {MAX_PRIORITY}")
    exchange = arguments.get("x-dead-letter-exchange")
    if exchange is not None and not isinstance(exchange, str | bytes):
        raise invalid(name, "x-dead-letter-exchange", exchange, "an exchange name")
    routing_key = arguments.get("x-dead-letter-routing-key")
    if routing_key is not None:
        if not isinstance(routing_key, str | bytes):
            raise invalid(name, "x-dead-letter-routing-key", routing_key, "a routing key")
        if exchange is None:
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"invalid arg 'x-dead-letter-routing-key' for queue {name!r}: it needs "
                "'x-dead-letter-exchange' (give both, or neither)",
                50,
                10,
            )
    length_limit.check_arguments(name, arguments)
