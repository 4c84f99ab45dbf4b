"""A queue's broker unreachable (a cluster broker down or restarting): a consumer waits for it
and goes on delivering, where a consumer whose queue is gone is cancelled; an ack or a
requeue is tried again until it reaches the broker, where one of a delivery gone is done."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from halfmoon.amqp import queues as queues_module
from halfmoon.amqp.consumer import Consumer
from halfmoon.amqp.queues import Queues
from halfmoon.amqp.topology import Queue
from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.facade_types import ALREADY_DURABLE, Pending, Written
from halfmoon.broker.message import MessageView
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.errors import Unavailable

OUTAGE = 2  # receives that find the broker away


class Broker:
    """The queue's side of a consumer: receives fail ``failures`` times, then deliver one."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.delivered = asyncio.Event()

    async def receive(
        self, stored: str, count: int, client_id: str
    ) -> tuple[list[MessageView], int | None]:
        if self.failures:
            raise self.failures.pop(0)
        if self.delivered.is_set():
            await asyncio.Event().wait()  # nothing more
        return [SimpleNamespace(body=b"m0")], None  # type: ignore[list-item]


def consumer_of(broker: Broker) -> tuple[Consumer, list[Any], asyncio.Event]:
    delivered: list[Any] = []
    lost = asyncio.Event()

    async def deliver(consumer: Consumer, view: MessageView) -> None:
        delivered.append(view.body)
        broker.delivered.set()

    server = SimpleNamespace(
        may_deliver=lambda consumer: True,
        arrivals=SimpleNamespace(watch=lambda *a: None, unwatch=lambda *a: None),
        queues=broker,
    )
    channel = SimpleNamespace(
        server=server,
        client_id="c-1",
        flow_paused=False,
        global_credit=lambda: None,
        deliver=deliver,
        consumer_lost=lambda consumer: lost.set(),
    )
    consumer = Consumer(channel, "tag", Queue("q", "q"), False, 1, False)  # type: ignore[arg-type]
    return consumer, delivered, lost


def test_a_consumer_waits_for_its_broker_and_goes_on() -> None:
    async def run() -> tuple[list[Any], bool]:
        broker = Broker([Unavailable("broker-a is down") for _ in range(OUTAGE)])
        consumer, delivered, lost = consumer_of(broker)
        consumer.start()
        await asyncio.wait_for(broker.delivered.wait(), 30)  # a recheck a second
        await consumer.stop()
        return delivered, lost.is_set()

    delivered, lost = asyncio.run(run())
    assert delivered == [b"m0"]
    assert not lost


def test_a_consumer_whose_queue_is_gone_is_cancelled() -> None:
    async def run() -> list[Any]:
        broker = Broker([TopicNotFound("no topic 'q'")])
        consumer, delivered, lost = consumer_of(broker)
        consumer.start()
        await asyncio.wait_for(lost.wait(), 10)
        await consumer.stop()
        return delivered

    assert asyncio.run(run()) == []


class SettlingBroker:
    """Acks and requeues that find the broker away ``outage`` times, then apply."""

    def __init__(self, outage: int) -> None:
        self.outage = outage
        self.applied: list[tuple[str, str]] = []

    def ack_nowait(self, group: str, topic: str, handles: list[str]) -> Pending[list[None]]:
        return Pending(lambda: Written([None] * len(handles), ALREADY_DURABLE))  # a hop away

    def _apply(self, what: str, handle: str) -> None:
        if self.outage:
            self.outage -= 1
            raise Unavailable("broker-a is restarting")
        if handle == "gone":
            raise InvalidReceiptHandle("already acked")
        self.applied.append((what, handle))

    def ack(self, group: str, topic: str, handle: str) -> None:
        self._apply("ack", handle)

    def change_invisible_duration(self, group: str, topic: str, handle: str, ms: int) -> str:
        self._apply("requeue", handle)
        return handle


def test_an_ack_and_a_requeue_wait_for_their_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues_module, "SETTLE_RETRY_EVERY_S", 0.01)
    broker = SettlingBroker(outage=3)
    queues = Queues(broker, None)  # type: ignore[arg-type]

    async def run() -> None:
        await queues.ack("q", ["h1", "gone", "h2"])
        await queues.requeue("q", ["h3"])

    asyncio.run(run())
    assert broker.applied == [("ack", "h1"), ("ack", "h2"), ("requeue", "h3")]
