"""RabbitMQ, the endpoint benchmark's peer, through aio-pika.

Durability as a careful RabbitMQ user sets it up: a durable (classic) queue,
persistent messages (delivery_mode 2) and publisher confirms; a send counts
only once its confirm arrived. RabbitMQ confirms a persistent message routed
to a durable queue after it is written *and fsync'd*; its message store
batches those fsyncs (every few hundred ms under load, at once when idle), so
a confirm is a group-committed, fsync-backed promise, like halfmoon's
``--flush sync``.

Shapes (the same as halfmoon's, see ``bench/load.py``):

* a producer is one AMQP channel in confirm mode; a "batch of 32" is 32
  publishes awaited together (AMQP has no batch publish);
* a consumer is one channel with ``basic.qos(prefetch=32)`` and
  ``basic_consume``, acking every message.

Every queue this peer declares is named ``halfmoon-bench-<pid>-<what>`` and
deleted on :meth:`AmqpPeer.close` (or by RabbitMQ after 15 idle minutes, if
a run dies first).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from bench.load import (
    BODY_SIZE,
    Arrivals,
    Throughput,
    body,
    end_to_end_latencies,
    find_process,
    process_cpu_seconds,
    seq_of,
    sequential_latencies,
    timed_producers,
)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
URL_ENV = "HALFMOON_TEST_AMQP"
PREFETCH = 32
QUEUE_EXPIRES_MS = 15 * 60 * 1000
NAME = "RabbitMQ"


def amqp_url() -> str:
    return os.environ.get(URL_ENV) or DEFAULT_URL


class AmqpUnavailable(RuntimeError):
    """RabbitMQ cannot be reached at the configured URL."""


class AmqpPeer:
    """RabbitMQ over one connection; channels per producer / consumer."""

    name = NAME

    def __init__(self, connection: Any, prefix: str) -> None:
        self._connection = connection
        self._prefix = prefix
        self._queues: dict[str, Any] = {}  # name -> aio_pika Queue on the admin channel
        self._admin: Any = None

    @classmethod
    async def open(cls, url: str | None = None, timeout: float = 5.0) -> AmqpPeer:
        import aio_pika

        url = url or amqp_url()
        try:
            connection = await asyncio.wait_for(aio_pika.connect(url), timeout)
        except Exception as exc:  # noqa: BLE001 - any failure to connect means "not available"
            raise AmqpUnavailable(f"cannot connect to RabbitMQ at {url}: {exc!r}") from exc
        peer = cls(connection, f"halfmoon-bench-{os.getpid()}")
        peer._admin = await connection.channel(publisher_confirms=False)
        return peer

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            for queue in self._queues.values():
                await queue.delete(if_unused=False, if_empty=False)
        await self._connection.close()

    def server_cpu(self) -> float | None:
        """CPU seconds RabbitMQ's Erlang VM has used so far, when it runs on this machine."""
        pid = find_process("beam.smp")
        return process_cpu_seconds(pid) if pid is not None else None

    async def server_version(self) -> str:
        props = getattr(self._connection.transport.connection, "server_properties", {}) or {}
        version = props.get("version", "?")
        return version.decode() if isinstance(version, bytes) else str(version)

    # -- plumbing -------------------------------------------------------------

    async def _fresh_queue(self, what: str) -> str:
        """A durable queue for one scenario, empty."""
        name = f"{self._prefix}-{what}"
        # x-expires only removes the queue if a crashed run leaves it behind unused;
        # it changes nothing about how messages are stored.
        queue = await self._admin.declare_queue(
            name, durable=True, arguments={"x-expires": QUEUE_EXPIRES_MS}
        )
        await queue.purge()
        self._queues[name] = queue
        return name

    async def _purge(self, name: str) -> None:
        await self._queues[name].purge()

    async def _confirm_channel(self) -> Any:
        return await self._connection.channel(publisher_confirms=True)

    @staticmethod
    def _message(payload: bytes) -> Any:
        import aio_pika

        return aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    # -- scenarios --------------------------------------------------------------

    async def produce(
        self, producers: int, batch: int, seconds: float, latencies: list[float] | None = None
    ) -> Throughput:
        queue = await self._fresh_queue("produce")
        channels = [await self._confirm_channel() for _ in range(producers)]
        payload = body(0, BODY_SIZE)
        try:

            async def send_round(index: int) -> int:
                exchange = channels[index].default_exchange
                await asyncio.gather(
                    *(
                        exchange.publish(self._message(payload), routing_key=queue)
                        for _ in range(batch)
                    )
                )
                return batch

            result = await timed_producers(producers, seconds, send_round, latencies)
        finally:
            for channel in channels:
                await channel.close()
        await self._purge(queue)
        return result

    async def send_latencies(self, count: int) -> list[float]:
        queue = await self._fresh_queue("latency")
        channel = await self._confirm_channel()
        try:

            async def send_one(seq: int) -> None:
                await channel.default_exchange.publish(self._message(body(seq)), routing_key=queue)

            samples = await sequential_latencies(count, send_one)
        finally:
            await channel.close()
        await self._purge(queue)
        return samples

    async def end_to_end_latencies(self, count: int, settle: float = 0.0) -> list[float]:
        """Publish → ``basic_consume``, one message at a time; ``settle``: seconds the producer
        idles before each send, as a benchmark that parks a long poll first must (an idle
        broker and consumer take longer to wake than busy ones)."""
        queue_name = await self._fresh_queue("e2e")
        producer = await self._confirm_channel()
        consumer = await self._connection.channel()
        arrivals = Arrivals()
        try:
            await consumer.set_qos(prefetch_count=PREFETCH)
            queue = await consumer.get_queue(queue_name, ensure=False)

            async def on_message(message: Any) -> None:
                arrivals.arrived(seq_of(message.body))
                await message.ack()

            await queue.consume(on_message, no_ack=False)

            async def send_one(seq: int) -> None:
                await producer.default_exchange.publish(
                    self._message(body(seq)), routing_key=queue_name
                )

            return await end_to_end_latencies(count, arrivals, send_one, settle=settle)
        finally:
            await consumer.close()
            await producer.close()

    async def consume(self, messages: int, consumers: int) -> Throughput:
        """Receive and ack ``messages`` pre-sent messages with ``consumers`` channels."""
        queue_name = await self._fresh_queue("consume")
        await self._fill(queue_name, messages)
        done = asyncio.Event()
        acked = 0
        channels = [await self._connection.channel() for _ in range(consumers)]
        try:

            async def on_message(message: Any) -> None:
                nonlocal acked
                await message.ack()
                acked += 1
                if acked >= messages:
                    done.set()

            loop = asyncio.get_running_loop()
            started = loop.time()
            for channel in channels:
                await channel.set_qos(prefetch_count=PREFETCH)
                queue = await channel.get_queue(queue_name, ensure=False)
                await queue.consume(on_message, no_ack=False)
            await asyncio.wait_for(done.wait(), timeout=max(30.0, messages / 500))
            return Throughput(acked, loop.time() - started)
        finally:
            for channel in channels:
                await channel.close()

    async def _fill(self, queue: str, messages: int) -> None:
        """Pre-send ``messages`` confirmed messages (16 producers, batches of 32)."""
        channels = [await self._confirm_channel() for _ in range(16)]
        payload = body(0, BODY_SIZE)
        remaining = messages

        async def fill(channel: Any) -> None:
            nonlocal remaining
            while remaining > 0:
                n = min(32, remaining)
                remaining -= n
                await asyncio.gather(
                    *(
                        channel.default_exchange.publish(self._message(payload), routing_key=queue)
                        for _ in range(n)
                    )
                )

        try:
            await asyncio.gather(*(fill(c) for c in channels))
        finally:
            for channel in channels:
                await channel.close()
