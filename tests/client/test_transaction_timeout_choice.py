"""Which timeout a transaction group's half messages carry: the transaction's own, else
the producer's ``transaction_timeout``, else none (the broker's default applies). The
broker side of the property is tests/broker/test_transaction_timeout.py; the end to end
runs are tests/client/test_transaction_timeout.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from halfmoon.client.message import Message
from halfmoon.client.transaction import (
    PROPERTY_TRANSACTION_TIMEOUT,
    Transaction,
    TransactionProducer,
)


@dataclass
class RecordingProducer:
    """Stands in for a TransactionProducer: keeps the half messages it is handed."""

    transaction_timeout: float | None = None
    sent: list[Message] = field(default_factory=list)

    async def send_half(self, message: Message) -> object:
        self.sent.append(message)
        return object()


def carried(producer: RecordingProducer, **transaction: object) -> str | None:
    txn = Transaction(producer, **transaction)  # type: ignore[arg-type]
    asyncio.run(txn.send(Message("orders-tx", b"x")))
    return producer.sent[-1].properties.get(PROPERTY_TRANSACTION_TIMEOUT)


def test_a_groups_messages_carry_the_producers_timeout() -> None:
    assert carried(RecordingProducer(transaction_timeout=2.5), group="hm-group:g") == "2500"


def test_the_transactions_own_timeout_wins_over_the_producers() -> None:
    producer = RecordingProducer(transaction_timeout=2.5)
    assert carried(producer, group="hm-group:g", timeout=0.75) == "750"


def test_without_either_the_broker_default_applies() -> None:
    assert carried(RecordingProducer(), group="hm-group:g") is None


def test_a_single_half_message_carries_no_group_timeout() -> None:
    assert carried(RecordingProducer(transaction_timeout=2.5)) is None


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_producer_refuses_a_timeout_that_is_not_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        TransactionProducer("127.0.0.1:1", "g", transaction_timeout=bad)
