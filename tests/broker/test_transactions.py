"""Transactions through the broker facade on the in-memory store: half messages, decisions,
groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import (
    CHECK_MAX_TOPIC,
    HALF_TOPIC,
    IllegalTransactionGroup,
    InvalidTransactionId,
    TransactionAlreadyEnded,
    TransactionConfig,
    TransactionGroupEnded,
    TransactionGroupMember,
    TransactionStateError,
    decode_transaction_id,
    encode_transaction_id,
    group_of_transaction_id,
)
from halfmoon.errors import InvalidArgument
from halfmoon.store.memory import MemoryStore
from halfmoon.store.message import SysFlag


@pytest.fixture
def txn_broker(broker: Broker) -> Broker:
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    broker.create_topic("mixed", MessageType.MIXED, queue_count=1)
    return broker


def half(topic: str = "orders", body: bytes = b"b", **kw) -> OutgoingMessage:
    return OutgoingMessage(
        topic, body, message_type=MessageType.TRANSACTION, producer_group="pg", **kw
    )


def visible(broker: Broker, topic: str = "orders") -> list[bytes]:
    bodies = []
    for queue_id in range(len(broker.route(topic))):
        bodies += [
            m.body for m in broker.pull("c", topic, queue_id, 0, 1000, FilterSpec()).messages
        ]
    return bodies


def end(broker: Broker, result, resolution: str, source: str = "client") -> TxnState:
    return broker.end_transaction(
        result.topic, result.message_id, result.transaction_id, resolution, source
    )


# -- ids ---------------------------------------------------------------------------


def test_transaction_id_round_trips_and_rejects_garbage() -> None:
    for offset in (0, 1, 4096, 2**40 + 17):
        assert decode_transaction_id(encode_transaction_id(offset)) == offset
    good = encode_transaction_id(1234)
    flipped = good[:-1] + ("0" if good[-1] != "0" else "1")
    for bad in ("", "nonsense", good[:-1], flipped, "T" + "Z" * 24, good.lower() + "x"):
        with pytest.raises(InvalidTransactionId) as info:
            decode_transaction_id(bad)
        assert info.value.code == "INVALID_TRANSACTION_ID"
    assert group_of_transaction_id("hm-group:batch-7") == "batch-7"
    assert group_of_transaction_id(good) is None


# -- half messages -----------------------------------------------------------------


def test_half_message_is_invisible_and_stored_in_the_half_topic(
    txn_broker: Broker, store: MemoryStore
) -> None:
    (result,) = txn_broker.send([half(keys=["k1"], check_immunity_seconds=10)])
    assert result.transaction_id is not None and result.topic == "orders"
    assert visible(txn_broker) == []
    stored = store.read_at(decode_transaction_id(result.transaction_id))
    assert stored.topic == HALF_TOPIC
    assert stored.sys_flag & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_PREPARED
    assert stored.properties["REAL_TOPIC"] == "orders"
    assert int(stored.properties["REAL_QID"]) == result.queue_id
    assert stored.properties["PGROUP"] == "pg"
    assert stored.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "10"
    (info,) = txn_broker.list_transactions()
    assert (info.topic, info.message_id, info.keys, info.checks_sent) == (
        "orders",
        result.message_id,
        ["k1"],
        0,
    )


def test_immunity_is_capped(
    broker: Broker, store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    capped = Broker(store, None, BrokerConfig(), clock, TransactionConfig(max_immunity_ms=60_000))
    capped.create_topic("orders", MessageType.TRANSACTION)
    (result,) = capped.send([half(check_immunity_seconds=7200)])
    stored = store.read_at(decode_transaction_id(result.transaction_id))
    assert stored.properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] == "60"


def test_mixed_batch_is_all_or_nothing_and_only_halves_get_ids(txn_broker: Broker) -> None:
    normal = OutgoingMessage("mixed", b"n")
    results = txn_broker.send([normal, half("mixed", b"h")])
    assert results[0].transaction_id is None and results[1].transaction_id is not None
    assert visible(txn_broker, "mixed") == [b"n"]


def test_transaction_message_to_a_normal_topic_is_refused(broker: Broker) -> None:
    broker.create_topic("plain", MessageType.NORMAL)
    with pytest.raises(InvalidArgument) as info:
        broker.send([half("plain")])
    assert info.value.code == "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


# -- decisions ---------------------------------------------------------------------


def test_commit_makes_the_message_visible_exactly_once(txn_broker: Broker) -> None:
    (result,) = txn_broker.send([half(body=b"order-1")])
    assert end(txn_broker, result, "commit") is TxnState.COMMITTED
    assert visible(txn_broker) == [b"order-1"]
    assert end(txn_broker, result, "commit") is TxnState.COMMITTED  # repeated: no-op
    assert end(txn_broker, result, "unknown") is TxnState.COMMITTED
    assert visible(txn_broker) == [b"order-1"]
    with pytest.raises(TransactionAlreadyEnded) as info:
        end(txn_broker, result, "rollback")
    assert info.value.code == "TRANSACTION_ALREADY_ENDED"
    assert txn_broker.list_transactions() == []


def test_committed_message_keeps_id_queue_and_properties(txn_broker: Broker) -> None:
    (result,) = txn_broker.send([half(tag="t1", keys=["k"], properties={"a": "1"}, queue_id=1)])
    end(txn_broker, result, "commit")
    (message,) = txn_broker.pull("c", "orders", 1, 0, 10, FilterSpec()).messages
    assert (message.message_id, message.tag, message.keys, message.properties) == (
        result.message_id,
        "t1",
        ["k"],
        {"a": "1"},
    )
    assert message.topic == "orders" and message.message_type is MessageType.TRANSACTION


def test_committed_message_carries_the_transaction_id_its_producer_got(
    txn_broker: Broker, store: MemoryStore
) -> None:
    results = txn_broker.send([half(body=b"alone"), half(body=b"member", transaction_group="g9")])
    end(txn_broker, results[0], "commit")
    txn_broker.end_transaction_group("g9", "commit")
    delivered = []
    for queue_id in range(2):
        delivered += txn_broker.pull("c", "orders", queue_id, 0, 10, FilterSpec()).messages
    by_body = {m.body: m for m in delivered}
    for result, body in zip(results, (b"alone", b"member"), strict=True):
        message = by_body[body]
        # As RocketMQ's broker: a stored __transactionId__, not one of the user's properties.
        assert message.transaction_id == result.transaction_id, body
        assert "__transactionId__" not in message.properties
        stored = store.read_at(message.commit_log_offset)
        assert stored.properties["__transactionId__"] == result.transaction_id
        # The half record held the room for it, so the committed record is never larger.
        half_record = store.read_at(decode_transaction_id(result.transaction_id))
        assert len(half_record.properties["__transactionId__"]) == len(result.transaction_id)


def test_a_half_message_at_the_properties_limit_still_commits(broker: Broker) -> None:
    # A one-letter topic: its routing properties, dropped on commit, are the shortest.
    broker.create_topic("t", MessageType.TRANSACTION, queue_count=1)

    def fits(size: int):
        try:
            return broker.send([half("t", properties={"pad": "x" * size})])[0]
        except InvalidArgument:
            return None

    low, high = 0, 64 * 1024  # fits(low), not fits(high)
    assert fits(low) is not None and fits(high) is None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) is not None else (low, middle)
    largest = fits(low)
    assert end(broker, largest, "commit") is TxnState.COMMITTED
    (message,) = [
        m
        for m in broker.pull("c", "t", 0, 0, 1000, FilterSpec()).messages
        if m.message_id == largest.message_id
    ]
    assert message.transaction_id == largest.transaction_id


def test_check_message_carries_the_transaction_id(txn_broker: Broker) -> None:
    (result,) = txn_broker.send([half(body=b"open")])
    service = txn_broker.transactions
    entry = service.pending[decode_transaction_id(result.transaction_id)]
    view = service.checks.check_view(entry)
    assert (view.body, view.transaction_id, view.topic) == (
        b"open",
        result.transaction_id,
        "orders",
    )


def test_rollback_is_permanent(txn_broker: Broker) -> None:
    (result,) = txn_broker.send([half()])
    assert end(txn_broker, result, "rollback") is TxnState.ROLLED_BACK
    assert end(txn_broker, result, "rollback") is TxnState.ROLLED_BACK
    with pytest.raises(TransactionAlreadyEnded):
        end(txn_broker, result, "commit")
    assert visible(txn_broker) == []


def test_unknown_leaves_it_pending(txn_broker: Broker) -> None:
    (result,) = txn_broker.send([half()])
    assert end(txn_broker, result, "unknown") is TxnState.PREPARED
    assert len(txn_broker.list_transactions()) == 1


def test_forged_and_foreign_ids_are_invalid(txn_broker: Broker) -> None:
    (result,) = txn_broker.send([half()])
    normal = txn_broker.send([OutgoingMessage("mixed", b"n")])[0]
    for bad in (
        "garbage",
        encode_transaction_id(999_999),
        encode_transaction_id(normal.commit_log_offset),
    ):
        with pytest.raises(InvalidTransactionId):
            txn_broker.end_transaction("orders", "", bad, "commit", "client")
    with pytest.raises(InvalidTransactionId):  # the id of another message
        txn_broker.end_transaction(
            "orders", "someone-else", result.transaction_id, "commit", "client"
        )
    with pytest.raises(InvalidArgument):
        end(txn_broker, result, "maybe")
    with pytest.raises(InvalidArgument):
        end(txn_broker, result, "commit", source="nobody")


def test_a_transaction_of_another_topic_is_answered_as_unknown(txn_broker: Broker) -> None:
    """The topic a caller names is the one it was authorized on: a transaction of another
    topic, pending or decided, gets the answer of one that does not exist, naming nothing."""
    txn_broker.create_topic("payments-tx", MessageType.TRANSACTION)
    pending, decided = txn_broker.send([half("payments-tx", b"p"), half("payments-tx", b"d")])
    end(txn_broker, decided, "rollback")
    missing = encode_transaction_id(999_999)
    answers = []
    for tid in (pending.transaction_id, decided.transaction_id, missing):
        for message_id in ("", pending.message_id):
            with pytest.raises(InvalidTransactionId) as info:
                txn_broker.end_transaction("orders", message_id, tid, "commit", "client")
            answers.append(info.value.message.replace(tid, "ID"))
            assert "payments" not in info.value.message and pending.message_id not in answers[-1]
    assert len(set(answers)) == 1, answers
    assert visible(txn_broker, "payments-tx") == []  # nothing was decided by those calls
    assert end(txn_broker, pending, "commit") is TxnState.COMMITTED  # its own topic may


def test_decision_found_after_it_left_the_cache(store: MemoryStore, clock: FakeClock) -> None:
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(decided_cache_entries=1))
    broker.create_topic("orders", MessageType.TRANSACTION)
    first, second, third = broker.send([half(body=b"1"), half(body=b"2"), half(body=b"3")])
    end(broker, first, "commit")
    end(broker, second, "rollback")
    end(broker, third, "commit")  # evicts the others from the cache: the key index answers
    assert end(broker, first, "commit") is TxnState.COMMITTED
    with pytest.raises(TransactionAlreadyEnded):
        end(broker, second, "commit")
    assert sorted(visible(broker)) == [b"1", b"3"]


def test_operator_decides_and_stats_count(txn_broker: Broker) -> None:
    a, b = txn_broker.send([half(body=b"a"), half(body=b"b")])
    txn_broker.end_transaction("", "", a.transaction_id, "commit", "operator")
    txn_broker.end_transaction("", "", b.transaction_id, "rollback", "operator")
    stats = txn_broker.transaction_stats()
    assert (stats.pending, stats.committed_total, stats.rolled_back_total) == (0, 1, 1)
    assert sum(stats.decision_latency_ms.values()) == 2
    assert visible(txn_broker) == [b"a"]


# -- transaction groups --------------------------------------------------------------


def test_group_commit_decides_all_members_across_topics(txn_broker: Broker) -> None:
    results = txn_broker.send(
        [half(body=b"o1", transaction_group="g1"), half("mixed", b"m1", transaction_group="g1")]
    )
    results += txn_broker.send([half(body=b"o2", transaction_group="g1"), half(body=b"other")])
    assert visible(txn_broker) == [] and visible(txn_broker, "mixed") == []
    assert txn_broker.end_transaction_group("g1", "commit") == 3
    assert sorted(visible(txn_broker)) == [b"o1", b"o2"] and visible(txn_broker, "mixed") == [b"m1"]
    assert [i.message_id for i in txn_broker.list_transactions()] == [results[3].message_id]
    assert txn_broker.end_transaction_group("g1", "commit") == 0  # repeated: no-op
    with pytest.raises(TransactionAlreadyEnded):
        txn_broker.end_transaction_group("g1", "rollback")
    # a member ended alone follows the group
    assert end(txn_broker, results[0], "commit") is TxnState.COMMITTED
    with pytest.raises(TransactionAlreadyEnded):
        end(txn_broker, results[0], "rollback")
    assert sorted(visible(txn_broker)) == [b"o1", b"o2"]


def test_group_rollback_and_late_members_are_refused(txn_broker: Broker) -> None:
    (member,) = txn_broker.send([half(transaction_group="g2")])
    assert txn_broker.end_transaction_group("g2", "rollback") == 1
    assert end(txn_broker, member, "rollback") is TxnState.ROLLED_BACK
    with pytest.raises(TransactionAlreadyEnded):
        end(txn_broker, member, "commit")
    for group in ("g2",):
        with pytest.raises(TransactionGroupEnded) as info:
            txn_broker.send([half(transaction_group=group)])
        assert info.value.code == "TRANSACTION_ALREADY_ENDED"
    txn_broker.end_transaction_group("g3", "commit")  # no members yet: still final
    with pytest.raises(TransactionGroupEnded):
        txn_broker.send([half(transaction_group="g3")])
    assert visible(txn_broker) == []


def test_members_cannot_be_ended_alone_before_the_group(txn_broker: Broker) -> None:
    (member,) = txn_broker.send([half(transaction_group="g4")])
    for resolution in ("commit", "rollback"):
        with pytest.raises(TransactionGroupMember) as info:
            end(txn_broker, member, resolution)
        assert isinstance(info.value, TransactionStateError)
        # A transaction id is a position anyone can compute: its answer does not hand out
        # the group's id, which would let its holder add to the group.
        assert "g4" not in info.value.message
    assert end(txn_broker, member, "unknown") is TxnState.PREPARED
    with pytest.raises(IllegalTransactionGroup):
        txn_broker.send([half(transaction_group="has space")])
    with pytest.raises(IllegalTransactionGroup):
        txn_broker.end_transaction_group("", "commit")


def test_group_commit_spans_several_batches(store: MemoryStore, clock: FakeClock) -> None:
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(group_batch_size=3))
    broker.create_topic("orders", MessageType.TRANSACTION)
    broker.send([half(body=str(i).encode(), transaction_group="big") for i in range(10)])
    assert broker.end_transaction_group("big", "commit") == 10
    assert sorted(visible(broker), key=int) == [str(i).encode() for i in range(10)]


def test_a_large_group_decides_every_member_once_through_a_small_decided_cache(
    store: MemoryStore, clock: FakeClock
) -> None:
    config = TransactionConfig(group_batch_size=64, decided_cache_entries=50)
    broker = Broker(store, None, BrokerConfig(), clock, config)
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=4)
    sent = []
    for start in range(0, 1000, 250):  # a few large sends, as the Spark sink makes them
        bodies = [str(i).encode() for i in range(start, start + 250)]
        sent += broker.send([half(body=b, transaction_group="many") for b in bodies])
    broker.send([half(body=b"other", transaction_group="others")])
    assert broker.end_transaction_group("many", "commit") == 1000
    assert sorted(visible(broker), key=int) == [str(i).encode() for i in range(1000)]
    stats = broker.transaction_stats()
    assert (stats.pending, stats.committed_total) == (1, 1000)  # "others" is still open
    # Members that fell out of the small cache are still answered by their group's decision.
    assert {end(broker, r, "commit") for r in (sent[0], sent[500], sent[-1])} == {
        TxnState.COMMITTED
    }
    assert broker.end_transaction_group("many", "commit") == 0  # repeated: nothing new
    assert broker.end_transaction_group("others", "rollback") == 1
    assert b"other" not in visible(broker)
    assert broker.transaction_stats().rolled_back_total == 1


class FailingStore(MemoryStore):
    """Fails the ``fail_at``-th append that carries a committed member (then works again)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.commit_appends = 0
        self.fail_at = fail_at

    def append(self, messages):  # type: ignore[no-untyped-def]
        if any(m.topic == "orders" for m in messages):
            self.commit_appends += 1
            if self.commit_appends == self.fail_at:
                raise OSError("disk full")
        return super().append(messages)


def test_a_group_commit_cut_short_is_finished_with_every_member_once(clock: FakeClock) -> None:
    store = FailingStore(fail_at=2)  # the second batch of members fails
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(group_batch_size=4))
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=1)
    broker.send([half(body=str(i).encode(), transaction_group="cut") for i in range(10)])
    with pytest.raises(OSError):
        broker.end_transaction_group("cut", "commit")
    assert len(visible(broker)) == 4  # the first batch landed; the decision is recorded
    with pytest.raises(TransactionGroupEnded):
        broker.send([half(body=b"late", transaction_group="cut")])
    assert broker.end_transaction_group("cut", "commit") == 6  # finishes the rest
    assert sorted(visible(broker), key=int) == [str(i).encode() for i in range(10)]
    assert broker.transaction_stats().committed_total == 10


def test_parked_topic_is_not_a_user_topic(txn_broker: Broker) -> None:
    assert CHECK_MAX_TOPIC not in [t.name for t in txn_broker.list_topics()]
    assert HALF_TOPIC not in [t.name for t in txn_broker.list_topics()]
