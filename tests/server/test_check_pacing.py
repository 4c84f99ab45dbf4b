"""Checks paced to the producers: the check service with the real TelemetryCheckSender on a
FakeClock.

The broker ticks on a worker thread (the sender hops onto the event loop and
waits for it, as from the broker's tick thread); the "producer" is the test
draining its telemetry outbox and answering through the broker.
"""

from __future__ import annotations

import asyncio
import itertools

from rocketmq.grpc_protocol import definition_pb2

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transactions import TransactionConfig
from halfmoon.broker.transactions.check import CheckRequest
from halfmoon.server.check_sender import TelemetryCheckSender
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.store.memory import MemoryStore

PRODUCER = definition_pb2.ClientType.PRODUCER
STEP_MS = 250  # the fake clock moves in small steps, a slow producer answers a few checks per step


class Setup:
    def __init__(self, cap: int = 5, check_max: int = 3) -> None:
        self.clock = FakeClock()
        config = TransactionConfig(
            timeout_ms=1_000,
            check_interval_ms=2_000,
            check_max=check_max,
            max_outstanding_checks_per_producer=cap,
        )
        self.broker = Broker(MemoryStore(), None, BrokerConfig(), self.clock, config)
        self.broker.create_topic("orders", MessageType.TRANSACTION)
        self.registry = ClientRegistry()
        self.registry.bind_loop(asyncio.get_running_loop())
        self.sender = TelemetryCheckSender(self.registry, alive_within=30.0)
        self.broker.set_check_sender(self.sender)
        self.outboxes: dict[str, asyncio.Queue] = {}
        self.received: list[str] = []  # transaction ids of every check a producer got

    def connect(self, client_id: str) -> None:
        self.registry.touch(client_id, client_type=PRODUCER, group="pg")
        _, self.outboxes[client_id] = self.registry.open_stream(client_id)
        self.registry.note_topic(client_id, "orders")

    def plant(self, count: int) -> list[str]:
        messages = [
            OutgoingMessage(
                "orders", b"x", message_type=MessageType.TRANSACTION, producer_group="pg"
            )
            for _ in range(count)
        ]
        return [r.transaction_id for r in self.broker.send(messages)]

    def queued(self, client_id: str) -> list[tuple[str, str]]:
        """Take the checks waiting in a producer's outbox: (message id, transaction id)."""
        outbox, taken = self.outboxes[client_id], []
        while not outbox.empty():
            command = outbox.get_nowait().recover_orphaned_transaction_command
            taken.append((command.message.system_properties.message_id, command.transaction_id))
            self.received.append(command.transaction_id)
        return taken

    async def step(self) -> None:
        self.clock.advance(STEP_MS)
        for client_id in self.outboxes:
            self.registry.touch(client_id)
        await asyncio.to_thread(self.broker.tick)
        while self.broker._checks.scanning:
            await asyncio.to_thread(self.broker.tick)

    def answer(self, message_id: str, transaction_id: str) -> None:
        self.broker.end_transaction("orders", message_id, transaction_id, "commit", "check")

    def pending(self) -> int:
        return len(self.broker.list_transactions())


def test_a_slow_producer_is_never_parked_while_it_keeps_answering() -> None:
    async def body() -> None:
        s = Setup(cap=5, check_max=3)
        s.connect("p1")
        s.plant(40)
        backlog: list[tuple[str, str]] = []  # the producer answers one check per step, in order
        for _ in range(400):
            await s.step()
            backlog.extend(s.queued("p1"))
            assert len(backlog) <= 5  # never more than the cap waiting at the producer
            if backlog:
                s.answer(*backlog.pop(0))
            if s.pending() == 0:
                break
        assert s.pending() == 0
        assert s.broker.parked_transactions() == []
        assert len(s.received) == 40  # one check per transaction: no duplicates
        stats = s.broker.transaction_stats()
        assert (stats.committed_total, stats.checks_sent_total, stats.parked_total) == (40, 40, 0)

    asyncio.run(body())


def test_a_producer_that_stops_answering_still_reaches_check_max() -> None:
    async def body() -> None:
        s = Setup(cap=5, check_max=3)
        s.connect("p1")
        ids = s.plant(12)
        for _ in range(400):
            await s.step()
            s.queued("p1")  # received, never answered
            if len(s.broker.parked_transactions()) == 12:
                break
        assert {t.transaction_id for t in s.broker.parked_transactions()} == set(ids)
        assert sorted(s.received) == sorted(ids * 3)  # each checked check_max times, then parked
        assert s.sender.outstanding.lost_total > 0

    asyncio.run(body())


def test_a_dead_streams_outstanding_checks_are_released() -> None:
    async def body() -> None:
        s = Setup(cap=5, check_max=15)
        s.connect("p1")
        ids = s.plant(8)
        for _ in range(40):
            await s.step()
            if not s.outboxes["p1"].empty():
                break
        first = s.queued("p1")
        assert len(first) == 5  # the cap
        stream = s.outboxes["p1"]
        assert s.sender.outstanding.count(stream) == 5
        # p1 dies; p2 of the same group connects. p1's checks are released at the next hand-off
        # (not left to occupy slots until they count as lost) and all eight reach p2.
        s.registry.close_stream(s.registry.get("p1"), stream)
        del s.outboxes["p1"]
        s.connect("p2")
        got: dict[str, tuple[str, str]] = {}
        for _ in range(40):
            await s.step()
            got.update((t, (m, t)) for m, t in s.queued("p2"))
            if len(got) == 8:
                break
        assert s.sender.outstanding.released_total == 5
        assert s.sender.outstanding.count(stream) == 0
        assert set(got) == set(ids)
        for answer in got.values():
            s.answer(*answer)
        for _ in range(200):
            await s.step()
            for answer in s.queued("p2"):
                s.answer(*answer)
            if not s.pending():
                break
        assert s.pending() == 0
        assert s.broker.parked_transactions() == []

    asyncio.run(body())


def test_no_second_check_while_the_first_is_outstanding_and_an_answer_clears_it() -> None:
    async def body() -> None:
        s = Setup(cap=5)
        s.connect("p1")
        (tid,) = s.plant(1)
        message = s.broker.transactions.checks.check_view(
            s.broker.transactions.checks.checkable(
                next(iter(s.broker.transactions.pending)), s.clock.now_ms() + 10_000
            )
        )
        request = CheckRequest("pg", "orders", message, tid)
        assert await asyncio.to_thread(s.sender.send_checks, [request, request]) == [True, False]
        assert await asyncio.to_thread(s.sender.send_checks, [request]) == [False]
        s.sender.answered(tid)
        assert await asyncio.to_thread(s.sender.send_checks, [request]) == [True]
        # A stream at its cap takes no more; another stream with room does.
        others = [CheckRequest("pg", "orders", message, f"X{i}") for i in range(4)]
        assert await asyncio.to_thread(s.sender.send_checks, others) == [True] * 4
        assert not s.sender.outstanding.has_room(s.outboxes["p1"])
        extra = CheckRequest("pg", "orders", message, "X9")
        assert await asyncio.to_thread(s.sender.send_checks, [extra]) == [False]
        s.connect("p2")
        assert await asyncio.to_thread(s.sender.send_checks, [extra]) == [True]
        assert [t for _, t in s.queued("p2")] == ["X9"]

    asyncio.run(body())


def test_round_robin_prefers_streams_with_room() -> None:
    async def body() -> None:
        s = Setup(cap=3)
        for client_id in ("p1", "p2"):
            s.connect(client_id)
        (tid,) = s.plant(1)
        message = s.broker.transactions.checks.check_view(
            s.broker.transactions.checks.checkable(
                next(iter(s.broker.transactions.pending)), s.clock.now_ms() + 10_000
            )
        )
        ids = itertools.count()
        batch = [CheckRequest("pg", "orders", message, f"T{next(ids)}") for _ in range(7)]
        assert await asyncio.to_thread(s.sender.send_checks, batch) == [True] * 6 + [False]
        assert (len(s.queued("p1")), len(s.queued("p2"))) == (3, 3)

    asyncio.run(body())
