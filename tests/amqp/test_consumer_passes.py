"""How often a consumer reads its queue: once per arrival, not once more after each delivery,
and a settle wakes only a consumer waiting for credit (each empty read cost a lone message
~25 µs of the loop, two of them per message). An arrival while a delivery is written is
never missed: the consumer reads again before it parks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from halfmoon.amqp import consumer as consumer_module
from halfmoon.amqp.consumer import Consumer
from halfmoon.amqp.topology import Queue
from halfmoon.broker.message import MessageView

DEADLINE_S = 30.0


class FakeQueue:
    """A queue and its arrivals: ``append`` stores a message and wakes the watchers."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.receives = 0
        self.watchers: set[asyncio.Event] = set()

    async def receive(
        self, stored: str, count: int, client_id: str
    ) -> tuple[list[MessageView], int | None]:
        self.receives += 1
        taken, self.messages = self.messages[:count], self.messages[count:]
        return [SimpleNamespace(body=b) for b in taken], None  # type: ignore[misc]

    def append(self, body: bytes) -> None:
        self.messages.append(body)
        for event in list(self.watchers):
            event.set()

    def watch(self, stored: str, event: asyncio.Event) -> None:
        self.watchers.add(event)

    def unwatch(self, stored: str, event: asyncio.Event) -> None:
        self.watchers.discard(event)


class Deliveries:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.changed = asyncio.Event()
        self.during: Any = None  # called while the first delivery is being written

    async def deliver(self, consumer: Consumer, view: MessageView) -> None:
        if self.during is not None:
            during, self.during = self.during, None
            during()
            await asyncio.sleep(0)  # the delivery's write: a loop turn
        consumer.unacked += 1
        self.bodies.append(view.body)
        self.changed.set()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while len(self.bodies) < count:
                self.changed.clear()
                await self.changed.wait()


def consumer_of(queue: FakeQueue, deliveries: Deliveries, prefetch: int) -> Consumer:
    server = SimpleNamespace(may_deliver=lambda consumer: True, arrivals=queue, queues=queue)
    channel = SimpleNamespace(
        server=server, client_id="c-1", flow_paused=False, global_credit=lambda: None,
        deliver=deliveries.deliver, consumer_lost=lambda consumer: None,
    )  # fmt: skip
    return Consumer(channel, "tag", Queue("q", "q"), False, prefetch, False)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_idle_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the periodic recheck, a missed wake-up leaves a message undelivered for good.
    monkeypatch.setattr(consumer_module, "IDLE_RECHECK_S", 3600.0)


async def _parked(queue: FakeQueue, reads: int) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while queue.receives < reads or not queue.watchers:
            await asyncio.sleep(0)


def test_each_arrival_costs_one_read() -> None:
    async def run() -> int:
        queue, deliveries = FakeQueue(), Deliveries()
        consumer = consumer_of(queue, deliveries, prefetch=0)
        consumer.start()
        await _parked(queue, 1)  # the first read found the queue empty
        for n in range(1, 4):
            queue.append(b"m%d" % n)
            await deliveries.until(n)
            await _parked(queue, 1 + n)
        await consumer.stop()
        return queue.receives

    assert asyncio.run(run()) == 4  # the empty one, then one per message


def test_an_arrival_while_a_delivery_is_written_is_read_at_once() -> None:
    async def run() -> list[bytes]:
        queue, deliveries = FakeQueue(), Deliveries()
        consumer = consumer_of(queue, deliveries, prefetch=0)
        deliveries.during = lambda: queue.append(b"m2")
        consumer.start()
        await _parked(queue, 1)
        queue.append(b"m1")
        await deliveries.until(2)
        await consumer.stop()
        return deliveries.bodies

    assert asyncio.run(run()) == [b"m1", b"m2"]


def test_a_settle_wakes_a_consumer_only_when_it_waits_for_credit() -> None:
    async def run() -> tuple[int, list[bytes]]:
        queue, deliveries = FakeQueue(), Deliveries()
        consumer = consumer_of(queue, deliveries, prefetch=1)
        consumer.start()
        await _parked(queue, 1)
        consumer.credit_freed()  # it has credit: no read for this
        queue.append(b"m1")
        await deliveries.until(1)  # its one unacked delivery: out of credit now
        queue.append(b"m2")  # woken, it finds no credit and waits for it
        async with asyncio.timeout(DEADLINE_S):
            while not consumer._awaiting_credit:
                await asyncio.sleep(0)
        reads_before_settle = queue.receives
        consumer.unacked -= 1
        consumer.credit_freed()
        await deliveries.until(2)
        await consumer.stop()
        return queue.receives - reads_before_settle, deliveries.bodies

    reads, bodies = asyncio.run(run())
    assert bodies == [b"m1", b"m2"]
    assert reads == 1
