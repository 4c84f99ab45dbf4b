"""A script that uses the synchronous clients and exits prints nothing alarming.

Python reports tasks left pending on the clients' background loop only as the
interpreter exits, so each case runs in a subprocess and its stderr is read.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.client.conftest import ServerProcess, unique
from tests.quiet_exit import alarming_lines, assert_quiet_exit
from tests.server.conftest import ROOT

PULL = """
import sys
from halfmoon.client import Message
from halfmoon.client.sync import SyncProducer, SyncPullConsumer

endpoint, topic, group = sys.argv[1:]
with SyncProducer(endpoint, topics=[topic]) as producer:
    producer.send(Message(topic, b"one"))
consumer = SyncPullConsumer(endpoint, group, consume_from="earliest")
consumer.start()
consumer.assign(consumer.fetch_queues(topic))
got = []
for _ in range(50):  # bounded: 50 polls of at most 1 s
    got += consumer.poll(1.0)
    if got:
        break
consumer.commit()
consumer.close()
print("pulled", len(got))
"""


def test_alarming_lines_finds_the_pending_task_warning() -> None:
    stderr = (
        "INFO event=relay_started\n"
        "Task was destroyed but it is pending!\n"
        "task: <Task pending name='Task-4' coro=<_consume_request_iterator()>>\n"
    )
    assert alarming_lines(stderr) == ["Task was destroyed but it is pending!"]
    with pytest.raises(AssertionError):
        assert_quiet_exit(stderr)


def test_sync_pull_consumer_closes_without_leaving_tasks(server: ServerProcess) -> None:
    topic, group = unique("quiet-pull"), unique("quiet-pull-group")
    server.create_topic(topic, queues=2)
    server.create_group(group)
    result = subprocess.run(
        [sys.executable, "-c", PULL, server.grpc, topic, group],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "pulled 1"
    assert_quiet_exit(result.stderr)
