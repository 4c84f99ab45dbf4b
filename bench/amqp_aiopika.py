"""The AMQP benchmark's scenarios through aio-pika, against any AMQP 0-9-1 server.

Durable queues and persistent messages (delivery mode 2) throughout; a
publish counts once its confirm (or its transaction's Commit-Ok) arrived.
Every queue is named ``halfmoon-bench-<pid>-<what>``, purged before use and
deleted at the end. Shapes (see bench/amqp_bench.py for the table):

* end to end: one publisher, one consumer (prefetch 100, acks), one message
  at a time, the publisher idle ``settle`` seconds before each send;
* confirmed throughput: N publishers, a channel each, 32 publishes in flight
  per publisher, for a fixed time;
* consume: 4 consumers with prefetch 100 acking every message of a pre-filled
  queue;
* tx: one channel in tx mode takes k deliveries from queue A, publishes k
  messages to queue B, acks the k and commits: transactions per second;
* fanout: a fanout exchange bound to 10 durable queues, confirmed publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

from bench.load import (
    BODY_SIZE,
    Arrivals,
    Throughput,
    body,
    end_to_end_latencies,
    seq_of,
    timed_producers,
)

PREFETCH = 100
IN_FLIGHT = 32


class AioPikaScenarios:
    """One connection to one server; each scenario opens the channels it needs."""

    def __init__(self, connection: Any, queue_arguments: dict[str, Any]) -> None:
        self._connection = connection
        self._arguments = queue_arguments
        self._prefix = f"halfmoon-bench-{os.getpid()}"
        self._declared: list[str] = []
        self._exchanges: list[str] = []
        self._admin: Any = None

    @classmethod
    async def open(cls, url: str, queue_arguments: dict[str, Any]) -> AioPikaScenarios:
        import aio_pika

        scenarios = cls(await asyncio.wait_for(aio_pika.connect(url), 10), queue_arguments)
        scenarios._admin = await scenarios._connection.channel(publisher_confirms=False)
        return scenarios

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            for name in self._declared:
                await self._admin.queue_delete(name)
            for name in self._exchanges:
                await self._admin.exchange_delete(name)
        await self._connection.close()

    async def _queue(self, what: str) -> str:
        name = f"{self._prefix}-{what}"
        queue = await self._admin.declare_queue(name, durable=True, arguments=self._arguments)
        await queue.purge()
        if name not in self._declared:
            self._declared.append(name)
        return name

    async def _purge(self, name: str) -> None:
        await (await self._admin.get_queue(name, ensure=False)).purge()

    @staticmethod
    def _message(payload: bytes) -> Any:
        import aio_pika

        return aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    async def _publish_confirmed(self, queue: str, messages: int, publishers: int = 8) -> None:
        channels = [await self._connection.channel() for _ in range(publishers)]
        payload = body(0, BODY_SIZE)
        remaining = messages

        async def fill(channel: Any) -> None:
            nonlocal remaining
            while remaining > 0:
                n = min(IN_FLIGHT, remaining)
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

    # -- scenarios ------------------------------------------------------------------------

    async def end_to_end(self, count: int, settle: float) -> list[float]:
        name = await self._queue("e2e")
        producer = await self._connection.channel()
        consumer = await self._connection.channel(publisher_confirms=False)
        arrivals = Arrivals()
        try:
            await consumer.set_qos(prefetch_count=PREFETCH)
            queue = await consumer.get_queue(name, ensure=False)

            async def on_message(message: Any) -> None:
                arrivals.arrived(seq_of(message.body))
                await message.ack()

            await queue.consume(on_message)

            async def send_one(seq: int) -> None:
                await producer.default_exchange.publish(self._message(body(seq)), routing_key=name)

            return await end_to_end_latencies(count, arrivals, send_one, settle=settle)
        finally:
            await consumer.close()
            await producer.close()

    async def confirmed(self, publishers: int, seconds: float) -> Throughput:
        name = await self._queue("confirmed")
        channels = [await self._connection.channel() for _ in range(publishers)]
        payload = body(0, BODY_SIZE)
        try:

            async def send_round(index: int) -> int:
                exchange = channels[index].default_exchange
                await asyncio.gather(
                    *(
                        exchange.publish(self._message(payload), routing_key=name)
                        for _ in range(IN_FLIGHT)
                    )
                )
                return IN_FLIGHT

            return await timed_producers(publishers, seconds, send_round)
        finally:
            for channel in channels:
                await channel.close()
            await self._purge(name)

    async def consume(
        self, messages: int, consumers: int, measure: Callable[[], Awaitable[None]] | None = None
    ) -> Throughput:
        """``measure`` runs once the queue is full, just before the consumers start."""
        name = await self._queue("consume")
        await self._publish_confirmed(name, messages)
        if measure is not None:
            await measure()
        done = asyncio.Event()
        acked = 0
        channels = [
            await self._connection.channel(publisher_confirms=False) for _ in range(consumers)
        ]

        async def on_message(message: Any) -> None:
            nonlocal acked
            await message.ack()
            acked += 1
            if acked >= messages:
                done.set()

        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            for channel in channels:
                await channel.set_qos(prefetch_count=PREFETCH)
                queue = await channel.get_queue(name, ensure=False)
                await queue.consume(on_message)
            await asyncio.wait_for(done.wait(), timeout=max(60.0, messages / 200))
            return Throughput(acked, loop.time() - started)
        finally:
            for channel in channels:
                await channel.close()

    async def tx_fill(self, messages: int) -> str:
        name = await self._queue("tx-in")
        await self._publish_confirmed(name, messages)
        return name

    async def tx(
        self, source: str, per_tx: int, seconds: float, available: int, channels: int = 1
    ) -> Throughput:
        """Transactions of ``per_tx`` (take from ``source``, publish to B, ack, commit), one
        after another on each of ``channels`` channels at once; ``available``: what
        ``source`` holds."""
        target = await self._queue("tx-out")
        opened = [await self._connection.channel(publisher_confirms=False) for _ in range(channels)]
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + seconds
        budget = available // per_tx  # transactions the source can feed, all channels together

        last = loop.time()  # the latest commit's answer: the run's end

        async def commits(channel: Any) -> int:
            nonlocal budget, last
            inbox: asyncio.Queue[Any] = asyncio.Queue()
            await channel.set_qos(prefetch_count=max(PREFETCH // channels, per_tx))
            queue = await channel.get_queue(source, ensure=False)
            await queue.consume(inbox.put)
            tx = channel.transaction()
            await tx.select()
            done = 0
            while loop.time() < stop_at and budget > 0:
                budget -= 1
                try:
                    # Bounded: with many channels, the last messages may sit in another
                    # channel's prefetch until it closes.
                    taken = [
                        await asyncio.wait_for(inbox.get(), stop_at - loop.time() + 1)
                        for _ in range(per_tx)
                    ]
                except TimeoutError:
                    break
                for message in taken:
                    await channel.default_exchange.publish(
                        self._message(message.body), routing_key=target
                    )
                await taken[-1].ack(multiple=True)
                await tx.commit()
                last = max(last, loop.time())
                done += 1
            return done

        try:
            started = loop.time()
            done = sum(await asyncio.gather(*(commits(c) for c in opened)))
            return Throughput(done, last - started)
        finally:
            for channel in opened:
                await channel.close()
            await self._purge(target)

    async def fanout(self, queues: int, messages: int) -> None:
        """Confirmed publishes of ``messages`` to a fanout exchange bound to ``queues`` queues."""
        import aio_pika

        exchange_name = f"{self._prefix}-fanout"
        exchange = await self._admin.declare_exchange(
            exchange_name, aio_pika.ExchangeType.FANOUT, durable=True
        )
        self._exchanges.append(exchange_name)
        for i in range(queues):
            name = await self._queue(f"fanout-{i}")
            await (await self._admin.get_queue(name, ensure=False)).bind(exchange_name)
        channel = await self._connection.channel()
        try:
            target = await channel.get_exchange(exchange_name, ensure=False)
            payload = body(0, BODY_SIZE)
            for start in range(0, messages, IN_FLIGHT):
                n = min(IN_FLIGHT, messages - start)
                await asyncio.gather(
                    *(target.publish(self._message(payload), routing_key="") for _ in range(n))
                )
        finally:
            await channel.close()
        del exchange
