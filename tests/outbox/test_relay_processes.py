"""RelayProcesses and ``outbox relay --processes``: child processes publishing to a real halfmoon.

Every topic here has one queue, so a message's queue offset is the order in
which the broker stored it across all children: an aggregate's next message
is claimed only once the previous one is acknowledged and marked, so its
messages must appear in sequence order in that queue.
"""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from halfmoon.client import MessageSelector, SyncSimpleConsumer
from halfmoon.outbox import Outbox, OutboxMessage, RelayProcesses
from tests.outbox.conftest import ServerProcess, wait_until
from tests.quiet_exit import assert_quiet_exit
from tests.server.conftest import ROOT

AGGREGATES = 20

# (queue offset, message id, aggregate, sequence) per stored message.
Stored = tuple[int, str, str, int]


def fill(outbox: Outbox, topic: str, per_aggregate: int) -> dict[str, tuple[str, int]]:
    """Interleave the aggregates' messages, one transaction per round; the sequence number is the
    payload."""
    expected: dict[str, tuple[str, int]] = {}
    for seq in range(per_aggregate):
        messages = [
            OutboxMessage(topic, str(seq).encode(), aggregate_type="acct", aggregate_id=f"a{a}")
            for a in range(AGGREGATES)
        ]
        with outbox.engine.begin() as conn:
            for mid, m in zip(outbox.add_many(conn, messages), messages, strict=True):
                expected[mid] = (m.aggregate_id, seq)
    return expected


@pytest.fixture
def topic(halfmoon_server: ServerProcess, table_prefix: str) -> str:
    name = f"{table_prefix}events"
    halfmoon_server.create_topic(name, queues=1)
    return name


def consume(
    server: ServerProcess, topic: str, expected: set[str], timeout: float = 20.0
) -> list[Stored]:
    """Receive until every expected id was seen, then until the queue is empty; sorted by queue
    offset."""
    group = f"{topic}-check"
    server.create_group(group)
    stored: dict[int, Stored] = {}
    deadline = time.monotonic() + timeout
    with SyncSimpleConsumer(
        server.grpc, group, {topic: MessageSelector.all()}, await_duration=0.5
    ) as consumer:
        while True:
            batch = consumer.receive(32, 30)
            for m in batch:
                # Keyed by offset: a redelivery is the same stored message, a republish is not.
                stored[m.queue_offset] = (
                    m.queue_offset,
                    m.properties["outbox_message_id"],
                    m.properties["outbox_aggregate_id"],
                    int(m.body),
                )
                consumer.ack(m)
            seen = {s[1] for s in stored.values()}
            if not batch and expected <= seen:
                break
            assert time.monotonic() < deadline, (
                f"only {len(expected & seen)} of {len(expected)} messages reached the topic"
            )
    return sorted(stored.values())


def assert_complete_and_in_order(
    stored: list[Stored], expected: dict[str, tuple[str, int]]
) -> Counter[str]:
    counts = Counter(mid for _o, mid, _a, _s in stored)
    assert set(counts) == set(expected), f"lost {len(set(expected) - set(counts))} messages"
    for _offset, mid, aggregate, seq in stored:
        assert (aggregate, seq) == expected[mid]
    last: dict[str, int] = {}
    for _offset, _mid, aggregate, seq in stored:
        # Non-decreasing: a republished message repeats its sequence number, never goes back.
        assert seq >= last.get(aggregate, 0), (
            f"aggregate {aggregate}: {seq} stored after {last[aggregate]}"
        )
        last[aggregate] = seq
    return counts


@pytest.fixture
def relay_groups() -> Iterator[list[RelayProcesses]]:
    """Relay groups a test appends to, stopped at its end whatever happened."""
    groups: list[RelayProcesses] = []
    yield groups
    for group in groups:
        group.stop(10)


def relay_children() -> list[multiprocessing.process.BaseProcess]:
    return [
        p for p in multiprocessing.active_children() if p.name.startswith("outbox-relay-process-")
    ]


def test_two_processes_publish_every_row_once_in_aggregate_order(
    outbox: Outbox,
    db_url: str,
    table_prefix: str,
    halfmoon_server: ServerProcess,
    topic: str,
    relay_groups: list[RelayProcesses],
) -> None:
    group = RelayProcesses(
        db_url,
        f"halfmoon://{halfmoon_server.grpc}",
        processes=2,
        table_prefix=table_prefix,
        workers=2,
        batch_size=10,
        poll_interval=0.05,
        sent_retention=None,
    )
    relay_groups.append(group)
    group.start(60)
    assert len(relay_children()) == 2
    # Rows arrive while both children are already claiming, so both get work.
    expected = fill(outbox, topic, 15)
    wait_until(lambda: outbox.status().pending == 0, 30, "two relay processes to drain the outbox")
    wait_until(lambda: group.published == len(expected), 5, "the children's counters to catch up")
    group.stop(15)
    assert not relay_children(), "a child outlived stop()"
    status = outbox.status()
    assert (status.sent, status.failed) == (len(expected), 0)

    counts = assert_complete_and_in_order(consume(halfmoon_server, topic, set(expected)), expected)
    assert max(counts.values()) == 1, "a message was published twice without any crash"


def test_a_sigkilled_child_is_restarted_and_nothing_is_lost(
    outbox: Outbox,
    db_url: str,
    table_prefix: str,
    halfmoon_server: ServerProcess,
    topic: str,
    relay_groups: list[RelayProcesses],
) -> None:
    expected = fill(outbox, topic, 40)
    # One worker per child and small batches, so the backlog lasts long enough to kill into;
    # a 2 s SQLite lease so the killed child's claimed rows come back quickly.
    group = RelayProcesses(
        db_url,
        f"halfmoon://{halfmoon_server.grpc}",
        processes=2,
        table_prefix=table_prefix,
        workers=1,
        batch_size=5,
        poll_interval=0.05,
        lease_seconds=2.0,
        sent_retention=None,
    )
    relay_groups.append(group)
    stop_supervising = threading.Event()
    supervisor = threading.Thread(
        target=group.supervise, args=(stop_supervising, 0.05), daemon=True
    )
    group.start(60)
    supervisor.start()
    try:
        wait_until(lambda: group.published >= 40, 30, "the children to publish a first part")
        victim = next(p for p in relay_children() if p.name.endswith("-0"))
        pending_at_kill = outbox.status().pending
        victim.kill()  # SIGKILL
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
        assert pending_at_kill > 0, "the backlog was gone before the kill; the test proves nothing"
        replacement = wait_until(
            lambda: next(
                (p for p in relay_children() if p.name.endswith("-0") and p.pid != victim.pid), None
            ),
            10,
            "supervise to restart the child",
        )
        assert group.restarts == 1
        wait_until(
            lambda: outbox.status().pending == 0,
            40,
            "the relay group to finish the outbox after the kill",
        )
        assert replacement.is_alive()  # type: ignore[attr-defined]
    finally:
        stop_supervising.set()
        supervisor.join(5)
        group.stop(15)
    assert not relay_children()
    assert outbox.status().failed == 0

    counts = assert_complete_and_in_order(consume(halfmoon_server, topic, set(expected)), expected)
    # Duplicates only from the killed child's batch in flight (one worker, five rows).
    assert sum(n - 1 for n in counts.values()) <= 5
    assert all(n <= 2 for n in counts.values())


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_runs_processes_and_stops_cleanly_on_a_signal(
    outbox: Outbox,
    db_url: str,
    table_prefix: str,
    halfmoon_server: ServerProcess,
    topic: str,
    signum: signal.Signals,
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "halfmoon",
        "outbox",
        "relay",
        "--processes",
        "2",
        "--workers",
        "2",
        "--batch",
        "10",
        "--poll",
        "50ms",
        "--db",
        db_url,
        "--target",
        f"halfmoon://{halfmoon_server.grpc}",
        "--table-prefix",
        table_prefix,
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("outbox relay running: processes=2 workers=2"), (
            line + proc.communicate(timeout=10)[1][-3000:]
        )
        expected = fill(outbox, topic, 5)
        wait_until(lambda: outbox.status().pending == 0, 30, "the CLI relay to drain the outbox")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-3000:]
    assert f"outbox relay stopped: published={len(expected)} restarts=0 pending=0" in out, (
        out + err[-3000:]
    )
    assert_quiet_exit(err)
    counts = assert_complete_and_in_order(consume(halfmoon_server, topic, set(expected)), expected)
    assert max(counts.values()) == 1
