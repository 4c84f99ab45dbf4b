"""Many EndTransactions decided with one append: each judged alone, written together."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.facade_types import Answer, Pending
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import (
    EndRequest,
    EndResult,
    InvalidTransactionId,
    TransactionAlreadyEnded,
    TransactionGroupMember,
)
from halfmoon.errors import HalfmoonError, InvalidArgument, StorageError
from halfmoon.store.memory import MemoryStore
from halfmoon.store.message import Message
from tests.broker.conftest import open_real_store


class CountingStore(MemoryStore):
    """Counts appends; ``fail`` makes the next append refuse everything (nothing written)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock.now_ms)
        self.appends = 0
        self.fail = False

    def append(self, messages: Sequence[Message]):  # type: ignore[no-untyped-def]
        if self.fail:
            raise StorageError("disk full")
        self.appends += 1
        return super().append(messages)


@pytest.fixture
def store(clock: FakeClock) -> CountingStore:
    return CountingStore(clock)


@pytest.fixture
def txn(store: CountingStore, clock: FakeClock) -> Broker:
    broker = Broker(store, None, BrokerConfig(), clock)
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    return broker


def halves(broker: Broker, count: int, **kw):
    return broker.send(
        [
            OutgoingMessage(
                "orders",
                f"m{i}".encode(),
                message_type=MessageType.TRANSACTION,
                producer_group="pg",
                **kw,
            )
            for i in range(count)
        ]
    )


def visible(broker: Broker) -> list[bytes]:
    return sorted(
        m.body
        for q in range(2)
        for m in broker.pull("c", "orders", q, 0, 1000, FilterSpec()).messages
    )


def req(result, resolution: str, **kw) -> EndRequest:
    return EndRequest(result.transaction_id, resolution, "check", result.message_id, "orders", **kw)


def test_many_decisions_share_one_append(txn: Broker, store: CountingStore) -> None:
    sent = halves(txn, 100)
    before = store.appends
    written = txn.end_transactions_nowait(
        [req(r, "commit" if i % 2 == 0 else "rollback") for i, r in enumerate(sent)]
    )
    assert store.appends == before + 1
    results = [w.result for w in written if not isinstance(w, HalfmoonError)]
    assert [r.state for r in results] == [
        TxnState.COMMITTED if i % 2 == 0 else TxnState.ROLLED_BACK for i in range(100)
    ]
    assert all(r.changed for r in results)
    assert len({r.end_offset for r in results}) == 100  # each its own record
    assert visible(txn) == sorted(f"m{i}".encode() for i in range(0, 100, 2))
    assert txn.list_transactions() == [] and len(txn.transactions.due) == 0
    stats = txn.transaction_stats()
    assert (stats.committed_total, stats.rolled_back_total) == (50, 50)


def test_each_request_is_judged_alone(txn: Broker, store: CountingStore) -> None:
    good, decided, wrong_topic = halves(txn, 3)
    (member,) = halves(txn, 1, transaction_group="job-1")
    txn.end_transaction("orders", "", decided.transaction_id, "rollback", "client")
    before = store.appends
    answers = txn.end_transactions_nowait(
        [
            req(good, "commit"),
            EndRequest("not-an-id", "commit"),
            req(decided, "commit"),  # rolled back already
            req(decided, "rollback"),  # a repeat: fine, nothing to write
            req(member, "commit"),  # ended with its group only
            EndRequest(wrong_topic.transaction_id, "commit", topic="payments"),
            EndRequest(good.transaction_id, "maybe"),
            req(wrong_topic, "unknown"),
        ]
    )
    assert store.appends == before + 1  # only the good commit was written at once
    # A group member is decided with its group's bookkeeping, never on the caller's thread:
    # its answer is a write left to it, which fails there.
    assert [isinstance(a, Pending) for a in answers] == [i == 4 for i in range(8)]
    kinds = [outcome(a) for a in answers]
    assert kinds == [
        TxnState.COMMITTED,
        InvalidTransactionId,
        TransactionAlreadyEnded,
        TxnState.ROLLED_BACK,
        TransactionGroupMember,
        InvalidTransactionId,
        InvalidArgument,
        TxnState.PREPARED,
    ]
    assert store.appends == before + 1  # the member's write appended nothing either
    assert visible(txn) == [b"m0"]
    assert {i.transaction_id for i in txn.list_transactions()} == {
        member.transaction_id,
        wrong_topic.transaction_id,
    }


def test_a_repeat_in_the_same_batch_sees_the_first_decision(txn: Broker) -> None:
    a, b = halves(txn, 2)
    answers = txn.end_transactions_nowait(
        [req(a, "commit"), req(a, "commit"), req(b, "rollback"), req(b, "commit")]
    )
    first, again, rolled, opposite = answers
    assert not isinstance(first, HalfmoonError) and not isinstance(again, HalfmoonError)
    assert (again.result.state, again.result.changed) == (TxnState.COMMITTED, False)
    # The repeat is acknowledged once the first one's record is durable.
    assert again.result.end_offset == first.result.end_offset
    assert not isinstance(rolled, HalfmoonError) and rolled.result.changed
    assert isinstance(opposite, TransactionAlreadyEnded)
    assert visible(txn) == [b"m0"]


def test_a_failed_append_changes_nothing(txn: Broker, store: CountingStore) -> None:
    sent = halves(txn, 5)
    store.fail = True
    with pytest.raises(StorageError):
        txn.end_transactions_nowait([req(r, "commit") for r in sent])
    store.fail = False
    assert len(txn.list_transactions()) == 5 and len(txn.transactions.due) == 5
    assert visible(txn) == []
    answers = txn.end_transactions_nowait([req(r, "commit") for r in sent])  # the retry works
    assert all(isinstance(a.result, EndResult) for a in answers if not isinstance(a, HalfmoonError))
    assert visible(txn) == sorted(f"m{i}".encode() for i in range(5))


def test_one_durable_future_covers_the_batch_on_a_real_store(tmp_path: Path) -> None:
    store = open_real_store(tmp_path / "data")
    broker = Broker(store, tmp_path / "meta", BrokerConfig())
    try:
        broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
        sent = halves(broker, 50)
        answers = broker.end_transactions_nowait([req(r, "commit") for r in sent])
        futures = {id(a.durable) for a in answers if not isinstance(a, HalfmoonError)}
        assert len(futures) == 1  # one fsync to wait for, shared
        for a in answers:
            assert not isinstance(a, HalfmoonError)
            a.durable.result(timeout=10)
        last = max(a.result.end_offset for a in answers if not isinstance(a, HalfmoonError))
        assert store.wait_durable(last, timeout=0)  # durable once the shared future is
    finally:
        broker.close()
        store.close()


def outcome(answer: Answer[EndResult] | HalfmoonError) -> TxnState | type[HalfmoonError]:
    """A decision's state, or its error's class (a ``Pending`` one written here)."""
    if isinstance(answer, HalfmoonError):
        return type(answer)
    try:
        return answer.write().result.state
    except HalfmoonError as exc:
        return type(exc)
