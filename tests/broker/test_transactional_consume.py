"""Transactional consumption through the broker facade: acks, rejects and offset commits
decided with a transaction group (in-memory store, fake clock)."""

from __future__ import annotations

import pytest

from halfmoon.broker import Broker, FakeClock
from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.broker.transaction_state import TransactionAlreadyEnded
from halfmoon.broker.transactions import TransactionGroupEnded
from halfmoon.broker.transactions.consume import (
    MAX_ACTIONS_PER_GROUP,
    ConsumeActionConflict,
    TransactionFenced,
    TransactionIncomplete,
    TransactionRolledBack,
)
from halfmoon.errors import InvalidArgument

IN, OUT, GROUP = "in", "out", "workers"
INVISIBLE = 20_000


@pytest.fixture
def b(broker: Broker) -> Broker:
    broker.create_topic(IN, MessageType.NORMAL, queue_count=2)
    broker.create_topic(OUT, MessageType.TRANSACTION, queue_count=2)
    broker.create_group(GROUP, consume_from="earliest", max_delivery_attempts=5)
    return broker


def produce(broker: Broker, *bodies: bytes) -> None:
    broker.send([OutgoingMessage(IN, body) for body in bodies])


def receive(broker: Broker, n: int = 32, group: str = GROUP) -> list[MessageView]:
    return broker.receive(group, IN, FilterSpec(), n, INVISIBLE)


def output(broker: Broker, txn: str, body: bytes) -> None:
    broker.send(
        [
            OutgoingMessage(
                OUT,
                body,
                message_type=MessageType.TRANSACTION,
                producer_group="pg",
                transaction_group=txn,
            )
        ]
    )


def visible(broker: Broker, topic: str = OUT) -> list[bytes]:
    bodies = []
    for queue_id in range(len(broker.route(topic))):
        got = broker.pull("reader", topic, queue_id, 0, 1000, FilterSpec())
        bodies += [m.body for m in got.messages]
    return sorted(bodies)


def dead_letters(broker: Broker) -> list[MessageView]:
    name = f"%DLQ%{GROUP}"
    if broker.find_topic(name) is None:
        return []
    return broker.pull("reader", name, 0, 0, 1000, FilterSpec()).messages


def commit(broker: Broker, txn: str, actions: int | None = None) -> int:
    written = broker.end_transaction_group_nowait(txn, "commit", consume_actions=actions).write()
    written.durable.result()
    return written.result


def test_commit_applies_acks_and_sends_together(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a", b"b")
    got = receive(b)
    for m in got:
        output(b, "t1", m.body.upper())
        b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    assert visible(b) == []  # nothing before the commit
    assert commit(b, "t1", actions=2) == 2
    assert visible(b) == [b"A", b"B"]
    clock.advance(INVISIBLE + 1)
    assert receive(b) == []  # acked: never delivered again
    assert all(p.inflight == 0 for p in b.group_progress(GROUP, IN))


def test_rollback_redelivers_with_the_attempt_counted(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    output(b, "t1", b"A")
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    b.end_transaction_group("t1", "rollback")
    assert visible(b) == []
    assert receive(b) == []  # still invisible: rollback does not shorten the invisible time
    clock.advance(INVISIBLE + 1)
    (again,) = receive(b)
    assert again.body == b"a" and again.delivery_attempt == 2


def test_a_retried_decision_answers_the_outcome_already_made(b: Broker, clock: FakeClock) -> None:
    """A client retrying a commit whose answer it missed learns the real outcome: a commit
    again is OK (nothing more applied), a rollback of it is refused; a commit of a
    rolled-back group says it was rolled back."""
    produce(b, b"a", b"b")
    first, second = receive(b)
    output(b, "t1", b"A")
    b.transactional_ack("t1", GROUP, IN, first.receipt_handle)
    assert commit(b, "t1", actions=1) == 1
    assert commit(b, "t1", actions=1) == 0  # the retry: committed, nothing decided twice
    with pytest.raises(TransactionAlreadyEnded, match="already committed"):
        b.end_transaction_group("t1", "rollback")
    assert visible(b) == [b"A"]
    output(b, "t2", b"B")
    b.transactional_ack("t2", GROUP, IN, second.receipt_handle)
    b.end_transaction_group("t2", "rollback")
    with pytest.raises(TransactionRolledBack):
        commit(b, "t2", actions=1)
    b.end_transaction_group("t2", "rollback")  # a retried rollback: OK
    clock.advance(INVISIBLE + 1)
    assert [m.body for m in receive(b)] == [b"b"]  # only the rolled-back input comes back
    assert visible(b) == [b"A"]


def test_an_ack_outside_a_transaction_is_a_plain_ack(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a", b"b")
    first, second = receive(b)
    b.transactional_ack("t1", GROUP, IN, first.receipt_handle)
    b.ack(GROUP, IN, second.receipt_handle)  # applies now, whatever t1 does
    b.end_transaction_group("t1", "rollback")
    clock.advance(INVISIBLE + 1)
    assert [m.body for m in receive(b)] == [first.body]


def test_zombie_ack_is_fenced_and_nothing_of_its_group_applies(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a")
    (slow,) = receive(b)
    output(b, "zombie", b"A-zombie")
    b.transactional_ack("zombie", GROUP, IN, slow.receipt_handle)
    clock.advance(INVISIBLE + 1)  # too slow: the message goes to another consumer
    (fresh,) = receive(b)
    assert fresh.delivery_attempt == 2
    output(b, "fresh", b"A-fresh")
    b.transactional_ack("fresh", GROUP, IN, fresh.receipt_handle)
    with pytest.raises(TransactionFenced) as fenced:
        commit(b, "zombie", actions=1)
    assert fenced.value.code == "TRANSACTION_FENCED"
    assert fenced.value.message.startswith("TRANSACTION_FENCED: ")
    assert commit(b, "fresh", actions=1) == 1
    assert visible(b) == [b"A-fresh"]  # the zombie's output was rolled back with it
    with pytest.raises(TransactionGroupEnded):  # the zombie's group is over
        b.transactional_ack("zombie", GROUP, IN, fresh.receipt_handle)
    clock.advance(INVISIBLE + 1)
    assert receive(b) == []


def test_an_expired_handle_nobody_took_still_commits(b: Broker, clock: FakeClock) -> None:
    # As a plain ack: the delivery is over only once the message went to someone else.
    produce(b, b"a")
    (m,) = receive(b)
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    clock.advance(INVISIBLE + 1)
    commit(b, "t1", actions=1)
    assert receive(b) == []


def test_ack_then_plain_ack_of_the_same_delivery_fences(b: Broker) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    b.ack(GROUP, IN, m.receipt_handle)
    with pytest.raises(TransactionFenced):
        commit(b, "t1")


def test_reject_to_the_dead_letter_topic_only_on_commit(b: Broker, clock: FakeClock) -> None:
    produce(b, b"poison", b"other")
    poison, other = receive(b)
    b.transactional_reject("t1", GROUP, IN, poison.receipt_handle, dead_letter=True)
    b.transactional_reject("t2", GROUP, IN, other.receipt_handle, dead_letter=True)
    assert dead_letters(b) == []  # stored as a half message: invisible
    commit(b, "t1", actions=1)
    b.end_transaction_group("t2", "rollback")
    (dlq,) = dead_letters(b)
    assert dlq.body == b"poison" and dlq.message_id == poison.message_id
    clock.advance(INVISIBLE + 1)
    assert [m.body for m in receive(b)] == [b"other"]  # rolled back: comes back, not dead


def test_reject_to_redeliver_later(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    b.transactional_reject("t1", GROUP, IN, m.receipt_handle, delay_ms=1_000)
    commit(b, "t1", actions=1)
    assert receive(b) == []
    clock.advance(1_001)
    (again,) = receive(b)
    assert again.delivery_attempt == 2


def test_reject_without_a_delay_takes_the_groups_retry_backoff(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    b.transactional_reject("t1", GROUP, IN, m.receipt_handle)
    commit(b, "t1")
    backoff = b.get_group(GROUP).retry_policy.delay_for_attempt(1)
    clock.advance(backoff - 1)
    assert receive(b) == []
    clock.advance(2)
    assert len(receive(b)) == 1


def test_errors_are_detected_at_the_call(b: Broker) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    forged = m.receipt_handle[:-3] + ("AAA" if not m.receipt_handle.endswith("AAA") else "BBB")
    with pytest.raises(InvalidReceiptHandle):
        b.transactional_ack("t1", GROUP, IN, forged)
    with pytest.raises(InvalidReceiptHandle):  # another group's
        b.transactional_ack("t1", "strangers", IN, m.receipt_handle)
    with pytest.raises(TopicNotFound):
        b.send(
            [
                OutgoingMessage(
                    "nowhere",
                    b"x",
                    message_type=MessageType.TRANSACTION,
                    producer_group="pg",
                    transaction_group="t1",
                )
            ]
        )
    with pytest.raises(InvalidArgument):
        b.transactional_offset("t1", GROUP, IN, 7, 0, -1)  # no such queue
    with pytest.raises(InvalidArgument):
        b.transactional_reject("t1", GROUP, IN, m.receipt_handle, delay_ms=-5)
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)  # the same again: no-op
    with pytest.raises(ConsumeActionConflict):
        b.transactional_reject("t1", GROUP, IN, m.receipt_handle, dead_letter=True)
    assert commit(b, "t1", actions=1) == 0
    with pytest.raises(TransactionGroupEnded):
        b.transactional_ack("t1", GROUP, IN, m.receipt_handle)


def test_a_commit_missing_actions_is_refused_and_rolled_back(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    output(b, "t1", b"A")
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    with pytest.raises(TransactionIncomplete):
        commit(b, "t1", actions=2)  # the client registered two: the broker lost one
    assert visible(b) == []
    clock.advance(INVISIBLE + 1)
    assert len(receive(b)) == 1


def test_offset_commits_apply_on_commit_and_fence_a_moved_queue(b: Broker) -> None:
    produce(b, *(bytes([i]) for i in range(8)))
    b.transactional_offset("t1", GROUP, IN, 0, 2, -1)
    assert b.group_progress(GROUP, IN) == [] or all(
        p.committed_offset == 0 for p in b.group_progress(GROUP, IN)
    )
    with pytest.raises(Exception):  # noqa: B017 - nothing committed yet
        b.get_offset(GROUP, IN, 0)
    commit(b, "t1", actions=1)
    assert b.get_offset(GROUP, IN, 0) == 2
    # Two members read queue 0 from offset 2; the first to commit wins.
    b.transactional_offset("first", GROUP, IN, 0, 3, 2)
    b.transactional_offset("second", GROUP, IN, 0, 4, 2)
    output(b, "second", b"dup")
    commit(b, "first", actions=1)
    with pytest.raises(TransactionFenced):
        commit(b, "second", actions=1)
    assert b.get_offset(GROUP, IN, 0) == 3 and visible(b) == []
    # A plain commit moves it too: a reader from 3 is then fenced.
    b.transactional_offset("third", GROUP, IN, 0, 4, 3)
    b.update_offset(GROUP, IN, 0, 4)
    with pytest.raises(TransactionFenced):
        commit(b, "third")


def test_many_actions_in_one_group_and_the_limit(b: Broker) -> None:
    produce(b, *(str(i).encode() for i in range(300)))
    got: list[MessageView] = []
    while len(got) < 300:
        got += receive(b, 32)
    for m in got:
        b.transactional_ack("big", GROUP, IN, m.receipt_handle)
    commit(b, "big", actions=300)
    assert all(p.inflight == 0 for p in b.group_progress(GROUP, IN))
    assert MAX_ACTIONS_PER_GROUP >= 1000


def test_resource_creation_is_not_transactional(b: Broker, clock: FakeClock) -> None:
    # A dead-letter reject creates the group's dead-letter topic when it is registered; a
    # rollback leaves the topic (empty), as AMQP leaves a declared queue.
    produce(b, b"a")
    (m,) = receive(b)
    b.transactional_reject("t1", GROUP, IN, m.receipt_handle, dead_letter=True)
    b.end_transaction_group("t1", "rollback")
    assert b.find_topic(f"%DLQ%{GROUP}") is not None
    assert dead_letters(b) == []


def test_unknown_decides_nothing_and_keeps_the_actions(b: Broker, clock: FakeClock) -> None:
    produce(b, b"a")
    (m,) = receive(b)
    b.transactional_ack("t1", GROUP, IN, m.receipt_handle)
    assert b.end_transaction_group("t1", "unknown") == 0
    commit(b, "t1", actions=1)  # still holds its ack
    clock.advance(INVISIBLE + 1)
    assert receive(b) == []


def test_a_group_that_lost_a_message_is_rolled_back_by_the_tick(
    b: Broker, clock: FakeClock
) -> None:
    # A consumer died mid-transaction: its message went to another consumer, its outputs are
    # pending. The broker rolls the group back instead of keeping it until an operator does.
    produce(b, b"a")
    (stale,) = receive(b)
    output(b, "dead", b"A-dead")
    b.transactional_ack("dead", GROUP, IN, stale.receipt_handle)
    clock.advance(INVISIBLE + 1)
    b.tick()
    assert [t.transaction_group for t in b.list_transactions()] == ["dead"]  # not yet lost
    (fresh,) = receive(b)
    clock.advance(b.config.offset_persist_interval_ms)
    b.tick()
    assert b.list_transactions() == []
    with pytest.raises(TransactionFenced):
        commit(b, "dead", actions=1)
    b.ack(GROUP, IN, fresh.receipt_handle)
    assert visible(b) == []
