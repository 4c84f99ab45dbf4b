"""The sink's commit protocol against a real server, without Spark: the failure cases of
docs/spark.md that the SIGKILL test does not reach.

- a run died after sending its marker but before committing it: the next run's commit
  commits both markers, the first one wins, and the next run's own rows are rolled back;
- a batch committed twice (a replay) publishes its rows once;
- aborting rolls a batch's rows back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from halfmoon.client import Message
from halfmoon.spark.sink import (
    MARKER_TOPIC,
    PROPERTY_DATA_GROUP,
    PROPERTY_MARKER,
    CommitProtocol,
    SinkOptions,
    marker_tag,
)
from halfmoon.spark.wire import Wire
from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("commit-protocol")).start()
    proc.create_topic(MARKER_TOPIC, message_type="transaction", queues=1)
    proc.create_topic("out", message_type="transaction", queues=2)
    try:
        yield proc
    finally:
        proc.stop()


def _bodies(wire: Wire) -> list[bytes]:
    out = []
    for queue in wire.queues("out"):
        offset, end = 0, wire.query_offset(queue, "latest")
        while offset < end:
            answer = wire.pull("test-reader", queue, offset, 1024)
            out += [m.body for m in answer.messages]
            offset = answer.next_offset
    return sorted(out)


def test_a_dead_runs_uncommitted_marker_wins_and_the_new_rows_are_rolled_back(server) -> None:
    wire = Wire(server.grpc)
    protocol = CommitProtocol(SinkOptions(server.grpc, "out", None, MARKER_TOPIC))
    # Run A wrote batch 0 and sent its marker, then died before committing the marker group.
    wire.send_halves([Message("out", f"a-{i}".encode()) for i in range(3)], "q1:0:runA")
    marker = {PROPERTY_MARKER: "q1:0", PROPERTY_DATA_GROUP: "q1:0:runA"}
    wire.send_halves(
        [
            Message(
                MARKER_TOPIC, json.dumps(marker).encode(), tag=marker_tag("q1:0"), properties=marker
            )
        ],
        "q1:0",
    )
    # Run B replays batch 0 and commits: both markers are committed; the first one wins.
    wire.send_halves([Message("out", f"b-{i}".encode()) for i in range(3)], "q1:0:runB")
    assert protocol.commit("q1", 0, "q1:0:runB", "out") == "q1:0:runA"
    assert _bodies(wire) == [b"a-0", b"a-1", b"a-2"]
    assert (
        server.admin_call("GET", "/v1/transactions?topic=out")[1]["transactions"] == []
    )  # run B's rows rolled back


def test_a_replayed_commit_publishes_once_and_abort_rolls_back(server) -> None:
    wire = Wire(server.grpc)
    protocol = CommitProtocol(SinkOptions(server.grpc, "out", None, MARKER_TOPIC))
    before = _bodies(wire)
    wire.send_halves([Message("out", b"once")], "q2:7:run1")
    assert protocol.commit("q2", 7, "q2:7:run1", "out") == "q2:7:run1"
    wire.send_halves([Message("out", b"replayed")], "q2:7:run2")
    assert protocol.commit("q2", 7, "q2:7:run2", "out") == "q2:7:run1"
    wire.send_halves([Message("out", b"aborted")], "q2:8:run2")
    protocol.abort("q2:8:run2", "out")
    assert _bodies(wire) == sorted([*before, b"once"])
