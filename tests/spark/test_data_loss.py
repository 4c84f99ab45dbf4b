"""failOnDataLoss: when retention removed messages a read still needed, the read fails with the
count and offsets lost, or (failOnDataLoss=false) skips to the oldest kept message.

Runs the tasks' read code (``read_range``) directly: no Spark needed to test this decision.
"""

from __future__ import annotations

import pytest

from halfmoon.client import Message, SyncProducer
from halfmoon.spark.options import DataLossError, source_options
from halfmoon.spark.plan import QueueRange
from halfmoon.spark.source import read_range
from halfmoon.spark.wire import Wire
from tests.server.conftest import ServerProcess, wait_until


def test_removed_messages_fail_the_read_or_are_skipped(tmp_path) -> None:
    server = ServerProcess(
        tmp_path / "data",
        settings=(
            "store.segment_size=1MiB",
            "store.retention_hours=0.0002",
            "store.retention_check_interval=0.2",
        ),
    ).start()
    try:
        server.create_topic("short-lived", queues=1)
        with SyncProducer(server.grpc) as producer:
            for _ in range(6):
                producer.send_batch([Message("short-lived", b"x" * 60_000) for _ in range(8)])
        wire = Wire(server.grpc)
        queue = wire.queues("short-lived")[0]
        end = wire.query_offset(queue, "latest")
        earliest = wait_until(
            lambda: wire.query_offset(queue, "earliest"),
            30,
            "retention to remove the oldest segments",
        )
        assert 0 < earliest < end

        strict = source_options({"endpoint": server.grpc, "topic": "short-lived"}, streaming=False)
        with pytest.raises(
            DataLossError,
            match=r"\d+ messages of 'short-lived' queue 0 \(offsets 0 to \d+\) were removed",
        ):
            list(read_range(strict, QueueRange("short-lived", 0, 0, end)))

        lenient = source_options(
            {"endpoint": server.grpc, "topic": "short-lived", "failOnDataLoss": "false"},
            streaming=False,
        )
        batches = list(read_range(lenient, QueueRange("short-lived", 0, 0, end)))
        offsets = [o for b in batches for o in b.column("queue_offset").to_pylist()]
        assert offsets and offsets[0] >= earliest  # retention may have moved on meanwhile
        assert offsets == list(range(offsets[0], end))
    finally:
        server.stop()
