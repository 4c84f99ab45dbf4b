"""``x-max-length``, ``x-max-length-bytes`` and ``x-overflow``: a queue that holds at most N
ready messages, or N bytes of ready message bodies.

Before a publish reaches a capped queue its ready count is read (never
delivered, or requeued: Queue.DeclareOk's count), once the connection's earlier
publishes are readable (under sync flush, after their fsync: else a burst of
publishes without confirms would each find the queue as it was before the
burst), and for a byte limit the body bytes from the
queue's first unacked message on (read until past the limit, so the cost is
bounded by the limit; in-flight deliveries and messages acked out of order
past the first unacked one count there, where RabbitMQ counts ready
messages only). A message refused by a byte limit is one that would take the
queue past it. ``reject-publish`` and ``reject-publish-dlx``
leave the queue out when it is full; the publisher gets a Nack in confirm
mode, as RabbitMQ does when any queue refused, and with
``reject-publish-dlx`` the refused message is dead-lettered (reason
``maxlen``, sent with the publish). ``drop-head`` (the default) lets the
message in and then drops the oldest ready messages beyond N (popped, and
dead-lettered or acked unseen). In-flight deliveries do not count, as in
RabbitMQ.

In a transaction the limits apply at Tx.Commit, where RabbitMQ applies them
(its publishes reach their queues then): the publishes to ``reject-publish``
queues that fit, in publish order, each counting the ones admitted before it
(:func:`admit_in_order`), become members of the transaction group, with the
``reject-publish-dlx`` copies of those refused; a refused one is dropped, as
RabbitMQ drops it (a transactional channel has no confirms). A ``drop-head``
queue is trimmed once the commit applied.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from halfmoon.amqp.dead_letter import MAXLEN, DeadLetters, Original, copies
from halfmoon.amqp.queues import Queues
from halfmoon.amqp.reply_codes import PRECONDITION_FAILED, AmqpChannelError
from halfmoon.amqp.topology import Queue, VHost
from halfmoon.broker.message import OutgoingMessage

OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")
LIMITS = ("x-max-length", "x-max-length-bytes")


def check_arguments(name: str, arguments: Mapping[str, Any]) -> None:
    """406 for an ``x-max-length`` that is not a non-negative integer or an unknown
    ``x-overflow``."""
    for argument in LIMITS:
        limit = arguments.get(argument)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"invalid arg {argument!r} for queue {name!r}: {limit!r} is not a non-negative "
                "integer",
                50,
                10,
            )
    overflow = _overflow(arguments)
    if overflow not in OVERFLOWS:
        raise AmqpChannelError(
            PRECONDITION_FAILED,
            f"invalid arg 'x-overflow' for queue {name!r}: {overflow!r} is not one of "
            + ", ".join(OVERFLOWS),
            50,
            10,
        )


def _overflow(arguments: Mapping[str, Any]) -> object:
    overflow = arguments.get("x-overflow", "drop-head")
    return overflow.decode(errors="replace") if isinstance(overflow, bytes) else overflow


def _limit(queue: Queue, argument: str) -> int | None:
    value = queue.arguments.get(argument)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def refuses_when_full(queue: Queue) -> bool:
    """A capped queue whose overflow refuses publishes (``reject-publish``, ``-dlx``)."""
    return capped(queue) and _overflow(queue.arguments) != "drop-head"


def capped(queue: Queue) -> bool:
    return (
        _limit(queue, "x-max-length") is not None or _limit(queue, "x-max-length-bytes") is not None
    )


async def _full(queues: Queues, queue: Queue, size: int) -> bool:
    """Whether a message of ``size`` body bytes would take the queue past a limit."""
    count_limit = _limit(queue, "x-max-length")
    if count_limit is not None and await queues.counts(queue.stored) >= count_limit:
        return True
    bytes_limit = _limit(queue, "x-max-length-bytes")
    if bytes_limit is None:
        return False
    return await queues.ready_bytes(queue.stored, bytes_limit) + size > bytes_limit


async def admit(
    queues: Queues, targets: list[Queue], size: int
) -> tuple[list[Queue], list[Queue], list[Queue]]:
    """The queues that take a message of ``size`` body bytes, those that refused it, and the
    drop-head queues to trim after the send."""
    accepted: list[Queue] = []
    refused: list[Queue] = []
    trim: list[Queue] = []
    for queue in targets:
        if not capped(queue):
            accepted.append(queue)
        elif _overflow(queue.arguments) == "drop-head":
            accepted.append(queue)
            trim.append(queue)
        elif await _full(queues, queue, size):
            refused.append(queue)
        else:
            accepted.append(queue)
    return accepted, refused, trim


async def admit_in_order(queues: Queues, held: list[tuple[Queue, int]]) -> list[bool]:
    """For a transaction's publishes to refusing queues, (queue, body size) in publish order:
    whether each fits its queue, counting the ones admitted before it. Each queue's ready
    count and bytes are read once."""
    ready: dict[int, list[int]] = {}  # id(queue) -> [messages, body bytes] with those admitted
    fits: list[bool] = []
    for queue, size in held:
        count_limit = _limit(queue, "x-max-length")
        bytes_limit = _limit(queue, "x-max-length-bytes")
        now = ready.get(id(queue))
        if now is None:
            count = await queues.counts(queue.stored) if count_limit is not None else 0
            body_bytes = (
                await queues.ready_bytes(queue.stored, bytes_limit)
                if bytes_limit is not None
                else 0
            )
            now = ready[id(queue)] = [count, body_bytes]
        fit = (count_limit is None or now[0] < count_limit) and (
            bytes_limit is None or now[1] + size <= bytes_limit
        )
        if fit:
            now[0] += 1
            now[1] += size
        fits.append(fit)
    return fits


def refusal_copies(
    vhost: VHost,
    refused: list[Queue],
    original: Original,
    now_ms: int,
    transaction_group: str | None = None,
) -> list[OutgoingMessage]:
    """The dead-lettered copies of a publish the ``reject-publish-dlx`` queues refused
    (members of ``transaction_group`` when given)."""
    return [
        message
        for queue in refused
        if _overflow(queue.arguments) == "reject-publish-dlx"
        for message in copies(vhost, queue, original, MAXLEN, now_ms, transaction_group)
    ]


async def trim(
    queues: Queues, dead_letters: DeadLetters, vhost: VHost, queue: Queue, client_id: str
) -> None:
    """Drop the oldest ready messages beyond the queue's ``x-max-length`` and
    ``x-max-length-bytes`` (dead-lettered when it has a dead-letter exchange)."""
    count_limit = _limit(queue, "x-max-length")
    if count_limit is not None:
        excess = await queues.counts(queue.stored) - count_limit
        while excess > 0:
            dropped = await _drop_head(queues, dead_letters, vhost, queue, client_id, excess)
            if not dropped:
                return
            excess -= dropped
    bytes_limit = _limit(queue, "x-max-length-bytes")
    if bytes_limit is not None:
        while await queues.ready_bytes(queue.stored, bytes_limit) > bytes_limit:
            if not await _drop_head(queues, dead_letters, vhost, queue, client_id, 1):
                return


async def _drop_head(
    queues: Queues,
    dead_letters: DeadLetters,
    vhost: VHost,
    queue: Queue,
    client_id: str,
    count: int,
) -> int:
    views, _ = await queues.receive(queue.stored, min(count, 64), client_id)
    if views:
        now = int(time.time() * 1000)
        await dead_letters.move(vhost, [(queue, v) for v in views], MAXLEN, now)
    return len(views)
