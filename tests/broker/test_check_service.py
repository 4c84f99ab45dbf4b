"""The check service on a fake clock: timeout, immunity, check max, dead streams, races, errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import (
    CHECK_MAX_TOPIC,
    TransactionConfig,
    TransactionStateError,
    decode_transaction_id,
)
from halfmoon.broker.transactions.check import CHECK_BATCH, CheckRequest
from halfmoon.store.memory import MemoryStore

INTERVAL = 30_000


class RecordingSender:
    """A CheckSender that records each check; ``live`` False plays 'no producer stream'."""

    def __init__(self) -> None:
        self.live = True
        self.sent: list[tuple[str | None, str, str, str]] = []
        self.on_send: Callable[[str], None] | None = None
        self.fail_for: set[str] = set()

    def send_check(
        self, producer_group: str | None, topic: str, message: MessageView, transaction_id: str
    ) -> bool:
        if transaction_id in self.fail_for:
            raise RuntimeError("stream broke")
        if not self.live:
            return False
        if self.on_send is not None:
            self.on_send(transaction_id)
        self.sent.append((producer_group, topic, message.message_id, transaction_id))
        return True


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def txn(store: MemoryStore, clock: FakeClock, sender: RecordingSender) -> Broker:
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_max=3))
    broker.create_topic("orders", MessageType.TRANSACTION)
    broker.set_check_sender(sender)
    return broker


def send_half(broker: Broker, body: bytes = b"x", **kw):
    (result,) = broker.send(
        [
            OutgoingMessage(
                "orders", body, message_type=MessageType.TRANSACTION, producer_group="pg", **kw
            )
        ]
    )
    return result


def scan(broker: Broker, clock: FakeClock, ms: int = INTERVAL) -> None:
    clock.advance(ms)
    broker.tick()


def test_nothing_is_checked_before_the_interval_nor_before_the_timeout(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    clock.advance(INTERVAL - 3_000)
    result = send_half(txn)
    clock.advance(3_000)
    txn.tick()  # the first scan runs: the message is 3 s old, younger than the 6 s timeout
    assert sender.sent == []
    scan(txn, clock)
    assert sender.sent == [("pg", "orders", result.message_id, result.transaction_id)]
    assert txn.list_transactions()[0].checks_sent == 1


def test_immunity_delays_the_first_check(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    immune = send_half(txn, b"immune", check_immunity_seconds=100)
    plain = send_half(txn, b"plain")
    scan(txn, clock)  # 30 s
    assert [s[3] for s in sender.sent] == [plain.transaction_id]
    scan(txn, clock)
    scan(txn, clock)  # 90 s: still immune
    assert immune.transaction_id not in [s[3] for s in sender.sent]
    scan(txn, clock)  # 120 s
    assert immune.transaction_id in [s[3] for s in sender.sent]


def test_check_max_parks_then_operator_resumes(
    txn: Broker, clock: FakeClock, sender: RecordingSender, store: MemoryStore
) -> None:
    result = send_half(txn)
    for _ in range(3):
        scan(txn, clock)
    assert len(sender.sent) == 3 and txn.parked_transactions() == []
    scan(txn, clock)  # the fourth round: no answer to three checks -> parked, not checked again
    assert len(sender.sent) == 3
    (parked,) = txn.parked_transactions()
    assert (parked.transaction_id, parked.state, parked.checks_sent) == (
        result.transaction_id,
        "parked",
        3,
    )
    assert store.max_offset(CHECK_MAX_TOPIC, 0) == 1
    assert txn.transaction_stats().parked_total == 1
    scan(txn, clock)
    assert len(sender.sent) == 3  # parked: left alone
    info = txn.resume_transaction(result.transaction_id)
    assert (info.state, info.checks_sent) == ("prepared", 0)
    scan(txn, clock)
    assert len(sender.sent) == 4
    with pytest.raises(TransactionStateError):
        txn.resume_transaction(result.transaction_id)  # not parked


def test_parked_transaction_can_still_be_decided(txn: Broker, clock: FakeClock) -> None:
    result = send_half(txn)
    for _ in range(4):
        scan(txn, clock)
    assert txn.parked_transactions()
    assert (
        txn.end_transaction("orders", "", result.transaction_id, "commit", "operator")
        is TxnState.COMMITTED
    )
    assert txn.parked_transactions() == [] and txn.list_transactions() == []


def test_dead_streams_do_not_count(txn: Broker, clock: FakeClock, sender: RecordingSender) -> None:
    send_half(txn)
    sender.live = False
    for _ in range(10):
        scan(txn, clock)
    assert txn.list_transactions()[0].checks_sent == 0 and txn.parked_transactions() == []
    assert txn.transaction_stats().checks_unsent_total == 10
    sender.live = True
    scan(txn, clock)
    assert txn.list_transactions()[0].checks_sent == 1


def test_no_sender_set_is_like_no_live_producer(store: MemoryStore, clock: FakeClock) -> None:
    broker = Broker(store, None, BrokerConfig(), clock)
    broker.create_topic("orders", MessageType.TRANSACTION)
    send_half(broker)
    for _ in range(20):
        scan(broker, clock)
    assert broker.list_transactions()[0].checks_sent == 0


def test_decided_transactions_are_never_checked(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    committed = send_half(txn, b"c")
    rolled = send_half(txn, b"r")
    open_ = send_half(txn, b"o")
    txn.end_transaction("orders", "", committed.transaction_id, "commit", "client")
    scan(txn, clock)
    txn.end_transaction("orders", "", rolled.transaction_id, "rollback", "check")
    scan(txn, clock)
    checked = [s[3] for s in sender.sent]
    assert committed.transaction_id not in checked
    assert checked.count(rolled.transaction_id) == 1
    assert checked.count(open_.transaction_id) == 2


def test_decision_arriving_during_a_scan_is_respected(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    results = [send_half(txn, bytes([i])) for i in range(4)]
    ids = [r.transaction_id for r in results]

    def decide_the_others(current: str) -> None:
        # While the scan is on the first message, the producer answers for two others.
        if current == ids[0]:
            txn.end_transaction("orders", "", ids[1], "commit", "client")
            txn.end_transaction("orders", "", ids[2], "rollback", "client")

    sender.on_send = decide_the_others
    scan(txn, clock)
    assert [s[3] for s in sender.sent] == [ids[0], ids[3]]
    report = txn._checks.last_report
    assert report is not None and (report.sent, report.skipped) == (2, 2)


def test_decision_between_send_and_count_is_not_counted(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    send_half(txn)
    sender.on_send = lambda tid: txn.end_transaction("orders", "", tid, "commit", "check")
    scan(txn, clock)
    assert txn.transaction_stats().checks_sent_total == 0
    assert txn.list_transactions() == []


def test_an_error_on_one_message_does_not_stall_the_scan(
    txn: Broker, clock: FakeClock, sender: RecordingSender, store: MemoryStore
) -> None:
    bad, good = send_half(txn, b"bad"), send_half(txn, b"good")
    sender.fail_for = {bad.transaction_id}
    scan(txn, clock)
    scan(txn, clock)
    assert [s[3] for s in sender.sent] == [good.transaction_id, good.transaction_id]
    assert txn.transaction_stats().check_errors_total == 2
    # a half record that vanished (retention) is an error for that message only
    gone = send_half(txn, b"gone")
    store._records.pop(decode_transaction_id(gone.transaction_id))
    sender.fail_for = set()
    sender.sent.clear()
    scan(txn, clock)
    assert sorted(s[3] for s in sender.sent) == sorted([bad.transaction_id, good.transaction_id])
    assert gone.message_id not in [i.message_id for i in txn.list_transactions()]
    assert txn.transaction_stats().lost_total == 1


def test_group_members_are_not_checked(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    send_half(txn, transaction_group="spark-batch-1")
    for _ in range(5):
        scan(txn, clock)
    assert sender.sent == [] and txn.parked_transactions() == []


def test_thousands_of_checks_in_one_scan(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    for _start in range(0, 2_000, 500):
        txn.send(
            [
                OutgoingMessage(
                    "orders", b"x", message_type=MessageType.TRANSACTION, producer_group="pg"
                )
                for _ in range(500)
            ]
        )
    scan(txn, clock)
    while txn._checks.scanning:  # a loaded machine may need more than one tick's budget
        txn.tick()
    assert len(sender.sent) == 2_000
    assert txn.transaction_stats().checks_sent_total == 2_000


def test_a_scan_spreads_over_ticks_within_its_budget(store: MemoryStore, clock: FakeClock) -> None:
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_tick_budget_ms=0))
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = RecordingSender()
    broker.set_check_sender(sender)
    for i in range(3):
        send_half(broker, bytes([i]))
    scan(broker, clock)  # budget 0: one message per tick
    assert len(sender.sent) == 1 and broker._checks.scanning
    broker.tick()
    broker.tick()
    assert len(sender.sent) == 3 and not broker._checks.scanning
    clock.advance(INTERVAL - 1)
    broker.tick()
    assert len(sender.sent) == 3  # the next scan starts one interval after the previous one began
    clock.advance(1)
    broker.tick()
    assert len(sender.sent) == 4


class BatchSender:
    """A CheckSender with the batch API; ``refuse`` names checks no live stream would take."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.refuse: set[str] = set()

    def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
        self.batches.append([c.transaction_id for c in checks])
        return [c.transaction_id not in self.refuse for c in checks]


def test_a_slow_producer_answering_within_the_retry_time_is_never_parked(
    store: MemoryStore, clock: FakeClock
) -> None:
    # Scans every second, checks may be repeated after 6 s, a producer that answers 5 s after
    # each check: without the retry time it would get a check per scan and be parked on the 4th.
    config = TransactionConfig(check_interval_ms=1_000, timeout_ms=6_000, check_max=3)
    broker = Broker(store, None, BrokerConfig(), clock, config)
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = RecordingSender()
    broker.set_check_sender(sender)
    results = [send_half(broker, bytes([i])) for i in range(20)]
    clock.advance(6_000)  # all due
    answer_at: dict[str, int] = {}
    sender.on_send = lambda tid: answer_at.setdefault(tid, clock.now_ms() + 5_000)
    for _ in range(60):  # a minute of one-second ticks, each starting a scan
        scan(broker, clock, 1_000)
        for tid, at in list(answer_at.items()):
            if at <= clock.now_ms():
                broker.end_transaction("orders", "", tid, "commit", "check")
                del answer_at[tid]
        if not answer_at and not broker.list_transactions():
            break
    assert broker.list_transactions() == [] and broker.parked_transactions() == []
    assert sorted(s[3] for s in sender.sent) == sorted(
        r.transaction_id for r in results
    )  # one check each
    stats = broker.transaction_stats()
    assert (stats.committed_total, stats.parked_total, stats.checks_sent_total) == (20, 0, 20)


def test_an_unanswered_check_is_repeated_after_the_retry_time_then_parked(
    store: MemoryStore, clock: FakeClock
) -> None:
    config = TransactionConfig(
        check_interval_ms=1_000, timeout_ms=1_000, check_retry_ms=5_000, check_max=2
    )
    broker = Broker(store, None, BrokerConfig(), clock, config)
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = RecordingSender()
    broker.set_check_sender(sender)
    send_half(broker)
    checked_at = []
    for second in range(1, 20):
        before = len(sender.sent)
        scan(broker, clock, 1_000)
        if len(sender.sent) > before:
            checked_at.append(second)
    assert checked_at == [1, 6]  # due after 1 s, repeated 5 s later, never more often
    (parked,) = broker.parked_transactions()  # and parked 5 s after the last check went unanswered
    assert parked.checks_sent == 2


def test_batch_sender_gets_batches_and_only_taken_checks_count(
    store: MemoryStore, clock: FakeClock
) -> None:
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_max=3))
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = BatchSender()
    broker.set_check_sender(sender)
    count = CHECK_BATCH + 10
    broker.send(
        [
            OutgoingMessage(
                "orders", b"x", message_type=MessageType.TRANSACTION, producer_group="pg"
            )
            for _ in range(count)
        ]
    )
    refused = {i.transaction_id for i in broker.list_transactions()[:5]}
    sender.refuse = refused
    scan(broker, clock)
    while broker._checks.scanning:
        broker.tick()
    assert (
        sum(len(b) for b in sender.batches) == count
        and max(len(b) for b in sender.batches) <= CHECK_BATCH
    )
    stats = broker.transaction_stats()
    assert (stats.checks_sent_total, stats.checks_unsent_total) == (count - 5, 5)
    counts = {i.transaction_id: i.checks_sent for i in broker.list_transactions()}
    assert all(counts[t] == 0 for t in refused) and sum(counts.values()) == count - 5


def test_a_failing_batch_is_counted_as_errors_and_the_scan_goes_on(
    store: MemoryStore, clock: FakeClock
) -> None:
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_max=3))
    broker.create_topic("orders", MessageType.TRANSACTION)

    class Broken(BatchSender):
        def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
            raise RuntimeError("loop gone")

    broker.set_check_sender(Broken())
    send_half(broker)
    scan(broker, clock)
    assert broker.transaction_stats().check_errors_total == 1
    sender = BatchSender()
    broker.set_check_sender(sender)
    scan(broker, clock)
    assert broker.list_transactions()[0].checks_sent == 1
