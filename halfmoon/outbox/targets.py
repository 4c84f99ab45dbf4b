"""Where the relay publishes: halfmoon (acknowledged sends) or RabbitMQ (publisher confirms).

A target has a synchronous, thread-safe ``publish(records)`` returning one
result per record, ``None`` for published or the exception that stopped it,
so one bad message never fails its neighbours. Both targets run their
asyncio clients on the process-wide background loop of
:mod:`halfmoon.client.sync`; the relay's worker threads submit to it.

``target_for_url`` maps ``halfmoon://HOST:PORT`` and ``amqp://…``/``amqps://…``
to a target (the CLI's ``--target``).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from halfmoon.client.credentials import Credentials
from halfmoon.client.endpoints import check_endpoints, split_endpoints
from halfmoon.client.message import Message
from halfmoon.client.producer import Producer
from halfmoon.client.sync import run_sync
from halfmoon.extras import require
from halfmoon.outbox.errors import OutboxError
from halfmoon.outbox.outbox import OutboxRecord

if TYPE_CHECKING:  # aiormq comes with the optional aio-pika
    from aio_pika.abc import AbstractChannel, AbstractConnection
    from aiormq.abc import FieldTable

log = logging.getLogger("halfmoon.outbox")

Results = list[BaseException | None]

# Properties (halfmoon) / headers (RabbitMQ) every relayed message carries.
MESSAGE_ID_HEADER = "outbox_message_id"
AGGREGATE_TYPE_HEADER = "outbox_aggregate_type"
AGGREGATE_ID_HEADER = "outbox_aggregate_id"


class InvalidTarget(OutboxError):
    code = "OUTBOX_INVALID_TARGET"
    protocol_code = "BAD_REQUEST"
    http_status = 400


class UnroutableMessage(OutboxError):
    """RabbitMQ returned a mandatory message: no queue is bound for its routing key."""

    code = "OUTBOX_UNROUTABLE"
    protocol_code = "INTERNAL_ERROR"


class PublishTarget(abc.ABC):
    """The interface: ``start``, ``publish`` (thread-safe), ``close``; a subclass implements
    ``publish`` at least."""

    name = "target"

    # start and close are documented no-ops: a target with nothing to open overrides neither.
    def start(self) -> None:  # noqa: B027
        """Connect (optional: ``publish`` connects on first use)."""

    @abc.abstractmethod
    def publish(self, records: Sequence[OutboxRecord]) -> Results:
        """Publish ``records``; one result per record, in order (None: sent)."""

    def close(self) -> None:  # noqa: B027
        """Release connections."""

    def __enter__(self) -> PublishTarget:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _headers(record: OutboxRecord) -> dict[str, str]:
    headers = dict(record.headers)
    headers[MESSAGE_ID_HEADER] = record.message_id
    if record.aggregate_type or record.aggregate_id:
        headers[AGGREGATE_TYPE_HEADER] = record.aggregate_type
        headers[AGGREGATE_ID_HEADER] = record.aggregate_id
    return headers


# -- halfmoon -----------------------------------------------------------------------------


class HalfmoonTarget(PublishTarget):
    """Publishes to a halfmoon broker with acknowledged sends, one request per topic per batch.

    A batch request that fails is retried message by message, so a message the
    broker refuses (oversize body, wrong topic type) fails alone.
    """

    name = "halfmoon"

    def __init__(self, url: str, *, timeout: float = 10.0, **producer_options: Any) -> None:
        parts = urlsplit(url if "://" in url else f"halfmoon://{url}")
        # halfmoon://HOST:PORT, or a cluster's proxies halfmoon://HOST:PORT;HOST:PORT.
        try:
            if parts.scheme != "halfmoon":
                raise ValueError(parts.scheme)
            self.endpoint = ";".join(split_endpoints(check_endpoints(parts.netloc)))
        except ValueError:
            raise InvalidTarget(
                f"halfmoon target {url!r} must look like halfmoon://HOST:PORT "
                "(or halfmoon://HOST:PORT;HOST:PORT for a cluster's proxies)"
            ) from None
        self.timeout = timeout
        # A broker with authentication on: credentials= here, else HALFMOON_ACCESS_KEY/SECRET_KEY.
        producer_options.setdefault("credentials", Credentials.from_env())
        self._options = producer_options
        self._producer: Producer | None = None
        self._starting: asyncio.Lock | None = None

    def start(self) -> None:
        run_sync(self._ensure())

    async def _ensure(self) -> Producer:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._producer is None:
                producer = Producer(self.endpoint, **self._options)
                await producer.start()
                self._producer = producer
        return self._producer

    def publish(self, records: Sequence[OutboxRecord]) -> Results:
        return run_sync(self._publish(records))

    async def _publish(self, records: Sequence[OutboxRecord]) -> Results:
        producer = await self._ensure()
        results: Results = [None] * len(records)
        by_topic: dict[tuple[str, bool], list[int]] = defaultdict(list)
        for i, record in enumerate(records):
            by_topic[(record.topic, record.message_group is not None)].append(i)

        async def send_group(indexes: list[int]) -> None:
            messages: list[Message] = []
            ok: list[int] = []
            for i in indexes:
                try:
                    messages.append(self._message(records[i]))
                    ok.append(i)
                except Exception as exc:  # noqa: BLE001 — a malformed row fails alone
                    results[i] = exc
            if not messages:
                return
            try:
                await producer.send_batch(messages, timeout=self.timeout)
                return
            except Exception as exc:  # noqa: BLE001
                if len(messages) == 1:
                    results[ok[0]] = exc
                    return
                log.info(
                    "event=outbox_batch_send_failed topic=%s size=%d error=%r; sending one by one",
                    messages[0].topic,
                    len(messages),
                    exc,
                )
            singles = await asyncio.gather(
                *(producer.send(m, timeout=self.timeout) for m in messages), return_exceptions=True
            )
            for i, outcome in zip(ok, singles, strict=True):
                results[i] = outcome if isinstance(outcome, BaseException) else None

        await asyncio.gather(*(send_group(ix) for ix in by_topic.values()))
        return results

    @staticmethod
    def _message(record: OutboxRecord) -> Message:
        return Message(
            topic=record.topic,
            body=record.payload,
            tag=record.tag,
            keys=[*record.keys, record.message_id],
            properties=_headers(record),
            message_group=record.message_group,
        )

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            run_sync(producer.close())


# -- RabbitMQ -----------------------------------------------------------------------------

_names = itertools.count(1)


class RabbitTarget(PublishTarget):
    """Publishes to RabbitMQ: persistent messages, publisher confirms, mandatory flag.

    A returned (unroutable) message is a publish failure, as is a nack. A
    dropped connection is reopened and the unconfirmed messages of the batch
    republished once at once; what still fails goes back to the relay's retry
    schedule. Republishing can duplicate a message whose confirm was lost:
    consumers dedupe on the ``message_id`` property.
    """

    name = "rabbitmq"

    def __init__(
        self, url: str, *, confirm_timeout: float = 10.0, connection_name: str | None = None
    ) -> None:
        if urlsplit(url).scheme not in ("amqp", "amqps"):
            raise InvalidTarget(f"RabbitMQ target {url!r} must be an amqp:// or amqps:// URL")
        self.url = url
        self.confirm_timeout = confirm_timeout
        self.connection_name = connection_name or f"halfmoon-outbox-relay-{next(_names)}"
        self.reconnects = 0
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._generation = 0
        self._lock: asyncio.Lock | None = None

    def start(self) -> None:
        run_sync(self._ensure())

    async def _ensure(self) -> tuple[AbstractChannel, int]:
        require("amqp")
        import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if (
                self._channel is None
                or self._channel.is_closed
                or self._connection is None  # never while there is a channel
                or self._connection.is_closed
            ):
                await self._drop()
                self._connection = await aio_pika.connect(
                    self.url, client_properties={"connection_name": self.connection_name}
                )
                self._channel = await self._connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
                if self._generation:
                    self.reconnects += 1  # every connection after the first
                self._generation += 1
            return self._channel, self._generation

    async def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):  # it is already broken
                await connection.close()

    async def _reset(self, generation: int) -> None:
        # Only the first worker to see a broken connection replaces it.
        assert self._lock is not None
        async with self._lock:
            if generation == self._generation and self._connection is not None:
                log.warning("event=outbox_rabbit_reconnect name=%s", self.connection_name)
                await self._drop()

    def publish(self, records: Sequence[OutboxRecord]) -> Results:
        return run_sync(self._publish(records))

    async def _publish(self, records: Sequence[OutboxRecord]) -> Results:
        results: Results = [None] * len(records)
        todo = list(range(len(records)))
        for attempt in (1, 2):
            try:
                channel, generation = await self._ensure()
            except Exception as exc:  # noqa: BLE001 — broker down: every message waits for the retry
                for i in todo:
                    results[i] = exc
                return results
            try:
                underlay = await channel.get_underlay_channel()
            except Exception as exc:  # noqa: BLE001 — the channel closed under us: reconnect below
                underlay = None
                outcomes: Sequence[BaseException | None] = [exc] * len(todo)
            if underlay is not None:
                # Every publish goes out before any confirm is awaited: one round trip per batch.
                outcomes = await asyncio.gather(
                    *(self._publish_one(underlay, records[i]) for i in todo), return_exceptions=True
                )
            broken: list[int] = []
            for i, outcome in zip(todo, outcomes, strict=True):
                results[i] = outcome if isinstance(outcome, BaseException) else None
                if isinstance(outcome, BaseException) and _connection_problem(outcome):
                    broken.append(i)
            if not broken:
                break
            await self._reset(generation)
            todo = broken
            if attempt == 1:
                log.info("event=outbox_rabbit_republish count=%d", len(broken))
        return results

    async def _publish_one(self, channel: Any, record: OutboxRecord) -> None:
        import aiormq  # here: comes with aio-pika, optional like it

        # Straight to aiormq's channel: aio-pika's Message and Exchange.publish add a
        # message object, a lock and a socket drain per publish, which made the
        # relay's event loop the bottleneck. ``wait=False`` skips only the drain: the
        # confirm below is what says the broker has the message.
        headers: FieldTable = {**_headers(record)}
        properties = aiormq.spec.Basic.Properties(
            content_type="application/octet-stream",
            delivery_mode=2,  # persistent
            headers=headers,
            message_id=record.message_id,
            message_type=record.tag,
        )
        try:
            result = await channel.basic_publish(
                record.payload,
                exchange=record.topic,
                routing_key=record.routing_key,
                properties=properties,
                mandatory=True,
                timeout=self.confirm_timeout,
                wait=False,
            )
        except aiormq.exceptions.PublishError as exc:
            raise UnroutableMessage(
                f"RabbitMQ returned message {record.message_id}: no queue bound to exchange "
                f"{record.topic!r} with routing key {record.routing_key!r}"
            ) from exc
        if isinstance(result, aiormq.abc.DeliveredMessage):
            raise UnroutableMessage(
                f"RabbitMQ returned message {record.message_id}: no queue bound to exchange "
                f"{record.topic!r} with routing key {record.routing_key!r}"
            )
        if not isinstance(result, aiormq.spec.Basic.Ack):
            raise OutboxError(
                f"RabbitMQ did not confirm message {record.message_id} ({type(result).__name__})"
            )

    def close(self) -> None:
        if self._connection is not None:
            run_sync(self._drop())


def _connection_problem(exc: BaseException) -> bool:
    import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import
    import aiormq  # here: comes with aio-pika, optional like it

    if isinstance(exc, UnroutableMessage | aio_pika.exceptions.DeliveryError):
        return False
    return isinstance(
        exc,
        aiormq.exceptions.AMQPConnectionError
        | aiormq.exceptions.ChannelInvalidStateError
        | ConnectionError
        | asyncio.TimeoutError
        | asyncio.CancelledError
        | RuntimeError
        | aiormq.exceptions.ChannelClosed,
    )


def target_for_url(url: str) -> PublishTarget:
    """The target a ``--target`` URL names: ``halfmoon://HOST:PORT`` or ``amqp(s)://…``."""
    scheme = urlsplit(url).scheme
    if scheme == "halfmoon":
        return HalfmoonTarget(url)
    if scheme in ("amqp", "amqps"):
        return RabbitTarget(url)
    raise InvalidTarget(
        f"unknown target {url!r}; use halfmoon://HOST:PORT or amqp://USER:PASS@HOST:PORT/VHOST"
    )
