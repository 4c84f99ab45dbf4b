"""The exactly-once sink: a driver SIGKILLed after the broker committed a batch but before
Spark's commit log recorded it replays the batch on restart, and consumers still see every
row exactly once; the replay's own half messages are rolled back, never published.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from halfmoon.client import Message, SyncProducer
from halfmoon.spark.sink import FAILPOINT_ENV
from tests.server.conftest import ROOT, wait_until
from tests.spark.conftest import read_topic

DRIVER_TIMEOUT = 180


def _driver(server, checkpoint: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.sink_driver", server.grpc, "sink-in", "sink-out", str(checkpoint), "40"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


def test_driver_killed_between_broker_commit_and_checkpoint_writes_each_row_once(spark, server, tmp_path: Path) -> None:
    server.create_topic("sink-in", queues=2)
    server.create_topic("sink-out", message_type="transaction", queues=2)
    with SyncProducer(server.grpc) as producer:
        sent = producer.send_batch([Message("sink-in", f"row-{i}".encode()) for i in range(100)])
    checkpoint, failpoint = tmp_path / "checkpoint", tmp_path / "stopped-after-commit"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYSPARK_PYTHON=sys.executable)

    crashed = _driver(server, checkpoint, {**env, FAILPOINT_ENV: f"after-broker-commit={failpoint}"})
    try:
        wait_until(lambda: failpoint.exists() or crashed.poll() is not None, DRIVER_TIMEOUT, "the driver to reach the failpoint")
        assert failpoint.exists(), crashed.communicate()[0][-3000:]
        os.killpg(crashed.pid, signal.SIGKILL)
    finally:
        crashed.wait(30)

    # Batch 0 is committed on the broker, but Spark's commit log never heard of it.
    first = read_topic(spark, server, "sink-out")
    assert len(first) == 40
    assert not (checkpoint / "commits" / "0").exists()
    assert (checkpoint / "offsets" / "0").exists()

    restarted = _driver(server, checkpoint, env)
    output, _ = restarted.communicate(timeout=DRIVER_TIMEOUT)
    assert restarted.returncode == 0, output[-3000:]

    rows = read_topic(spark, server, "sink-out")
    bodies = sorted(r.body.decode() for r in rows)
    assert bodies == sorted(f"row-{i}" for i in range(100)), "a row is missing or written twice"
    assert sorted(r.keys[0] for r in rows) == sorted(r.message_id for r in sent)
    # The replay of batch 0 went into a new group that was rolled back, not left pending.
    pending = server.admin_call("GET", "/v1/transactions?topic=sink-out")[1]["transactions"]
    assert pending == []
