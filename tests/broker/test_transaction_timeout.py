"""The transaction timeout: an undecided transaction group older than its timeout is rolled
back by the broker, with the deadline kept across a restart (fake clock; a real store for the
restart)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.consume import TransactionRolledBack
from halfmoon.errors import InvalidArgument
from halfmoon.store.memory import MemoryStore
from tests.broker.conftest import open_real_store

IN, OUT, GROUP = "in", "out", "workers"
TIMEOUT_MS = 10_000
SCAN_MS = 1_000
INVISIBLE = 60_000


def config() -> TransactionConfig:
    return TransactionConfig(group_timeout_ms=TIMEOUT_MS, group_timeout_scan_ms=SCAN_MS)


def prepare(broker: Broker) -> None:
    broker.create_topic(IN, MessageType.NORMAL, queue_count=1)
    broker.create_topic(OUT, MessageType.TRANSACTION, queue_count=1)
    broker.create_group(GROUP, consume_from="earliest")


def member(broker: Broker, txn: str, body: bytes, timeout_ms: int | None = None) -> None:
    broker.send(
        [
            OutgoingMessage(
                OUT,
                body,
                message_type=MessageType.TRANSACTION,
                producer_group="pg",
                transaction_group=txn,
                transaction_timeout_ms=timeout_ms,
            )
        ]
    )


def receive(broker: Broker) -> list[MessageView]:
    return broker.receive(GROUP, IN, FilterSpec(), 32, INVISIBLE)


def visible(broker: Broker) -> list[bytes]:
    return [m.body for m in broker.pull("reader", OUT, 0, 0, 100, FilterSpec()).messages]


def advance(broker: Broker, clock: FakeClock, ms: int) -> None:
    """Time passes in scan-sized steps, the broker ticking at each."""
    for _ in range(ms // SCAN_MS):
        clock.advance(SCAN_MS)
        broker.tick()


@pytest.fixture
def memory_broker(tmp_path: Path) -> tuple[Broker, FakeClock]:
    clock = FakeClock()
    broker = Broker(MemoryStore(clock.now_ms), tmp_path / "m", BrokerConfig(), clock, config())
    prepare(broker)
    return broker, clock


def test_a_sends_only_group_past_its_timeout_is_rolled_back(
    memory_broker: tuple[Broker, FakeClock],
) -> None:
    broker, clock = memory_broker
    member(broker, "t1", b"A")
    advance(broker, clock, TIMEOUT_MS - SCAN_MS)
    assert len(broker.list_transactions()) == 1  # not yet
    advance(broker, clock, 2 * SCAN_MS)
    assert broker.list_transactions() == []
    assert visible(broker) == []
    with pytest.raises(TransactionRolledBack, match="TRANSACTION_ROLLED_BACK"):
        broker.end_transaction_group("t1", "commit", consume_actions=0)
    assert broker.consuming.timed_out_total == 1


def test_a_producers_own_timeout_governs_its_group(
    memory_broker: tuple[Broker, FakeClock],
) -> None:
    broker, clock = memory_broker
    member(broker, "short", b"S", timeout_ms=3_000)
    member(broker, "long", b"L", timeout_ms=30_000)
    advance(broker, clock, 4_000)
    assert [t.transaction_group for t in broker.list_transactions()] == ["long"]
    advance(broker, clock, TIMEOUT_MS)  # past the broker's default: "long" asked for more
    assert [t.transaction_group for t in broker.list_transactions()] == ["long"]
    advance(broker, clock, 30_000)
    assert broker.list_transactions() == []


def test_a_group_decided_in_time_is_untouched(memory_broker: tuple[Broker, FakeClock]) -> None:
    broker, clock = memory_broker
    member(broker, "t1", b"A")
    broker.end_transaction_group("t1", "commit")
    advance(broker, clock, 2 * TIMEOUT_MS)
    assert visible(broker) == [b"A"]
    assert broker.consuming.timed_out_total == 0


def test_a_group_of_acks_only_times_out_and_its_messages_come_back(
    memory_broker: tuple[Broker, FakeClock],
) -> None:
    broker, clock = memory_broker
    broker.send([OutgoingMessage(IN, b"x")])
    (message,) = receive(broker)
    broker.transactional_ack("acks", GROUP, IN, message.receipt_handle)
    advance(broker, clock, TIMEOUT_MS + SCAN_MS)
    assert broker.consuming.timed_out_total == 1
    with pytest.raises(TransactionRolledBack):
        broker.end_transaction_group("acks", "commit", consume_actions=1)
    clock.advance(INVISIBLE)
    (again,) = receive(broker)  # never acked: delivered again
    assert again.body == b"x"


def test_a_sends_and_acks_group_rolls_back_whole(memory_broker: tuple[Broker, FakeClock]) -> None:
    broker, clock = memory_broker
    broker.send([OutgoingMessage(IN, b"x")])
    (message,) = receive(broker)
    member(broker, "t1", b"X", timeout_ms=5_000)
    broker.transactional_ack("t1", GROUP, IN, message.receipt_handle)
    advance(broker, clock, 6_000)
    assert broker.list_transactions() == []
    assert broker.consuming.ledger.count("t1") == 0  # its ack is dropped with it
    clock.advance(INVISIBLE)
    assert [m.body for m in receive(broker)] == [b"x"]
    assert visible(broker) == []


def test_illegal_timeouts_are_refused(memory_broker: tuple[Broker, FakeClock]) -> None:
    broker, _ = memory_broker
    for bad in (0, -1, TransactionConfig().group_timeout_max_ms + 1):
        with pytest.raises(InvalidArgument) as info:
            member(broker, "t1", b"A", timeout_ms=bad)
        assert info.value.code == "ILLEGAL_TRANSACTION_TIMEOUT"
    with pytest.raises(InvalidArgument, match="transaction group members only"):
        broker.send(
            [
                OutgoingMessage(
                    OUT,
                    b"A",
                    message_type=MessageType.TRANSACTION,
                    producer_group="pg",
                    transaction_timeout_ms=5_000,
                )
            ]
        )
    assert broker.list_transactions() == []
    with pytest.raises(InvalidArgument, match="group_timeout_ms"):
        TransactionConfig(group_timeout_ms=0)
    with pytest.raises(InvalidArgument, match="group_timeout_ms"):
        TransactionConfig(group_timeout_ms=2_000_000)


def test_the_deadline_survives_a_restart(tmp_path: Path) -> None:
    """Nothing of the deadline is in memory only: the first member's store time and the
    producer's timeout are in the half record, so a reopened broker rolls back on time."""
    clock = FakeClock(int(time.time() * 1000))  # store times are wall-clock
    store = open_real_store(tmp_path / "data")
    broker = Broker(store, tmp_path / "meta", BrokerConfig(), clock, config())
    prepare(broker)
    member(broker, "t1", b"A", timeout_ms=4_000)
    member(broker, "t2", b"B")  # the broker's default
    broker.close()
    store.close()
    store = open_real_store(tmp_path / "data")
    broker = Broker(store, tmp_path / "meta", BrokerConfig(), clock, config())
    try:
        assert len(broker.list_transactions()) == 2
        advance(broker, clock, 5_000)
        assert [t.transaction_group for t in broker.list_transactions()] == ["t2"]
        advance(broker, clock, TIMEOUT_MS)
        assert broker.list_transactions() == []
        with pytest.raises(TransactionRolledBack):
            broker.end_transaction_group("t1", "commit")
    finally:
        broker.close()
        store.close()
