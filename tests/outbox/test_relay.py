"""The relay: publish and mark, retry with backoff, failures, NOTIFY wake-ups, cleanup, metrics."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select, update

from halfmoon.client import MessageSelector, SyncSimpleConsumer
from halfmoon.metrics import MetricsRegistry
from halfmoon.outbox import HalfmoonTarget, Outbox, OutboxMessage, Relay
from tests.outbox.conftest import RecordingTarget, ServerProcess, wait_until


def add(outbox: Outbox, *messages: OutboxMessage) -> list[str]:
    with outbox.engine.begin() as conn:
        return outbox.add_many(conn, messages)


def drain(relay: Relay, until: object, timeout: float = 10.0) -> None:
    """Run single cycles until ``until()`` holds (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout
    while not until():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("relay did not get there in time")
        if relay.run_once() == 0:
            time.sleep(0.01)  # rows waiting for their backoff


def rows(outbox: Outbox) -> dict[str, object]:
    with outbox.engine.connect() as conn:
        return {r.message_id: r for r in conn.execute(select(outbox.table))}


def test_publishes_every_row_once_and_marks_it_sent(outbox: Outbox) -> None:
    target = RecordingTarget()
    ids = add(
        outbox, *(OutboxMessage("t", f"m{i}".encode(), aggregate_id=f"a{i % 3}") for i in range(12))
    )
    relay = Relay(outbox, target, batch_size=5, listen=False)
    drain(relay, lambda: outbox.status().pending == 0)
    assert sorted(target.ids()) == sorted(ids)
    assert all(
        r.status == "sent" and r.sent_at is not None and r.attempts == 1
        for r in rows(outbox).values()
    )
    # Only the head of each aggregate is claimed: at most one message per aggregate per batch.
    stats = relay.stats()
    assert stats.published == 12 and stats.batches >= 4


def test_a_failing_message_holds_back_only_its_own_aggregate(outbox: Outbox) -> None:
    target = RecordingTarget()
    stuck, after = add(
        outbox,
        OutboxMessage("t", b"1", aggregate_id="A"),
        OutboxMessage("t", b"2", aggregate_id="A"),
    )
    others = add(outbox, *(OutboxMessage("t", b"o", aggregate_id=f"B{i}") for i in range(4)))
    target.fail[stuck] = -1
    relay = Relay(
        outbox, target, max_attempts=3, backoff_initial=0.05, backoff_max=0.1, listen=False
    )
    drain(relay, lambda: rows(outbox)[stuck].status == "failed")
    assert sorted(target.ids()) == sorted(others)  # the others went; A's second waits
    assert target.attempts[stuck] == 3
    assert after not in target.attempts
    failed = rows(outbox)[stuck]
    assert failed.attempts == 3 and "refused" in failed.last_error
    assert relay.stats().failed == 1
    # A failed head keeps blocking its aggregate (order is the promise) ...
    assert relay.run_once() == 0
    # ... until an operator retries it.
    target.fail.clear()
    assert outbox.retry_failed() == 1
    drain(relay, lambda: outbox.status().pending == 0)
    assert target.ids()[-2:] == [stuck, after]


def test_successors_may_pass_a_failed_message_when_asked(outbox: Outbox) -> None:
    target = RecordingTarget()
    stuck, after = add(
        outbox,
        OutboxMessage("t", b"1", aggregate_id="A"),
        OutboxMessage("t", b"2", aggregate_id="A"),
    )
    target.fail[stuck] = -1
    relay = Relay(
        outbox,
        target,
        max_attempts=2,
        backoff_initial=0.02,
        failed_blocks_aggregate=False,
        listen=False,
    )
    drain(relay, lambda: rows(outbox)[after].status == "sent")
    assert rows(outbox)[stuck].status == "failed"
    assert target.ids() == [after]


def test_backoff_is_exponential_and_capped(outbox: Outbox) -> None:
    target = RecordingTarget()
    (mid,) = add(outbox, OutboxMessage("t", b"x"))
    target.fail[mid] = -1
    relay = Relay(
        outbox, target, max_attempts=10, backoff_initial=2.0, backoff_max=5.0, listen=False
    )
    # The relay reads its clock somewhere inside run_once: the delay it scheduled lies
    # between next_attempt_at - after and next_attempt_at - before (a loaded machine
    # can stretch run_once, so the window is measured, not assumed).
    windows = []
    for _ in range(3):
        before = int(time.time() * 1000)
        assert relay.run_once() == 1
        after = int(time.time() * 1000)
        row = rows(outbox)[mid]
        windows.append((row.next_attempt_at - after, row.next_attempt_at - before))
        with outbox.engine.begin() as conn:  # make it due again without waiting
            conn.execute(update(outbox.table).values(next_attempt_at=0))
    for (low, high), expected in zip(windows, (2000, 4000, 5000), strict=True):
        assert low - 1 <= expected <= high + 1, (windows, expected)
    assert rows(outbox)[mid].status == "pending"


def test_workers_publish_a_backlog_with_threads(outbox: Outbox) -> None:
    target = RecordingTarget()
    ids = add(
        outbox,
        *(OutboxMessage("t", str(i).encode(), aggregate_id=f"a{i % 20}") for i in range(400)),
    )
    with Relay(outbox, target, workers=4, batch_size=50, poll_interval=0.05):
        wait_until(lambda: outbox.status().pending == 0, 20, "the backlog to be published")
    assert sorted(set(target.ids())) == sorted(ids)
    order = {mid: n for n, mid in enumerate(ids)}
    for aggregate in {f"a{i}" for i in range(20)}:
        seen = [order[r.message_id] for r in target.published if r.aggregate_id == aggregate]
        assert seen == sorted(seen), f"aggregate {aggregate} published out of order"


def test_cleanup_deletes_old_sent_rows_in_bounded_batches(outbox: Outbox) -> None:
    add(outbox, *(OutboxMessage("t", b"x", aggregate_id=str(i)) for i in range(25)))
    keep = add(outbox, OutboxMessage("t", b"pending"))
    with outbox.engine.begin() as conn:
        conn.execute(
            update(outbox.table)
            .where(outbox.table.c.message_id != keep[0])
            .values(status="sent", sent_at=1000)
        )
    relay = Relay(outbox, RecordingTarget(), cleanup_batch=10, listen=False)
    assert relay.cleanup_sent(older_than=60, max_batches=2) == 20  # bounded: two batches of ten
    assert relay.cleanup_sent(older_than=60) == 5
    status = outbox.status()
    assert (status.sent, status.pending) == (0, 1)


def test_metrics_expose_backlog_and_publishing(outbox: Outbox) -> None:
    registry = MetricsRegistry()
    add(
        outbox,
        OutboxMessage("t", b"x", aggregate_id="a"),
        OutboxMessage("t", b"y", aggregate_id="a"),
    )
    relay = Relay(outbox, RecordingTarget(), metrics=registry, listen=False)
    text = registry.render()
    assert "halfmoon_outbox_pending 2" in text
    assert "halfmoon_outbox_oldest_pending_age_seconds" in text
    relay.run_once()
    text = registry.render()
    assert "halfmoon_outbox_published_total 1" in text and "halfmoon_outbox_pending 1" in text
    assert "halfmoon_outbox_publish_seconds_count 1" in text


def test_notify_wakes_the_relay_before_its_poll_interval(outbox: Outbox) -> None:
    if outbox.backend != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    target = RecordingTarget()
    with Relay(outbox, target, poll_interval=60.0) as relay:
        assert relay.wait_listening(10)
        wait_until(lambda: relay.stats().batches == 0, 1, "start-up")
        started = time.monotonic()
        (mid,) = add(outbox, OutboxMessage("t", b"x"))
        wait_until(lambda: mid in target.ids(), 5, "the NOTIFY-woken publish")
        assert time.monotonic() - started < 5  # the poll interval is 60 s


def test_relay_to_halfmoon_delivers_with_properties(
    halfmoon_server: ServerProcess, outbox: Outbox, table_prefix: str
) -> None:
    topic, group = f"{table_prefix}orders", f"{table_prefix}g"
    halfmoon_server.create_topic(topic)
    halfmoon_server.create_group(group)
    ids = add(
        outbox,
        *(
            OutboxMessage(
                topic,
                f"order {i}".encode(),
                aggregate_type="order",
                aggregate_id=str(i),
                tag="created",
                headers={"trace": f"t{i}"},
            )
            for i in range(10)
        ),
    )
    target = HalfmoonTarget(f"halfmoon://{halfmoon_server.grpc}")
    with Relay(outbox, target, workers=2, poll_interval=0.05):
        wait_until(lambda: outbox.status().pending == 0, 15, "the relay to publish to halfmoon")
    got = {}
    with SyncSimpleConsumer(
        halfmoon_server.grpc, group, {topic: MessageSelector.all()}, await_duration=1.0
    ) as consumer:
        deadline = time.monotonic() + 15
        while len(got) < len(ids) and time.monotonic() < deadline:
            for message in consumer.receive(16, 30):
                got[message.properties["outbox_message_id"]] = message
                consumer.ack(message)
    assert set(got) == set(ids)
    sample = got[ids[3]]
    assert (
        sample.body == b"order 3" and sample.tag == "created" and sample.properties["trace"] == "t3"
    )
    assert sample.properties["outbox_aggregate_id"] == "3" and ids[3] in sample.keys
