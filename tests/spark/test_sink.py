"""The exactly-once sink across a real SIGKILL of the driver's process group:

- after the broker committed a batch but before Spark's commit log recorded it: the restart
  replays the batch, consumers still see every row exactly once, and the replay's own half
  messages are rolled back, never published;
- before the commit point (tasks sent their half messages, no marker yet): the restart,
  given the ``admin`` option, rolls the dead run's data group back instead of leaving it
  pending, and every row is published once.

Run as ``python -m tests.spark.test_sink ENDPOINT ADMIN SOURCE TARGET CHECKPOINT LIMIT`` it
is the driver of the second test: ``tests.spark.sink_driver`` with the ``admin`` option.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from halfmoon.client import Message, SyncProducer
from halfmoon.failpoints import SPARK_SINK_ENV
from halfmoon.spark.sink import (
    MARKER_TOPIC,
    PROPERTY_DATA_GROUP,
    PROPERTY_MARKER,
    CommitProtocol,
    SinkOptions,
    marker_tag,
)
from halfmoon.spark.wire import Wire
from tests.server.conftest import ROOT, wait_until
from tests.spark.conftest import read_topic

DRIVER_TIMEOUT = 300  # a Spark driver's start takes minutes on a loaded 2-core machine


def _driver(
    server, checkpoint: Path, env: dict[str, str], *, admin: bool = False
) -> subprocess.Popen[str]:
    if admin:
        command = [
            "tests.spark.test_sink",
            server.grpc,
            server.admin,
            "orphan-in",
            "orphan-out",
            str(checkpoint),
            "40",
        ]
    else:
        command = [
            "tests.spark.sink_driver",
            server.grpc,
            "sink-in",
            "sink-out",
            str(checkpoint),
            "40",
        ]
    return subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_driver_killed_between_broker_commit_and_checkpoint_writes_each_row_once(
    spark, server, tmp_path: Path
) -> None:
    server.create_topic("sink-in", queues=2)
    server.create_topic("sink-out", message_type="transaction", queues=2)
    with SyncProducer(server.grpc) as producer:
        sent = producer.send_batch([Message("sink-in", f"row-{i}".encode()) for i in range(100)])
    checkpoint, failpoint = tmp_path / "checkpoint", tmp_path / "stopped-after-commit"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYSPARK_PYTHON=sys.executable)

    crashed = _driver(
        server, checkpoint, {**env, SPARK_SINK_ENV: f"after-broker-commit={failpoint}"}
    )
    try:
        wait_until(
            lambda: failpoint.exists() or crashed.poll() is not None,
            DRIVER_TIMEOUT,
            "the driver to reach the failpoint",
        )
        assert failpoint.exists(), crashed.communicate()[0][-3000:]
        # The commit runs in a PySpark worker, forked by a daemon in a process group of
        # its own: the kill of the driver's group does not reach it...
        committer = int(failpoint.read_text())
        assert os.getpgid(committer) != crashed.pid
        os.killpg(crashed.pid, signal.SIGKILL)
    finally:
        if crashed.poll() is None:  # the failpoint was not reached: do not leave it running
            os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(30)
    # ...its daemon kills it when the JVM's pipe closes.
    wait_until(
        lambda: _gone(committer), 30, "the commit runner to exit after the driver's JVM died"
    )

    # Batch 0 is committed on the broker, but Spark's commit log never heard of it.
    first = read_topic(spark, server, "sink-out")
    assert len(first) == 40
    assert not (checkpoint / "commits" / "0").exists()
    assert (checkpoint / "offsets" / "0").exists()

    restarted = _driver(server, checkpoint, env)
    output, _ = restarted.communicate(timeout=DRIVER_TIMEOUT)
    assert restarted.returncode == 0, output[-3000:]
    # The replay is in the driver's log, though Spark ran the commit in a Python worker.
    assert "event=spark_sink_replay" in output and " batch=0" in output, output[-3000:]
    assert re.search(r"event=spark_sink_commit \S+ batch=0 \S+ rows=40 replay=true", output), (
        output[-3000:]
    )

    rows = read_topic(spark, server, "sink-out")
    bodies = sorted(r.body.decode() for r in rows)
    assert bodies == sorted(f"row-{i}" for i in range(100)), "a row is missing or written twice"
    assert sorted(r.keys[0] for r in rows) == sorted(r.message_id for r in sent)
    # The replay of batch 0 went into a new group that was rolled back, not left pending.
    pending = server.admin_call("GET", "/v1/transactions?topic=sink-out")[1]["transactions"]
    assert pending == []


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not yet reaped by its daemon (which is gone too)


def _pending(server, topic: str) -> list[dict]:
    return server.admin_call("GET", f"/v1/transactions?topic={topic}")[1]["transactions"]


def test_driver_killed_before_the_commit_point_leaves_no_pending_group_after_restart(
    spark, server, tmp_path: Path
) -> None:
    server.create_topic("orphan-in", queues=2)
    server.create_topic("orphan-out", message_type="transaction", queues=2)
    with SyncProducer(server.grpc) as producer:
        producer.send_batch([Message("orphan-in", f"row-{i}".encode()) for i in range(100)])
    checkpoint, failpoint = tmp_path / "checkpoint", tmp_path / "stopped-before-marker"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYSPARK_PYTHON=sys.executable)

    crashed = _driver(
        server, checkpoint, {**env, SPARK_SINK_ENV: f"before-marker={failpoint}"}, admin=True
    )
    try:
        wait_until(
            lambda: failpoint.exists() or crashed.poll() is not None,
            DRIVER_TIMEOUT,
            "the driver to reach the failpoint",
        )
        assert failpoint.exists(), crashed.communicate()[0][-3000:]
        os.killpg(crashed.pid, signal.SIGKILL)
    finally:
        if crashed.poll() is None:  # the failpoint was not reached: do not leave it running
            os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(30)

    # Batch 0's rows are half messages of the dead run's group: pending, invisible.
    orphans = _pending(server, "orphan-out")
    assert len(orphans) == 40
    (dead_group,) = {t["transaction_group"] for t in orphans}
    assert dead_group.split(":")[1] == "0"
    assert read_topic(spark, server, "orphan-out") == []

    restarted = _driver(server, checkpoint, env, admin=True)
    output, _ = restarted.communicate(timeout=DRIVER_TIMEOUT)
    assert restarted.returncode == 0, output[-3000:]
    assert "event=spark_sink_orphan_rolled_back" in output and dead_group in output, output[-3000:]
    assert "replay=false orphans_rolled_back=1" in output, output[-3000:]

    assert _pending(server, "orphan-out") == [], f"{dead_group} was left pending"
    bodies = sorted(r.body.decode() for r in read_topic(spark, server, "orphan-out"))
    assert bodies == sorted(f"row-{i}" for i in range(100)), "a row is missing or written twice"


def test_the_sweep_rolls_back_only_other_runs_unnamed_groups_up_to_the_batch(server) -> None:
    server.create_topic("sweep-out", message_type="transaction", queues=2)
    wire = Wire(server.grpc)
    groups = {
        "named": "q9:0:1000s1",  # a dead run's batch 0 whose marker committed: the batch's output
        "orphan": "q9:0:1500s1",  # a dead run's batch 0 before its commit point
        "later": "q9:5:1500s4",  # a batch after the one committed: not Spark's to finish yet
        "current": "q9:0:2000s1",  # the committing application's own group
        "other-sink": "q8:0:1500s1",
    }
    for name, group in groups.items():
        wire.send_halves([Message("sweep-out", name.encode())], group)
    protocol = CommitProtocol(
        SinkOptions(server.grpc, "sweep-out", None, MARKER_TOPIC, server.admin)
    )
    # A run died between the commit point and committing its data group: q9:0's committed
    # marker names a group that is still pending.
    marker = {PROPERTY_MARKER: "q9:0", PROPERTY_DATA_GROUP: groups["named"]}
    wire.send_halves(
        [Message(MARKER_TOPIC, b"{}", tag=marker_tag("q9:0"), properties=marker)], "q9:0"
    )
    wire.end_group("q9:0", MARKER_TOPIC, commit=True)
    wire.send_halves([Message("sweep-out", b"run-b")], "q9:1:2000s2")

    assert protocol.commit("q9", 1, "q9:1:2000s2", "sweep-out") == "q9:1:2000s2"
    assert protocol.orphans_rolled_back == [groups["orphan"]]  # what the commit line counts

    left = {t["transaction_group"] for t in _pending(server, "sweep-out")}
    assert left == {groups["named"], groups["later"], groups["current"], groups["other-sink"]}
    assert [m.body for m in read_topic_bodies(server, "sweep-out")] == [b"run-b"]
    # The named group is still the batch's output: a replay of batch 0 commits it.
    assert protocol.commit("q9", 0, groups["current"], "sweep-out") == groups["named"]
    assert sorted(m.body for m in read_topic_bodies(server, "sweep-out")) == [b"named", b"run-b"]


def read_topic_bodies(server, topic: str) -> list:
    wire, out = Wire(server.grpc), []
    for queue in wire.queues(topic):
        offset, end = 0, wire.query_offset(queue, "latest")
        while offset < end:
            answer = wire.pull("sweep-reader", queue, offset, 1024)
            out += answer.messages
            offset = answer.next_offset
    return out


def _admin_driver(
    endpoint: str, admin: str, source: str, target: str, checkpoint: str, limit: str
) -> int:
    from halfmoon.spark import build_session

    spark = build_session("halfmoon-sink-driver", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    rows = (
        spark.readStream.format("halfmoon").option("endpoint", endpoint).option("topic", source)
        .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", limit).load()
    )  # fmt: skip
    query = (
        rows.selectExpr("body", "array(message_id) AS keys")
        .writeStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("admin", admin)
        .option("topic", target)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_admin_driver(*sys.argv[1:7]))
