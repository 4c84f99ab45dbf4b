"""Transactions across a close and reopen of a broker on a real MessageStore."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from halfmoon.broker import Broker, FakeClock
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import TransactionAlreadyEnded, decode_transaction_id
from halfmoon.broker.transactions.oplog import Op, OpKind, op_message
from halfmoon.broker.transactions.records import real_from_half

OpenBroker = Callable[..., Broker]


@pytest.fixture
def clock() -> FakeClock:
    # Recovered half messages age by their store timestamps (wall clock): start the fake
    # clock there.
    return FakeClock(int(time.time() * 1000))


class Sender:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_check(
        self, producer_group: str | None, topic: str, message: MessageView, transaction_id: str
    ) -> bool:
        self.sent.append(transaction_id)
        return True


def halves(broker: Broker, *bodies: bytes, group: str | None = None):
    return broker.send(
        [
            OutgoingMessage(
                "orders",
                b,
                message_type=MessageType.TRANSACTION,
                producer_group="pg",
                transaction_group=group,
            )
            for b in bodies
        ]
    )


def visible(broker: Broker) -> list[bytes]:
    out = []
    for queue_id in range(2):
        out += [
            m.body for m in broker.pull("c", "orders", queue_id, 0, 1000, FilterSpec()).messages
        ]
    return sorted(out)


def end(broker: Broker, result, resolution: str) -> TxnState:
    return broker.end_transaction(
        "orders", result.message_id, result.transaction_id, resolution, "client"
    )


def test_pending_and_decided_survive_a_restart(real_broker: OpenBroker) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    committed, rolled, pending, later = halves(
        broker, b"committed", b"rolled", b"pending", b"later"
    )
    end(broker, committed, "commit")
    end(broker, rolled, "rollback")
    broker = real_broker()  # close and reopen
    assert visible(broker) == [b"committed"]
    assert sorted(i.message_id for i in broker.list_transactions()) == sorted(
        [pending.message_id, later.message_id]
    )
    assert end(broker, committed, "commit") is TxnState.COMMITTED  # repeated after restart: no-op
    with pytest.raises(TransactionAlreadyEnded):
        end(broker, rolled, "commit")
    assert end(broker, pending, "commit") is TxnState.COMMITTED  # EndTransaction after a restart
    assert end(broker, later, "rollback") is TxnState.ROLLED_BACK
    broker = real_broker()
    assert visible(broker) == [b"committed", b"pending"]
    assert broker.list_transactions() == []


def test_restart_without_a_snapshot_rebuilds_from_the_records(
    real_broker: OpenBroker, tmp_path: Path
) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    a, b, c = halves(broker, b"a", b"b", b"c")
    end(broker, a, "commit")
    end(broker, b, "rollback")
    broker.close()
    (tmp_path / "meta" / "transactions.json").unlink()
    broker = real_broker()
    assert visible(broker) == [b"a"]
    assert [i.message_id for i in broker.list_transactions()] == [c.message_id]
    with pytest.raises(TransactionAlreadyEnded):
        end(broker, b, "commit")


def scan_checks(broker: Broker, clock: FakeClock) -> None:
    """Past the next check scan, ticked until it is done: a tick works for at most 50 ms of
    real time, which the store's fsyncs on a loaded machine can use up."""
    clock.advance(30_000)
    broker.tick()
    while broker._checks.scanning:
        broker.tick()


def test_check_counts_and_parking_survive_a_restart(
    real_broker: OpenBroker, clock: FakeClock
) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    (checked,) = halves(broker, b"checked")
    (parked,) = halves(broker, b"parked")
    sender = Sender()
    broker.set_check_sender(sender)
    for _ in range(2):
        scan_checks(broker, clock)
    assert sender.sent.count(checked.transaction_id) == 2
    broker.transactions.checks.park(decode_transaction_id(parked.transaction_id))
    broker = real_broker()
    infos = {i.message_id: i for i in broker.list_transactions()}
    assert (infos[checked.message_id].checks_sent, infos[checked.message_id].state) == (
        2,
        "prepared",
    )
    assert (infos[parked.message_id].checks_sent, infos[parked.message_id].state) == (2, "parked")
    sender = Sender()
    broker.set_check_sender(sender)
    scan_checks(broker, clock)
    assert sender.sent == [checked.transaction_id]  # the parked one stays parked
    assert broker.list_transactions()[0].checks_sent == 3
    broker.resume_transaction(parked.transaction_id)
    broker = real_broker()
    assert {i.state for i in broker.list_transactions()} == {"prepared"}


def test_the_due_index_is_rebuilt_on_restart(real_broker: OpenBroker, clock: FakeClock) -> None:
    """Reopening indexes every prepared transaction outside a group at its first check time
    (a restart forgets retry times); parked ones and group members stay out."""
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    snapshotted = halves(broker, b"a", b"b", b"parked", b"decided")
    broker.transactions.checks.park(decode_transaction_id(snapshotted[2].transaction_id))
    broker.transactions.snapshot()
    replayed = halves(broker, b"c", b"d")  # after the snapshot: found by replaying the half queue
    halves(broker, b"member", group="job-9")
    end(broker, snapshotted[3], "commit")
    end(broker, replayed[1], "rollback")
    sender = Sender()
    broker.set_check_sender(sender)
    scan_checks(
        broker, clock
    )  # a, b and c checked: indexed again for their retry time, which is forgotten
    assert sorted(sender.sent) == sorted(r.transaction_id for r in (*snapshotted[:2], replayed[0]))
    broker = real_broker()
    indexed = {entry.transaction_id: at for at, entry in broker.transactions.due.entries()}
    wanted = (*snapshotted[:2], replayed[0])
    assert set(indexed) == {r.transaction_id for r in wanted}
    for r in wanted:
        entry = broker.transactions.pending[decode_transaction_id(r.transaction_id)]
        assert indexed[r.transaction_id] == entry.due_ms  # its stored time + the timeout
    sender = Sender()
    broker.set_check_sender(sender)
    scan_checks(broker, clock)
    assert sorted(sender.sent) == sorted(r.transaction_id for r in wanted)


def test_a_commit_after_the_last_snapshot_is_found(real_broker: OpenBroker, tmp_path: Path) -> None:
    """The broker died after a commit but before a snapshot recorded it: still committed, once."""
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    (result,) = halves(broker, b"late")
    broker.transactions.snapshot()
    snapshot = (tmp_path / "meta" / "transactions.json").read_bytes()
    end(broker, result, "commit")
    broker.close()
    (tmp_path / "meta" / "transactions.json").write_bytes(snapshot)  # as if it never got newer
    broker = real_broker()
    assert visible(broker) == [b"late"]
    assert broker.list_transactions() == []
    assert end(broker, result, "commit") is TxnState.COMMITTED
    with pytest.raises(TransactionAlreadyEnded):
        end(broker, result, "rollback")


def test_a_group_commit_cut_short_is_finished_once(real_broker: OpenBroker) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    members = halves(broker, b"m1", b"m2", b"m3", group="job-2")
    # The commit point and the first member's real message are durable; then the broker died.
    first = decode_transaction_id(members[0].transaction_id)
    broker.store.wait_durable(members[-1].end_offset)
    broker.store.put(
        [
            op_message(Op(OpKind.GROUP_COMMIT, group="job-2")),
            real_from_half(broker.store.read_at(first), first),
        ]
    )
    broker = real_broker()
    assert visible(broker) == [b"m1", b"m2", b"m3"]
    assert broker.transaction_stats().redone_commits_total == 2
    broker = real_broker()
    assert visible(broker) == [b"m1", b"m2", b"m3"]


def test_the_snapshot_holds_only_what_is_pending(real_broker: OpenBroker, tmp_path: Path) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    results = halves(broker, *[str(i).encode() for i in range(50)])
    for r in results[:-1]:
        end(broker, r, "commit")
    broker.close()
    data = json.loads((tmp_path / "meta" / "transactions.json").read_text())
    assert [p[0] for p in data["pending"]] == [decode_transaction_id(results[-1].transaction_id)]
    assert data["half_next"] == 50 and data["op_next"] == 0  # commits need no op record


def test_the_snapshot_is_compact_json(real_broker: OpenBroker, tmp_path: Path) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=2)
    results = halves(broker, b"a", b"b", b"c")
    broker.transactions.checks.park(decode_transaction_id(results[1].transaction_id))
    broker.close()
    text = (tmp_path / "meta" / "transactions.json").read_text()
    data = json.loads(text)
    assert text == json.dumps(data, separators=(",", ":"))
    assert data["version"] == 1
    assert [p[1:] for p in data["pending"]] == [[0, 0], [0, 1], [0, 0]]  # checks, parked
