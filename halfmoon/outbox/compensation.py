"""Compensation messages and their retries, on halfmoon and on RabbitMQ.

A compensation ("cancel order 42", "release the stock of order 42") is a
message like any other, with a small fixed format: who asks (trace id), who
must act (target service), why (the original event's type and id), on what
(business key), and on which state (the version the sender saw). It carries
no business data: the handler reads what it needs from its own database, and
a compensation in a dead-letter queue leaks nothing.

The state version makes stale compensations harmless: the handler applies it
only if the entity is still at that version (:func:`apply_if_version`), so a
compensation overtaken by newer changes is skipped, not applied blindly.

Retries back off exponentially, 1 s → 5 s → 30 s → 3 min by default, then go
to an alert destination:

- **halfmoon**: the consumer group's customized retry policy holds the tiers
  and ``max_delivery_attempts`` is tiers + 1; after the last failed attempt
  the message goes to the group's dead-letter topic ``%DLQ%<group>``, the
  alert topic. :func:`create_compensation_group` sets the group up through
  the admin API; :func:`compensation_listener` adapts a handler for a push
  consumer.
- **RabbitMQ** (:class:`RabbitRetryQueue`): one TTL queue per tier, whose
  expired messages dead-letter through an exchange back to the work queue.
  One queue per tier, not per-message TTLs in one queue: RabbitMQ only
  expires messages at a queue's head, so a 3-minute message would hold up a
  1-second one behind it. Attempts are counted in halfmoon's own header
  ``halfmoon-attempts`` (RabbitMQ 4 ignores client-set ``x-`` headers, and
  ``x-death`` counts differently across versions); after the last tier the
  message goes to the alert queue.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from sqlalchemy import Connection, Table, update

from halfmoon.client.message import Message, MessageView
from halfmoon.client.push_consumer import ConsumeResult
from halfmoon.errors import InvalidArgument
from halfmoon.extras import require

if TYPE_CHECKING:  # aio-pika is optional (only RabbitMQ needs it)
    from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

log = logging.getLogger("halfmoon.outbox.compensation")

DEFAULT_BACKOFF: tuple[float, ...] = (1.0, 5.0, 30.0, 180.0)
ATTEMPTS_HEADER = "halfmoon-attempts"
CONTENT_TYPE = "application/vnd.halfmoon.compensation+json"
FORMAT_VERSION = 1
MAX_FIELD_LENGTH = 255


class InvalidCompensation(InvalidArgument):
    """A compensation message that does not follow the format (field missing, unknown, too long)."""

    code = "INVALID_COMPENSATION"
    protocol_code = "BAD_REQUEST"


@dataclass(frozen=True)
class Compensation:
    """What to undo, where, and on which state; never the business data itself."""

    trace_id: str
    target_service: str
    action: str
    business_key: str
    state_version: int
    original_event: str
    original_event_id: str = ""
    timestamp_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("state_version", "timestamp_ms"):
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise InvalidCompensation(
                        f"compensation field {f.name!r} must be a non-negative integer, not "
                        f"{value!r}"
                    )
            elif not isinstance(value, str) or len(value) > MAX_FIELD_LENGTH:
                raise InvalidCompensation(
                    f"compensation field {f.name!r} must be a string of at most {MAX_FIELD_LENGTH} "
                    "characters"
                )
        for required in ("trace_id", "target_service", "action", "business_key", "original_event"):
            if not getattr(self, required):
                raise InvalidCompensation(
                    f"compensation field {required!r} is empty; every compensation names it"
                )

    @classmethod
    def new(
        cls,
        target_service: str,
        action: str,
        business_key: str,
        state_version: int,
        original_event: str,
        *,
        original_event_id: str = "",
        trace_id: str | None = None,
    ) -> Compensation:
        """A compensation with a fresh trace id (or the given one) and the current time."""
        return cls(
            trace_id or uuid.uuid4().hex,
            target_service,
            action,
            business_key,
            state_version,
            original_event,
            original_event_id,
        )

    @property
    def idempotency_key(self) -> str:
        """The inbox key: one compensation of one state of one entity is applied once."""
        return (
            f"compensation:{self.target_service}:{self.action}:"
            f"{self.business_key}:{self.state_version}"
        )

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"v": FORMAT_VERSION, **asdict(self)}, separators=(",", ":"), sort_keys=True
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Compensation:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise InvalidCompensation(f"a compensation body must be JSON: {exc}") from None
        if not isinstance(raw, dict) or raw.pop("v", None) != FORMAT_VERSION:
            raise InvalidCompensation(f"not a compensation of format version {FORMAT_VERSION}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            # Extra fields are how business data creeps into compensations: refuse them.
            raise InvalidCompensation(
                f"unknown compensation field(s) {', '.join(unknown)}; the format is fixed"
            )
        try:
            return cls(**raw)
        except TypeError as exc:
            raise InvalidCompensation(f"incomplete compensation: {exc}") from None

    def to_message(self, topic: str) -> Message:
        """A halfmoon message: tagged with the action, keyed by business key and trace id."""
        return Message(
            topic,
            self.to_bytes(),
            tag=self.action,
            keys=[self.business_key, self.trace_id],
            properties={"content_type": CONTENT_TYPE, "target_service": self.target_service},
        )

    @classmethod
    def from_message(cls, message: MessageView) -> Compensation:
        return cls.from_bytes(message.body)


def apply_if_version(
    conn: Connection,
    table: Table,
    *,
    key: Mapping[str, Any],
    version_column: str,
    expected_version: int,
    values: Mapping[str, Any],
) -> bool:
    """Update the row at ``key`` with ``values`` only if it is still at ``expected_version``.

    Bumps the version by one. False (nothing changed) when the row moved on
    or is gone: the compensation is stale and must be skipped.
    """
    version = table.c[version_column]
    stmt = update(table).where(version == expected_version)
    for column, value in key.items():
        stmt = stmt.where(table.c[column] == value)
    return conn.execute(stmt.values(**values, **{version_column: version + 1})).rowcount == 1


# -- halfmoon: the consumer group's retry policy and dead-letter topic ---------------------


def alert_topic(group: str) -> str:
    """Where compensations that exhausted their retries land (the group's dead-letter topic)."""
    return f"%DLQ%{group}"


def retry_settings(tiers: Sequence[float] = DEFAULT_BACKOFF) -> dict[str, Any]:
    """The admin API's group fields for these backoff tiers (seconds)."""
    if not tiers or any(t < 0 for t in tiers):
        raise InvalidArgument("backoff tiers must be a non-empty list of seconds >= 0")
    return {
        "retry_policy": {"kind": "customized", "levels_ms": [int(t * 1000) for t in tiers]},
        # The first delivery plus one retry per tier.
        "max_delivery_attempts": len(tiers) + 1,
    }


class AdminApi(Protocol):
    """What :func:`create_compensation_group` needs of an admin API client.

    :class:`halfmoon.cli.admin_client.AdminClient` is one: its errors carry
    the API's stable error ``code``.
    """

    def post(self, path: str, body: dict[str, Any]) -> Any: ...

    def patch(self, path: str, body: dict[str, Any]) -> Any: ...


def create_compensation_group(
    admin: AdminApi,
    group: str,
    *,
    tiers: Sequence[float] = DEFAULT_BACKOFF,
    consume_from: str = "earliest",
) -> dict[str, Any]:
    """Create (or update) ``group`` with the compensation retry policy through the admin API.

    ``admin`` is an admin API client, e.g. ``AdminClient("http://127.0.0.1:8082")``.
    """
    settings = retry_settings(tiers)
    try:
        return admin.post("/v1/groups", {"name": group, "consume_from": consume_from, **settings})
    except Exception as exc:
        if getattr(exc, "code", None) != "CONSUMER_GROUP_EXISTS":
            raise
    # The group's name as one path segment: ``%DLQ%g`` style names hold percent signs.
    return admin.patch(f"/v1/groups/{quote(group, safe='')}", settings)


def compensation_listener(
    handler: Callable[[Compensation, MessageView], Any],
) -> Callable[[MessageView], ConsumeResult]:
    """A push-consumer listener: decode, call ``handler``; an exception means retry later.

    A body that is not a compensation is retried too, and so ends in the
    alert topic where someone looks at it, rather than being dropped.
    """

    def listener(message: MessageView) -> ConsumeResult:
        try:
            handler(Compensation.from_message(message), message)
        except Exception as exc:  # noqa: BLE001 - any failure is retried by the group's policy
            log.warning(
                "event=compensation_failed message_id=%s attempt=%d error=%s",
                message.message_id,
                message.delivery_attempt,
                type(exc).__name__,
            )
            return ConsumeResult.LATER
        return ConsumeResult.SUCCESS

    return listener


# -- RabbitMQ: one TTL queue per tier, dead-lettered back to the work queue ----------------


class RabbitRetryQueue:
    """A durable work queue with tiered retries and an alert queue, on one aio-pika channel.

    Topology for work queue ``Q`` and tiers ``1s, 5s, ...``:

    - ``Q``: the work queue, bound to the direct exchange ``Q.requeue``;
    - ``Q.retry.1000ms``, ``Q.retry.5000ms``, ...: ``x-message-ttl`` = tier,
      dead-lettering into ``Q.requeue`` with routing key ``Q``;
    - ``Q.alert`` (or ``alert_queue``): where the last failure goes.

    A failed message is republished (persistent, confirmed) to the next tier
    with ``halfmoon-attempts`` incremented, then the original is acked: a
    crash between the two duplicates it (at-least-once; the inbox removes
    the duplicate effect), never loses it.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        queue: str,
        *,
        tiers: Sequence[float] = DEFAULT_BACKOFF,
        alert_queue: str | None = None,
    ) -> None:
        if not tiers or any(t <= 0 for t in tiers):
            raise InvalidArgument(
                "RabbitMQ retry tiers must be a non-empty list of positive seconds"
            )
        self.channel = channel
        self.queue = queue
        self.tiers = tuple(tiers)
        self.requeue_exchange = f"{queue}.requeue"
        self.tier_queues = [f"{queue}.retry.{int(t * 1000)}ms" for t in self.tiers]
        self.alert_queue = alert_queue or f"{queue}.alert"
        self.retried = 0
        self.alerted = 0

    async def declare(self) -> None:
        require("amqp")
        import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import

        exchange = await self.channel.declare_exchange(
            self.requeue_exchange, aio_pika.ExchangeType.DIRECT, durable=True
        )
        work = await self.channel.declare_queue(self.queue, durable=True)
        await work.bind(exchange, routing_key=self.queue)
        for name, delay in zip(self.tier_queues, self.tiers, strict=True):
            await self.channel.declare_queue(
                name,
                durable=True,
                arguments={
                    "x-message-ttl": int(delay * 1000),
                    "x-dead-letter-exchange": self.requeue_exchange,
                    "x-dead-letter-routing-key": self.queue,
                },
            )
        await self.channel.declare_queue(self.alert_queue, durable=True)

    async def delete(self) -> None:
        """Remove the whole topology (tests, teardown)."""
        for name in [self.queue, *self.tier_queues, self.alert_queue]:
            await self.channel.queue_delete(name)
        await self.channel.exchange_delete(self.requeue_exchange)

    async def publish(
        self,
        body: bytes,
        *,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = None,
    ) -> None:
        """Publish to the work queue (persistent; awaits the publisher confirm)."""
        await self._publish(self.queue, body, dict(headers or {}), message_id, content_type)

    async def publish_compensation(self, compensation: Compensation) -> None:
        await self.publish(
            compensation.to_bytes(),
            message_id=compensation.idempotency_key,
            content_type=CONTENT_TYPE,
        )

    async def _publish(
        self,
        routing_key: str,
        body: bytes,
        headers: dict[str, Any],
        message_id: str | None,
        content_type: str | None,
    ) -> None:
        require("amqp")
        import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import

        message = aio_pika.Message(
            body,
            headers=headers,
            message_id=message_id,
            content_type=content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await self.channel.default_exchange.publish(
            message, routing_key=routing_key, mandatory=True
        )

    async def consume(
        self, handler: Callable[[Any, int], Awaitable[None]], *, prefetch: int = 16
    ) -> str:
        """Consume the work queue with ``handler(message, attempts_before)``; the consumer tag.

        ``attempts_before`` is 0 on the first delivery. Returning acks the
        message; raising sends it to the next tier, or to the alert queue
        after the last one.
        """
        await self.channel.set_qos(prefetch_count=prefetch)
        queue = await self.channel.get_queue(self.queue)

        async def on_message(message: AbstractIncomingMessage) -> None:
            attempts = attempts_of(message.headers)
            try:
                await handler(message, attempts)
            except Exception as exc:  # noqa: BLE001 - a failure is retried, never dropped
                await self._fail(message, attempts + 1, exc)
                return
            await message.ack()

        return await queue.consume(on_message)

    async def _fail(
        self, message: AbstractIncomingMessage, attempts: int, exc: BaseException
    ) -> None:
        headers = dict(message.headers or {})
        headers[ATTEMPTS_HEADER] = attempts
        # The exception type only: its text may carry business data.
        headers["halfmoon-last-error"] = type(exc).__name__
        if attempts <= len(self.tiers):
            target = self.tier_queues[attempts - 1]
            self.retried += 1
        else:
            target = self.alert_queue
            self.alerted += 1
            log.warning(
                "event=compensation_alert queue=%s message_id=%s attempts=%d",
                self.queue,
                message.message_id,
                attempts,
            )
        await self._publish(target, message.body, headers, message.message_id, message.content_type)
        await message.ack()


def attempts_of(headers: Mapping[str, Any] | None) -> int:
    """The failed attempts recorded in ``halfmoon-attempts`` (0 when absent or unreadable)."""
    value = (headers or {}).get(ATTEMPTS_HEADER, 0)
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0
