"""mqadmin's allocateMQ, brokerConsumeStats and startMonitoring as halfmoon commands.

``topic allocate``, ``consumer lag`` and ``monitor`` run as subprocesses
against a real admin API over a real Broker (the admin harness); connected
producers (``producer status``) need the gRPC server and are tested in
``test_consumer_cli.py``'s module beside the other connection listings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from halfmoon.broker.errors import PermissionDenied
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.client.allocation import allocate_average, allocate_consistent_hash
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import ROOT, failed, halfmoon, ok, table, unique
from tests.cli.test_transaction_cli import park


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    with AdminServer(tmp_path / "metadata") as server:
        yield server


def send(admin: AdminServer, topic: str, count: int, queue_id: int | None = None) -> None:
    admin.broker.send(
        [
            OutgoingMessage(topic=topic, body=f"m{i}".encode(), queue_id=queue_id)
            for i in range(count)
        ]
    )


# -- topic allocate (allocateMQ) ------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "allocate"),
    [("average", allocate_average), ("consistent_hash", allocate_consistent_hash)],
)
def test_allocate_splits_the_readable_queues_as_pull_consumers_do(admin, strategy, allocate):
    topic = unique("orders")
    admin.broker.create_topic(topic, queue_count=5)
    answer = json.loads(
        ok(
            halfmoon(
                "topic", "allocate", topic, "--clients", "c2,c1,c3",
                "--strategy", strategy, "--json", admin=admin,
            )
        )
    )  # fmt: skip
    allocation = answer["allocation"]
    assert sorted(allocation) == ["c1", "c2", "c3"]
    keys = [f"{topic}/{admin.broker.config.name}@{q}" for q in range(5)]
    for member, queues in allocation.items():
        expected = allocate(keys, ["c1", "c2", "c3"], member)
        assert [f"{topic}/{q['broker']}@{q['queue_id']}" for q in queues] == expected
    every = sorted(q["queue_id"] for queues in allocation.values() for q in queues)
    assert every == [0, 1, 2, 3, 4]  # each queue read by exactly one member


def test_allocate_average_gives_the_first_members_the_extra_queues(admin):
    topic = unique("orders")
    admin.broker.create_topic(topic, queue_count=5)
    rows = table(ok(halfmoon("topic", "allocate", topic, "--clients", "b,a", admin=admin)))
    assert rows[0] == ["CLIENT", "ID", "QUEUES"]
    name = admin.broker.config.name
    assert rows[1] == ["a", f"{name}@0,", f"{name}@1,", f"{name}@2"]
    assert rows[2] == ["b", f"{name}@3,", f"{name}@4"]


def test_allocate_errors(admin):
    line = failed(halfmoon("topic", "allocate", "nope", "--clients", "a", admin=admin))
    assert "TOPIC_NOT_FOUND" in line
    topic = unique("orders")
    admin.broker.create_topic(topic, queue_count=2)
    line = failed(halfmoon("topic", "allocate", topic, "--clients", " , ", admin=admin), 2)
    assert "--clients names no client id" in line


# -- consumer lag (brokerConsumeStats) -----------------------------------------------------


def test_lag_lists_every_groups_queues_behind_by_at_least_min_lag(admin):
    topic = unique("orders")
    admin.broker.create_topic(topic, queue_count=2)
    send(admin, topic, 6, queue_id=0)
    send(admin, topic, 2, queue_id=1)
    far, near = unique("far"), unique("near")
    for group in (far, near):
        admin.broker.create_group(group, consume_from="earliest")
    admin.broker.update_offset(far, topic, 0, 1)  # 5 behind
    admin.broker.update_offset(far, topic, 1, 0)  # 2 behind
    admin.broker.update_offset(near, topic, 0, 6)  # 0 behind

    answer = json.loads(
        ok(halfmoon("consumer", "lag", "--topic", topic, "--min-lag", "2", "--json", admin=admin))
    )
    assert [(q["group"], q["queue_id"], q["lag"]) for q in answer["queues"]] == [
        (far, 0, 5),
        (far, 1, 2),
    ]
    assert answer["total_lag"] == 7

    rows = table(ok(halfmoon("consumer", "lag", "--topic", topic, "--min-lag", "3", admin=admin)))
    assert rows[0][0] == "GROUP"
    assert [r[0] for r in rows[1:-1] if r] == [far]  # the one queue 5 behind, then the total
    assert rows[-1] == ["total", "lag:", "5"]

    quiet = ok(halfmoon("consumer", "lag", "--min-lag", "1000", admin=admin))
    assert quiet.strip() == "no queue is 1000 or more messages behind"


# -- monitor (startMonitoring) -----------------------------------------------------------


def dead_letter(admin: AdminServer, group: str, topic: str) -> str:
    """Receive one message of ``topic`` for ``group`` and move it to the DLQ; its message id."""
    views = admin.broker.receive(group, topic, FilterSpec("TAG", "*"), 1, 60_000)
    assert len(views) == 1
    admin.broker.forward_to_dead_letter(group, topic, views[0].receipt_handle or "")
    return views[0].message_id


def read_event(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline() if proc.stdout else ""
    assert line, f"monitor ended early: {proc.stderr.read() if proc.stderr else ''}"
    return json.loads(line)


def test_monitor_prints_new_dead_letters_and_stuck_and_parked_half_messages(admin):
    topic, txn_topic = unique("orders"), unique("txn")
    admin.broker.create_topic(topic, queue_count=1)
    admin.broker.create_topic(txn_topic, MessageType.TRANSACTION, 1)
    old_group, new_group = unique("old"), unique("new")
    for group in (old_group, new_group):
        admin.broker.create_group(group, consume_from="earliest")
    send(admin, topic, 2)
    dead_letter(admin, old_group, topic)  # there before the monitor starts: not printed
    stuck, parked = (
        r.transaction_id
        for r in admin.broker.send(
            [
                OutgoingMessage(
                    topic=txn_topic, body=b"x", keys=[f"k{i}"],
                    message_type=MessageType.TRANSACTION,
                )
                for i in range(2)
            ]
        )
    )  # fmt: skip
    park(admin, parked)

    proc = subprocess.Popen(
        [
            sys.executable, "-m", "halfmoon", "monitor", "--admin", admin.url, "--json",
            "--interval", "50ms", "--stuck-after", "1ms", "--count", "3", "--duration", "60s",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = [read_event(proc), read_event(proc)]  # the first poll: transactions only
        by_kind = {e["event"]: e for e in first}
        assert by_kind["stuck-half"]["transaction_id"] == stuck
        assert by_kind["stuck-half"]["topic"] == txn_topic
        assert by_kind["stuck-half"]["keys"] == ["k0"]
        assert by_kind["parked"]["transaction_id"] == parked
        assert by_kind["parked"]["checks_sent"] == 15

        message_id = dead_letter(admin, new_group, topic)  # after the baseline: printed
        event = read_event(proc)
        assert event["event"] == "dead-letter"
        assert event["group"] == new_group
        assert event["topic"] == f"%DLQ%{new_group}"
        assert event["origin_message_id"] == message_id
        assert event["attempts"] == 1
        assert proc.wait(timeout=30) == 0  # --count 3 reached; nothing reported twice
        assert proc.stderr is not None and proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_monitor_human_lines_and_duration(admin):
    topic, txn_topic, group = unique("orders"), unique("txn"), unique("g")
    admin.broker.create_topic(topic, queue_count=1)
    admin.broker.create_topic(txn_topic, MessageType.TRANSACTION, 1)
    admin.broker.create_group(group, consume_from="earliest")
    send(admin, topic, 1)
    (half,) = admin.broker.send(
        [OutgoingMessage(topic=txn_topic, body=b"x", message_type=MessageType.TRANSACTION)]
    )
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "halfmoon", "monitor", "--admin", admin.url,
            "--interval", "50ms", "--stuck-after", "1ms", "--count", "2", "--duration", "60s",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        header = proc.stdout.readline()  # before any poll: the command is working
        assert header.startswith(f"watching {admin.url} every 0.05 s for dead letters")
        first = proc.stdout.readline()  # printed by the first poll, after the baseline
        assert " stuck-half " in first and f"transaction_id={half.transaction_id}" in first
        dead_letter(admin, group, topic)  # its DLQ topic is new: read from its first message
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        (line,) = out.splitlines()
        assert " dead-letter " in line
        assert f"group={group}" in line and "attempts=1" in line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    quiet = halfmoon(
        "monitor", "--interval", "20ms", "--stuck-after", "1h", "--duration", "100ms", admin=admin
    )
    # Nothing new happened: only the header, exit 0.
    assert ok(quiet).splitlines() == [
        f"watching {admin.url} every 0.02 s for dead letters, retries and half messages "
        "stuck over 3600 s (Ctrl-C stops)"
    ]


def deliver_again(admin: AdminServer, group: str, topic: str) -> str:
    """Receive a new message of ``topic`` for ``group``, make it visible at once and receive
    it again: it stays in flight at its second attempt. Its message id."""
    (first,) = admin.broker.receive(group, topic, FilterSpec("TAG", "*"), 1, 60_000)
    admin.broker.change_invisible_duration(group, topic, first.receipt_handle or "", 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for view in admin.broker.receive(group, topic, FilterSpec("TAG", "*"), 1, 60_000):
            assert view.message_id == first.message_id
            assert view.delivery_attempt == 2
            return view.message_id
        time.sleep(0.01)
    raise AssertionError(f"{first.message_id} was not delivered again within 10 s")


def test_monitor_prints_a_group_retrying_more_messages(admin):
    topic, txn_topic, group = unique("orders"), unique("txn"), unique("g")
    admin.broker.create_topic(topic, queue_count=1)
    admin.broker.create_topic(txn_topic, MessageType.TRANSACTION, 1)
    admin.broker.create_group(group, consume_from="earliest")
    send(admin, topic, 3)
    deliver_again(admin, group, topic)  # retrying before the monitor starts: the baseline
    (half,) = admin.broker.send(
        [OutgoingMessage(topic=txn_topic, body=b"x", message_type=MessageType.TRANSACTION)]
    )
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "halfmoon", "monitor", "--admin", admin.url, "--json",
            "--interval", "50ms", "--stuck-after", "1ms", "--count", "2", "--duration", "60s",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = read_event(proc)  # the first poll's: the retry already there is not news
        assert first["event"] == "stuck-half"
        assert first["transaction_id"] == half.transaction_id
        deliver_again(admin, group, topic)
        event = read_event(proc)
        assert event == {
            "event": "retrying",
            "group": group,
            "topic": topic,
            "queue_id": 0,
            "retrying": 2,
            "was": 1,
        }
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None and proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_clean_unused_is_for_a_cluster_only(admin):
    for args in (("--dry-run",), ()):
        result = failed(halfmoon("topic", "clean-unused", *args, admin=admin))
        assert "NOT_IN_CLUSTER" in result and "cluster mode only" in result


# -- cluster write-perm (wipeWritePerm / addWritePerm) -----------------------------------------


def test_write_perm_wipe_drains_the_broker_and_add_restores_it(admin):
    topic, group = unique("orders"), unique("g")
    admin.broker.create_topic(topic, queue_count=2)
    admin.broker.create_group(group, consume_from="earliest")
    send(admin, topic, 1)
    try:
        out = ok(halfmoon("cluster", "write-perm", "--wipe", admin=admin))
        assert out.startswith("the broker accepts no new messages")
        with pytest.raises(PermissionDenied, match="write permission was wiped"):
            send(admin, topic, 1)
        route = json.loads(ok(halfmoon("topic", "route", topic, "--json", admin=admin)))
        assert {q["perm"] for q in route["queues"]} == {"r"}  # producers look elsewhere
        # Draining: what is stored is still consumed and acknowledged.
        (view,) = admin.broker.receive(group, topic, FilterSpec("TAG", "*"), 8, 60_000)
        admin.broker.ack(group, topic, view.receipt_handle or "")
        refused = failed(
            halfmoon(
                "message", "send", topic, "--body", "x", admin=admin
            )
        )  # fmt: skip
        assert "FORBIDDEN" in refused
        shown = json.loads(
            ok(halfmoon("cluster", "config", "get", "broker.writable", "--json", admin=admin))
        )
        assert shown["value"] is False
    finally:
        ok(halfmoon("cluster", "write-perm", "--add", admin=admin))
    send(admin, topic, 1)
    route = json.loads(ok(halfmoon("topic", "route", topic, "--json", admin=admin)))
    assert {q["perm"] for q in route["queues"]} == {"rw"}
    failed(halfmoon("cluster", "write-perm", admin=admin), 2)  # --wipe or --add is required


# -- consumer clone-offset (cloneGroupOffset) ----------------------------------------------------


def test_clone_offset_moves_the_target_group_to_the_sources_offsets(admin):
    topic, other = unique("orders"), unique("other")
    admin.broker.create_topic(topic, queue_count=2)
    admin.broker.create_topic(other, queue_count=1)
    send(admin, topic, 5, queue_id=0)
    send(admin, topic, 3, queue_id=1)
    send(admin, other, 4, queue_id=0)
    source, target = unique("src"), unique("dst")
    for group in (source, target):
        admin.broker.create_group(group, consume_from="earliest")
    admin.broker.update_offset(source, topic, 0, 4)
    admin.broker.update_offset(source, topic, 1, 3)
    admin.broker.update_offset(source, other, 0, 2)

    answer = json.loads(
        ok(
            halfmoon(
                "consumer", "clone-offset", source, "--to", target, "--topic", topic, "--json",
                admin=admin,
            )
        )
    )  # fmt: skip
    assert [(q["topic"], q["queue_id"], q["offset"]) for q in answer["queues"]] == [
        (topic, 0, 4),
        (topic, 1, 3),
    ]
    progress = {
        (q.topic, q.queue_id): q.committed_offset for q in admin.broker.group_progress(target)
    }
    assert progress[(topic, 0)] == 4 and progress[(topic, 1)] == 3
    assert (other, 0) not in progress  # --topic limits the clone
    # The pop position moved too: the target's next delivery is the source's next message.
    views = admin.broker.receive(target, topic, FilterSpec("TAG", "*"), 8, 60_000)
    assert sorted((v.queue_id, v.queue_offset) for v in views) == [(0, 4)]

    rows = table(ok(halfmoon("consumer", "clone-offset", source, "--to", target, admin=admin)))
    assert rows[0][:3] == ["group", f"'{target}'", "now"]
    assert rows[2][:2] == ["TOPIC", "QUEUE"]
    assert sorted(r[:3] for r in rows[3:]) == sorted(
        [[other, "0", "2"], [topic, "0", "4"], [topic, "1", "3"]]
    )


def test_clone_offset_errors(admin):
    source = unique("src")
    admin.broker.create_group(source, consume_from="earliest")
    line = failed(halfmoon("consumer", "clone-offset", source, "--to", "nobody", admin=admin))
    assert "GROUP_NOT_FOUND" in line
    line = failed(halfmoon("consumer", "clone-offset", source, "--to", source, admin=admin))
    assert "clone into another group" in line
    empty = unique("dst")
    admin.broker.create_group(empty, consume_from="earliest")
    out = ok(halfmoon("consumer", "clone-offset", source, "--to", empty, admin=admin))
    assert out.strip() == f"group '{source}' has no offsets to clone"
