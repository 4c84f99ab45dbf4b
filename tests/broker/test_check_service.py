"""The check service on a fake clock: timeout, immunity, check max, dead streams, races, errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
from halfmoon.broker.transactions.check import CHECK_BATCH, REFILL_MAX_MS, CheckRequest
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
    broker = Broker(store, None, BrokerConfig(), clock, config_without_deadline(check_max=3))
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


def config_without_deadline(**settings: Any) -> TransactionConfig:
    """The settings with a tick budget no loaded machine overruns: a tick works for at most
    ``check_tick_budget_ms`` of real time (50 ms by default), and a scan cut short by it
    forms other batches than the ones these tests count. The budget has a test of its own."""
    return TransactionConfig(check_tick_budget_ms=60_000, **settings)


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
    config = config_without_deadline(check_interval_ms=1_000, timeout_ms=6_000, check_max=3)
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
    config = config_without_deadline(
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
    broker = Broker(store, None, BrokerConfig(), clock, config_without_deadline(check_max=3))
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
    broker = Broker(store, None, BrokerConfig(), clock, config_without_deadline(check_max=3))
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


# -- the due index: a scan costs what is due ---------------------------------------------------


def send_halves(broker: Broker, count: int, topic: str = "orders", **kw) -> list:
    results = []
    for start in range(0, count, 500):
        results += broker.send(
            [
                OutgoingMessage(
                    topic, b"x", message_type=MessageType.TRANSACTION, producer_group="pg", **kw
                )
                for _ in range(min(500, count - start))
            ]
        )
    return results


def test_a_scan_costs_what_is_due_not_what_is_pending(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    send_halves(txn, 20_000, check_immunity_seconds=3_600)  # pending, due in an hour
    due = send_halves(txn, 5)
    service = txn.transactions
    assert len(service.due) == 20_005
    before = service.due.work
    scan(txn, clock)
    assert sorted(s[3] for s in sender.sent) == sorted(r.transaction_id for r in due)
    report = txn._checks.last_report
    assert report is not None and (report.candidates, report.sent) == (5, 5)
    # Taking the five, indexing them again for their retry time, the lane's reschedule: a
    # handful of heap operations, none for the 20,000 waiting ones.
    assert service.due.work - before <= 30
    before = service.due.work
    scan(txn, clock)  # 30 s later: the five were checked 30 s ago (retry 6 s), so due again
    assert service.due.work - before <= 30 and len(sender.sent) == 10


def test_decisions_take_transactions_out_of_the_index(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    committed, rolled, open_ = (send_half(txn, bytes([i])) for i in range(3))
    due = txn.transactions.due
    assert len(due) == 3
    txn.end_transaction("orders", "", committed.transaction_id, "commit", "client")
    txn.end_transaction("orders", "", rolled.transaction_id, "rollback", "client")
    txn.end_transaction("orders", "", open_.transaction_id, "unknown", "client")
    assert len(due) == 1
    assert [entry.transaction_id for _, entry in due.entries()] == [open_.transaction_id]
    scan(txn, clock)
    assert [s[3] for s in sender.sent] == [open_.transaction_id]
    # Checked: back in the index for after its retry time (6 s) and the next scan (30 s).
    ((at, _),) = due.entries()
    assert at == clock.now_ms() + INTERVAL


def test_parking_takes_a_transaction_out_and_resuming_puts_it_back(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    result = send_half(txn)
    due = txn.transactions.due
    for _ in range(4):  # check_max 3: the fourth round parks it
        scan(txn, clock)
    assert txn.parked_transactions() and len(due) == 0
    txn.resume_transaction(result.transaction_id)
    assert [(at, e.transaction_id) for at, e in due.entries()] == [
        (clock.now_ms(), result.transaction_id)
    ]
    scan(txn, clock)
    assert len(sender.sent) == 4


def test_group_members_are_not_indexed(txn: Broker) -> None:
    send_half(txn, transaction_group="spark-batch-2")
    assert len(txn.transactions.due) == 0


def test_a_full_producer_is_left_after_one_batch_and_probed_next_time(
    store: MemoryStore, clock: FakeClock
) -> None:
    from halfmoon.broker.transactions.check import PROBE_BATCH

    broker = Broker(store, None, BrokerConfig(), clock, config_without_deadline(check_max=3))
    broker.create_topic("orders", MessageType.TRANSACTION)
    broker.create_topic("payments", MessageType.TRANSACTION)

    class FullOrders(BatchSender):
        def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
            self.batches.append([c.transaction_id for c in checks])
            return [c.topic != "orders" for c in checks]  # the orders producer has no room

    sender = FullOrders()
    broker.set_check_sender(sender)
    send_halves(broker, 3_000)
    payments = send_halves(broker, 10, topic="payments")
    scan(broker, clock)
    report = broker._checks.last_report
    assert report is not None
    # One batch of orders refused, then the lane is left; every payment checked.
    assert (report.candidates, report.sent, report.unsent) == (CHECK_BATCH + 10, 10, CHECK_BATCH)
    assert {t for b in sender.batches for t in b} >= {r.transaction_id for r in payments}
    sender.batches.clear()
    scan(broker, clock)
    report = broker._checks.last_report
    # The full lane costs a probe now; the payments are checked again (30 s > the 6 s retry).
    assert report is not None and report.candidates == PROBE_BATCH + 10
    assert sorted(len(b) for b in sender.batches) == [10, PROBE_BATCH]
    # Nothing was lost on the way: every refused transaction is still due and uncounted.
    assert len(broker.transactions.due) == 3_010
    assert broker.transaction_stats().checks_sent_total == 20


class PacedSender(BatchSender):
    """A sender that says how much room each (producer group, topic) has, as the server's does,
    and which checks are still awaiting an answer."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.free = room
        self.asked_room = 0
        self.awaiting: set[str] = set()

    def room(self, producer_group: str | None, topic: str) -> int:
        self.asked_room += 1
        return self.free

    def awaiting_answer(self, transaction_id: str) -> bool:
        return transaction_id in self.awaiting

    def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
        took = super().send_checks(checks)
        self.free -= sum(took)
        self.awaiting.update(c.transaction_id for c in checks)
        return took


def test_a_sender_that_tells_its_room_gets_exactly_that_many_and_no_half_is_read_for_nothing(
    store: MemoryStore, clock: FakeClock
) -> None:
    config = config_without_deadline(
        check_interval_ms=30_000, timeout_ms=1_000, check_retry_ms=5_000
    )
    broker = Broker(store, None, BrokerConfig(), clock, config)
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = PacedSender(room=300)
    broker.set_check_sender(sender)
    send_halves(broker, 2_000)
    scan(broker, clock)
    report = broker._checks.last_report
    assert report is not None
    assert (report.candidates, report.sent, report.unsent, report.full_lanes) == (300, 300, 0, 1)
    assert sum(len(b) for b in sender.batches) == 300  # nothing prepared only to be refused
    # The stream was full: a refill follows soon, not an interval later; with no room it costs
    # one question and no candidate.
    clock.advance(REFILL_MAX_MS)
    broker.tick()
    report = broker._checks.last_report
    assert report is not None and report.candidates == 0 and sender.asked_room == 2
    sender.free = 100  # the producer answered 100 (nothing decided here: they stay awaited)
    clock.advance(REFILL_MAX_MS)
    broker.tick()
    assert sum(len(b) for b in sender.batches) == 400
    assert broker.transaction_stats().checks_sent_total == 400


def test_a_check_still_awaiting_its_answer_is_looked_at_once_per_retry_time(
    store: MemoryStore, clock: FakeClock
) -> None:
    config = config_without_deadline(
        check_interval_ms=5_000, timeout_ms=1_000, check_retry_ms=5_000
    )
    broker = Broker(store, None, BrokerConfig(), clock, config)
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = PacedSender(room=1_000)
    broker.set_check_sender(sender)
    sent = send_halves(broker, 10)
    checks = broker._checks
    clock.advance(1_000)
    assert checks.scan(clock.now_ms()).sent == 10
    clock.advance(5_000)  # due again, but the producer has not answered yet
    report = checks.scan(clock.now_ms())
    assert (report.candidates, report.sent, report.unsent) == (10, 0, 10)
    clock.advance(REFILL_MAX_MS)
    assert checks.scan(clock.now_ms()).candidates == 0  # not again at every scan
    clock.advance(5_000 - REFILL_MAX_MS)
    sender.awaiting -= {r.transaction_id for r in sent[:4]}  # those four checks were lost
    report = checks.scan(clock.now_ms())
    assert (report.candidates, report.sent, report.unsent) == (10, 4, 6)
    assert broker.transaction_stats().checks_sent_total == 14


def test_next_check_is_the_scan_that_will_take_it(
    txn: Broker, clock: FakeClock, sender: RecordingSender
) -> None:
    start = clock.now_ms()
    immune = send_half(txn, b"immune", check_immunity_seconds=100)
    plain = send_half(txn, b"plain")
    next_of = {t.transaction_id: t.next_check_ms for t in txn.list_transactions()}
    # Scans run every 30 s from the broker's start: the plain one is due (6 s) at the first,
    # the immune one (100 s) at the fourth.
    assert next_of[plain.transaction_id] == start + INTERVAL
    assert next_of[immune.transaction_id] == start + 4 * INTERVAL
    scan(txn, clock)
    assert [s[3] for s in sender.sent] == [plain.transaction_id]
    # Checked at 30 s: asked again once its retry time (6 s) is over, at the next scan.
    (info,) = [t for t in txn.list_transactions() if t.transaction_id == plain.transaction_id]
    assert info.next_check_ms == start + 2 * INTERVAL
    scan(txn, clock)
    assert [s[3] for s in sender.sent][-1] == plain.transaction_id
    scan(txn, clock)
    scan(txn, clock)  # check_max 3: the plain one is parked, and no check comes after that
    next_of = {t.transaction_id: t.next_check_ms for t in txn.list_transactions()}
    assert next_of[plain.transaction_id] is None
    assert next_of[immune.transaction_id] == clock.now_ms() + INTERVAL
    resumed = txn.resume_transaction(plain.transaction_id)
    assert resumed.next_check_ms == clock.now_ms() + INTERVAL  # the next scan


def test_refill_scans_do_not_check_a_transaction_more_than_once_per_interval(
    store: MemoryStore, clock: FakeClock
) -> None:
    config = config_without_deadline(
        check_interval_ms=30_000, timeout_ms=1_000, check_retry_ms=5_000
    )
    broker = Broker(store, None, BrokerConfig(), clock, config)
    broker.create_topic("orders", MessageType.TRANSACTION)
    sender = BatchSender()  # takes everything, answers nothing
    broker.set_check_sender(sender)
    send_halves(broker, 3)
    checks = broker._checks
    clock.advance(1_000)
    assert checks.scan(clock.now_ms()).sent == 3
    for _ in range(20):  # refills every 1.2 s for 24 s: past the retry time, not the interval
        clock.advance(1_200)
        assert checks.scan(clock.now_ms()).sent == 0
    clock.advance(30_000 - 24_000)
    assert checks.scan(clock.now_ms()).sent == 3  # the next regular scan
