"""What a master keeps beside its messages, across a failover: real processes.

etcd, a sync group (a master, two replicas, ``min_insync_replicas=1``) and a
proxy; the official Python client through the proxy. Each test puts one kind
of state on the master, SIGKILLs it and deletes its data directory (its disk
is lost: only what reached the replicas counts), waits for a replica to take
office, and checks that the new master loses nothing of that state. It may
deliver again (at least once): the repeats are counted and printed.

- pop consumption (of topics and of lite topics): messages received and
  not acked, and messages never received, are delivered by the new master
  (a group that starts at the latest offset must not start over at the end
  on the new master), and messages acked before the kill are not delivered
  again;
- delay messages: due after the failover, each is delivered by the new
  master, not before its time;
- pending half messages: the new master checks them back through the proxy;
  the checker's commit delivers them, its rollback never does;
- a transaction group committed just before the kill: every member is
  delivered after the failover.
"""

from __future__ import annotations

import collections
import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.v5.consumer import LiteSimpleConsumer

from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.topics import POP_TOPIC, TIMER_PROGRESS_TOPIC
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from tests.cluster.broker_processes import BrokerProcess
from tests.replication.group_cluster import (
    GroupCluster,
    acting_master,
    held,
    running,
    status,
)
from tests.replication.test_group_replication import message, producer
from tests.server.test_lite_priority_python import lite_message, manager_of, subscribe
from tests.waiting import wait_until

INVISIBLE_S = 20


@pytest.fixture
def group(tmp_path: Path) -> Iterator[GroupCluster]:
    with running(GroupCluster(tmp_path / "group", mode="sync", min_insync=1)) as cluster:
        wait_until(lambda: status(cluster.master)["isr"] == ["b1", "b2"], 15, "replicas in sync")
        yield cluster


def fail_over(group: GroupCluster) -> BrokerProcess:
    """SIGKILL the master, delete its data directory; the replica that takes office."""
    group.master.kill()
    shutil.rmtree(group.master.data_dir)
    new_master = wait_until(
        lambda: acting_master(group),
        20,
        "a replica to take office",
    )
    assert status(new_master)["epoch"] == 2
    return new_master


def consumer(group: GroupCluster, name: str, topic: str) -> SimpleConsumer:
    assert group.proxy is not None
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=10)
    made = SimpleConsumer(config, name, {topic: FilterExpression()}, await_duration=1)
    made.startup()
    return made


def receive_until(
    client: SimpleConsumer,
    wanted: set[str],
    timeout: float,
    *,
    hold_s: float = 0.0,
) -> dict[str, list[float]]:
    """Receive (and ack) until every body of ``wanted`` came, then ``hold_s`` longer;
    each body received with the wall-clock times it came at."""
    seen: dict[str, list[float]] = collections.defaultdict(list)
    deadline = time.monotonic() + timeout
    done_at: float | None = None
    while time.monotonic() < deadline:
        if done_at is None and wanted <= seen.keys():
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at >= hold_s:
            break
        try:
            batch = client.receive(32, INVISIBLE_S)
        except Exception:  # noqa: BLE001 - the group has no master for a moment: ask again
            time.sleep(0.2)  # not synchronization: keeps a refused receive from spinning
            continue
        now = time.time()
        for msg in batch:
            seen[msg.body.decode()].append(now)
            # A handle of the old master may fail to ack: the message comes again.
            with contextlib.suppress(Exception):
                client.ack(msg)
    missing = wanted - seen.keys()
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    return seen


def repeats(seen: dict[str, list[float]], bodies: set[str]) -> int:
    return sum(len(seen.get(body, ())) for body in bodies)


@pytest.mark.parametrize("journaled", [False, True], ids=["killed-at-once", "after-a-snapshot"])
def test_pop_consumed_unacked_and_unreceived_messages_survive_a_failover(
    group: GroupCluster, journaled: bool
) -> None:
    """A group starting at the latest offset: on the new master it must go on where it was
    (at worst from where it started), not start over at the end. An ack answers once its
    record is on the in-sync replicas: none of the acked comes again, killed at once or
    after the acks' snapshot reached the replicas (``journaled``)."""
    assert group.proxy is not None
    group.proxy.create_topic("jobs", "normal", queues=2)
    group.proxy.create_group("workers", consume_from="latest")
    reader = consumer(group, "workers", "jobs")
    sender = producer(group, "jobs")
    try:
        assert reader.receive(32, INVISIBLE_S) == []  # first contact: the group starts here
        for i in range(30):
            sender.send(message("jobs", i))
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            got += reader.receive(20 - len(got), INVISIBLE_S)
        assert len(got) == 20
        acked = {m.body.decode() for m in got[:10]}
        for m in got[:10]:
            reader.ack(m)
        unacked = {m.body.decode() for m in got[10:]}
        unreceived = {f"body-{i}" for i in range(30)} - acked - unacked
        if journaled:
            records = held(group.replicas[0], POP_TOPIC, 1)
            wait_until(
                lambda: held(group.replicas[0], POP_TOPIC, 1) > records,
                15,
                "the group's queues journaled after the acks",
            )
        killed = time.time()
        fail_over(group)
        seen = receive_until(reader, unacked | unreceived, timeout=90)
    finally:
        sender.shutdown()
        reader.shutdown()
    again = repeats(seen, acked)
    early = [b for b in unacked if seen[b][0] < killed + INVISIBLE_S]
    print(
        f"acked before, delivered again: {again}/10; unacked delivered before their "
        f"invisible time ran out: {len(early)}/10"
    )
    assert again == 0, f"{again} acked messages delivered again"


def test_lite_consumption_survives_a_failover(group: GroupCluster) -> None:
    """Lite topics have a pop service of their own: what was acked is not delivered again,
    what was in flight or never received is, in order."""
    assert group.proxy is not None
    group.proxy.create_topic("chat", "lite", queues=1)
    group.proxy.create_group("bots")
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=10)
    reader = LiteSimpleConsumer("chat", config, "bots", await_duration=1)
    reader.startup()
    sender = producer(group, "chat")
    try:
        wait_until(lambda: manager_of(reader).lite_subscription_quota > 0, 10, "lite settings")  # type: ignore[attr-defined]
        subscribe(reader, "s1")
        for i in range(8):
            sender.send(lite_message("chat", "s1", f"body-{i}"))
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            got += reader.receive(5 - len(got), INVISIBLE_S)
        assert [m.body for m in got] == [f"body-{i}".encode() for i in range(5)]
        for m in got[:3]:
            reader.ack(m)  # answered once its record is on the in-sync replicas
        fail_over(group)
        # A new master holds no lite subscriptions (they are per client, in memory, as on
        # RocketMQ); the client sends its whole set every 30 s: now, here.
        wait_until(lambda: _resubscribed(reader), 30, "the subscription on the new master")
        seen = receive_until(reader, {f"body-{i}" for i in range(3, 8)}, timeout=60)
    finally:
        sender.shutdown()
        reader.shutdown()
    assert repeats(seen, {f"body-{i}" for i in range(3)}) == 0, "acked lite messages came again"
    firsts = sorted(seen, key=lambda body: seen[body][0])
    assert firsts == [f"body-{i}" for i in range(3, 8)]  # each lite topic in order


def _resubscribed(reader: LiteSimpleConsumer) -> bool:
    try:
        reader.subscribe_lite_all()
    except Exception:  # noqa: BLE001 - the group has no master for a moment: again
        return False
    return True


def test_delay_messages_due_after_a_failover_are_delivered_by_the_new_master_on_time(
    group: GroupCluster,
) -> None:
    assert group.proxy is not None
    group.proxy.create_topic("later", "delay", queues=2)
    group.proxy.create_group("delayed")
    reader = consumer(group, "delayed", "later")
    sender = producer(group, "later")
    try:
        soon = int(time.time()) + 2
        for i in range(5):
            sender.send(_delayed("later", f"early-{i}", soon))
        receive_until(reader, {f"early-{i}" for i in range(5)}, timeout=20)
        # The timer's progress after those deliveries reaches the replicas as a record.
        records = held(group.replicas[0], TIMER_PROGRESS_TOPIC, 1)
        wait_until(
            lambda: held(group.replicas[0], TIMER_PROGRESS_TOPIC, 1) > records,
            15,
            "the timer's progress journaled",
        )
        due = int(time.time()) + 15  # well after the new master takes office (about 5 s)
        late = {f"late-{i}" for i in range(10)}
        for body in sorted(late):
            sender.send(_delayed("later", body, due))
        new_master = fail_over(group)
        assert time.time() < due, "the failover took longer than the delay"
        seen = receive_until(reader, late, timeout=60, hold_s=2)
    finally:
        sender.shutdown()
        reader.shutdown()
    first = min(seen[body][0] for body in late)
    assert first >= due - 0.05, f"delivered {due - first:.2f}s before its time"
    # Each delivered (stored in its topic) once: the new master resumed the timer where the
    # journaled progress left it, not from the timer queue's start.
    assert held(new_master, "later", 2) == 5 + 10
    last = max(seen[body][0] for body in late)
    print(
        f"late ones delivered {first - due:.2f}..{last - due:.2f}s after their time; "
        f"early ones received again (pop): {repeats(seen, {f'early-{i}' for i in range(5)})}/5"
    )


def _delayed(topic: str, body: str, at_s: int) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    msg.delivery_timestamp = at_s  # the Python client sends whole seconds
    return msg


class RecordingChecker(TransactionChecker):
    """Commits what says so, rolls back the rest; remembers what it was asked about."""

    def __init__(self) -> None:
        self.asked: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def check(self, message: Message) -> TransactionResolution:
        body = message.body.decode()
        with self.lock:
            self.asked[body] += 1
        if body.startswith("commit"):
            return TransactionResolution.COMMIT
        return TransactionResolution.ROLLBACK


def test_pending_half_messages_are_checked_back_by_the_new_master(group: GroupCluster) -> None:
    assert group.proxy is not None
    group.proxy.create_topic("payments", "transaction", queues=1)
    group.proxy.create_group("ledger")
    checker = RecordingChecker()
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=10)
    sender = Producer(config, ("payments",), checker=checker)
    sender.startup()
    reader = consumer(group, "ledger", "payments")
    try:
        control = sender.begin_transaction()
        sender.send(_body("payments", "committed-0"), control)
        control.commit()
        halves = {"commit-0", "commit-1", "commit-2", "rollback-0", "rollback-1"}
        for body in sorted(halves):
            sender.send(_body("payments", body), sender.begin_transaction())  # never decided
        fail_over(group)  # at once: before the old master's first check (6 s)
        # Asked about by the new master (through the proxy), each answered once at least.
        wait_until(lambda: halves <= set(checker.asked), 60, "every pending half checked back")
        seen = receive_until(
            reader, {"committed-0", "commit-0", "commit-1", "commit-2"}, timeout=30, hold_s=3
        )
    finally:
        reader.shutdown()
        sender.shutdown()
    rolled_back = {"rollback-0", "rollback-1"} & seen.keys()
    assert not rolled_back, f"rolled back yet delivered: {sorted(rolled_back)}"
    print(f"checks: {dict(checker.asked)}; deliveries: { {b: len(t) for b, t in seen.items()} }")


def _body(topic: str, body: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    return msg


def test_a_transaction_group_committed_before_the_kill_is_delivered_after(
    group: GroupCluster,
) -> None:
    assert group.proxy is not None
    group.proxy.create_topic("batches", "transaction", queues=2)
    group.proxy.create_group("loader")
    members = {f"member-{i}" for i in range(6)}
    remote = RemoteBroker(group.master.address, timeout_s=10)
    try:
        sent = remote.send(
            [
                OutgoingMessage(
                    "batches",
                    body.encode(),
                    message_type=MessageType.TRANSACTION,
                    producer_group="pg",
                    transaction_group="batch-1",
                    queue_id=i % 2,
                )
                for i, body in enumerate(sorted(members))
            ]
        )
        assert len(sent) == len(members)
        assert remote.end_transaction_group("batch-1", "commit") == len(members)
    finally:
        remote.close()
    fail_over(group)
    reader = consumer(group, "loader", "batches")
    try:
        seen = receive_until(reader, members, timeout=60)
    finally:
        reader.shutdown()
    print(f"deliveries: { {b: len(t) for b, t in seen.items()} }")
