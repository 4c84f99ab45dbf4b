"""RabbitMQ's intermediate-queue pattern: publish inside the transaction, forward after commit.

For code that must publish to RabbitMQ while its database transaction is
open. The writer, in its transaction:

1. inserts a unique id into ``{prefix}outbox_intermediate`` (the caller's connection);
2. publishes the message — with its real exchange and routing key in headers
   and the id as ``message_id`` — to an *intermediate* queue, with a confirm.

Then the transaction commits or rolls back. A :class:`IntermediateMover`
consumes the intermediate queue and, for each message:

3. contends for the id: ``INSERT`` it unless present (``ON CONFLICT DO NOTHING``,
   ``INSERT IGNORE``, ``INSERT OR IGNORE``). Because the writer inserted the id
   *before* publishing, the id is in the database in some transaction by the
   time the mover sees the message; the insert waits while that transaction is
   open (PostgreSQL and InnoDB wait on an uncommitted duplicate key; SQLite on
   the write lock). Afterwards the answer is final: a conflict means the writer
   committed; a successful insert means it rolled back (the mover rolls its own
   insert back and drops the message). So absence is "certainly over": no age
   limit or guesswork is needed;
4. forwards a committed message to its real exchange (persistent, confirmed,
   mandatory), then deletes the id, then acks the intermediate message.

A crash between 4's forward and delete forwards the message again; a crash
between delete and ack finds no id on redelivery and drops the copy. The id
is the consumer's idempotency key (``message_id`` property). If the lock wait
exceeds ``lock_timeout`` the message is requeued and examined again later.
An unroutable forward is rejected without requeue (give the intermediate
queue a dead-letter exchange to keep it); its id stays in the table.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, text

from halfmoon.client.sync import background_loop, run_sync
from halfmoon.outbox import dialects
from halfmoon.outbox.outbox import Executor, now_ms
from halfmoon.outbox.schema import outbox_tables
from halfmoon.outbox.targets import UnroutableMessage

if TYPE_CHECKING:  # aiormq comes with the optional aio-pika
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
    from aiormq.abc import FieldTable

log = logging.getLogger("halfmoon.outbox")

DEFAULT_QUEUE = "halfmoon.outbox.intermediate"
EXCHANGE_HEADER = "halfmoon-exchange"
ROUTING_KEY_HEADER = "halfmoon-routing-key"


class IntermediatePublisher:
    """The writer's half: ``publish(conn, exchange=..., routing_key=..., body=...)`` inside a
    transaction."""

    def __init__(
        self,
        amqp_url: str,
        *,
        table_prefix: str = "hm_",
        queue: str = DEFAULT_QUEUE,
        confirm_timeout: float = 10.0,
    ) -> None:
        self.amqp_url = amqp_url
        self.tables = outbox_tables(table_prefix)
        self.queue = queue
        self.confirm_timeout = confirm_timeout
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._lock: asyncio.Lock | None = None

    async def _ensure(self) -> AbstractChannel:
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
                if self._connection is not None and not self._connection.is_closed:
                    await self._connection.close()
                self._connection = await aio_pika.connect(
                    self.amqp_url,
                    client_properties={"connection_name": "halfmoon-intermediate-publisher"},
                )
                self._channel = await self._connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
                await self._channel.declare_queue(self.queue, durable=True)
            return self._channel

    def publish(
        self,
        connection_or_session: Executor,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Record the id in the caller's transaction, then park the message; returns the id.

        Raises if the intermediate publish is not confirmed: let it roll the transaction back.
        """
        key = message_id or uuid.uuid4().hex
        connection_or_session.execute(
            self.tables.intermediate.insert().values(id=key, created_at=now_ms())
        )
        run_sync(self._publish(key, exchange, routing_key, body, dict(headers or {})))
        return key

    async def _publish(
        self, key: str, exchange: str, routing_key: str, body: bytes, headers: dict[str, str]
    ) -> None:
        import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import

        channel = await self._ensure()
        table: FieldTable = {**headers, EXCHANGE_HEADER: exchange, ROUTING_KEY_HEADER: routing_key}
        message = aio_pika.Message(
            body=body,
            headers=table,
            message_id=key,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await channel.default_exchange.publish(
                message, routing_key=self.queue, mandatory=True, timeout=self.confirm_timeout
            )
        except aio_pika.exceptions.PublishError as exc:
            raise UnroutableMessage(
                f"intermediate queue {self.queue!r} does not exist; start a mover or declare it"
            ) from exc

    def close(self) -> None:
        if self._connection is not None:
            run_sync(self._connection.close())
            self._connection = None


@dataclass
class MoverStats:
    examined: int = 0
    forwarded: int = 0
    dropped: int = 0
    requeued: int = 0
    unroutable: int = 0


class IntermediateMover:
    """Forwards committed messages from the intermediate queue to their real exchanges."""

    def __init__(
        self,
        engine_or_url: Engine | str,
        amqp_url: str,
        *,
        table_prefix: str = "hm_",
        queue: str = DEFAULT_QUEUE,
        prefetch: int = 32,
        lock_timeout: float = 30.0,
        confirm_timeout: float = 10.0,
    ) -> None:
        self.engine = (
            dialects.make_engine(engine_or_url, pool_size=prefetch)
            if isinstance(engine_or_url, str)
            else engine_or_url
        )
        self.amqp_url = amqp_url
        self.tables = outbox_tables(table_prefix)
        self.queue = queue
        self.prefetch = prefetch
        self.lock_timeout = lock_timeout
        self.confirm_timeout = confirm_timeout
        self.stats = MoverStats()
        self._stop: asyncio.Event | None = None
        self._future: concurrent.futures.Future[None] | None = None
        self._started = threading.Event()

    # -- lifecycle (on the client's background loop) -------------------------------------------

    def start(self, timeout: float = 15.0) -> IntermediateMover:
        self._future = asyncio.run_coroutine_threadsafe(self.run(), background_loop())
        if not self._started.wait(timeout):
            if self._future.done():
                self._future.result()  # raise the start-up error
            raise TimeoutError(f"intermediate mover did not start within {timeout}s")
        return self

    def stop(self, timeout: float = 15.0) -> None:
        if self._stop is not None:
            background_loop().call_soon_threadsafe(self._stop.set)
        if self._future is not None:
            self._future.result(timeout)
            self._future = None

    async def run(self) -> None:
        """Consume until :meth:`stop`."""
        import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import

        self._stop = asyncio.Event()
        connection = await aio_pika.connect_robust(
            self.amqp_url, client_properties={"connection_name": "halfmoon-intermediate-mover"}
        )
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await channel.set_qos(prefetch_count=self.prefetch)
            queue = await channel.declare_queue(self.queue, durable=True)

            async def on_message(message: AbstractIncomingMessage) -> None:
                await self._handle(channel, message)

            tag = await queue.consume(on_message)
            self._started.set()
            await self._stop.wait()
            await queue.cancel(tag)
        finally:
            await connection.close()

    # -- one message -------------------------------------------------------------------------------

    async def _handle(self, channel: AbstractChannel, message: AbstractIncomingMessage) -> None:
        import aio_pika  # here: optional (only RabbitMQ needs it), and slow to import

        key = message.message_id
        self.stats.examined += 1
        if not key:
            log.error("event=intermediate_without_id; rejected")
            await message.reject(requeue=False)
            return
        try:
            committed = await asyncio.to_thread(self._writer_committed, key)
        except Exception as exc:  # noqa: BLE001 — lock timeout or database down: look again later
            self.stats.requeued += 1
            log.warning("event=intermediate_requeued id=%s error=%r", key, exc)
            await message.nack(requeue=True)
            return
        if not committed:
            self.stats.dropped += 1
            log.info("event=intermediate_dropped id=%s reason=rolled_back_or_done", key)
            await message.ack()
            return
        headers = dict(message.headers or {})
        exchange = _text(headers.pop(EXCHANGE_HEADER, ""))
        routing_key = _text(headers.pop(ROUTING_KEY_HEADER, ""))
        forward = aio_pika.Message(
            body=message.body,
            headers=headers,
            message_id=key,
            content_type=message.content_type,
            type=message.type if message.type not in (None, "None") else None,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            target = (
                channel.default_exchange
                if exchange == ""
                else await channel.get_exchange(exchange, ensure=False)
            )
            await target.publish(
                forward, routing_key=routing_key, mandatory=True, timeout=self.confirm_timeout
            )
        except aio_pika.exceptions.PublishError:
            self.stats.unroutable += 1
            log.error(
                "event=intermediate_unroutable id=%s exchange=%r routing_key=%r",
                key,
                exchange,
                routing_key,
            )
            await message.reject(requeue=False)
            return
        await asyncio.to_thread(self._forget, key)
        await message.ack()
        self.stats.forwarded += 1

    def _writer_committed(self, key: str) -> bool:
        """Wait for the writer's transaction to end; True if it committed the id."""
        with self.engine.connect() as conn, conn.begin() as tx:
            kind = dialects.backend(conn)
            if kind == "postgresql":
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(self.lock_timeout * 1000)}ms'"))
            elif kind == "mysql":
                conn.execute(
                    text(f"SET SESSION innodb_lock_wait_timeout = {max(int(self.lock_timeout), 1)}")
                )
            inserted = dialects.insert_if_absent(conn, self.tables, key, now_ms())
            # Either way nothing of ours stays: a rolled-back writer leaves no row.
            tx.rollback()
        return not inserted

    def _forget(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                delete(self.tables.intermediate).where(self.tables.intermediate.c.id == key)
            )

    def cleanup(self, older_than: float = 7 * 86400.0, batch: int = 1000) -> int:
        """Delete ids older than ``older_than`` seconds whose message never reached a mover.

        Only ids whose intermediate message was lost (queue purged) stay that
        long; make the window far longer than any mover outage.
        """
        t = self.tables.intermediate
        cutoff = now_ms() - int(older_than * 1000)
        with self.engine.begin() as conn:
            ids = [
                r.id
                for r in conn.execute(
                    t.select().with_only_columns(t.c.id).where(t.c.created_at < cutoff).limit(batch)
                )
            ]
            return conn.execute(delete(t).where(t.c.id.in_(ids))).rowcount if ids else 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
