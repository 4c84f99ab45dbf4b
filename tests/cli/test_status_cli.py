"""``halfmoon status`` against a real ``halfmoon serve``: what the dashboard's Overview shows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from halfmoon.client import Message, TransactionProducer
from tests.cli.test_cli import ok
from tests.server.conftest import ServerProcess, unique, wait_until


def status(server: ServerProcess) -> dict:
    return json.loads(ok(server.cli("status", "--json")))


def test_status_counts_configured_queues_transactions_clients_and_disk(tmp_path: Path):
    server = ServerProcess(tmp_path / "data").start()
    try:
        before = status(server)
        assert before["queues"] == 0 and before["pending_transactions"] == 0
        assert before["disk_free_bytes"] > 0 and 0 <= before["disk_used_ratio"] <= 1
        server.create_topic(unique("empty"), queues=4)  # no message ever reaches it
        topic = unique("orders")
        server.create_topic(topic, message_type="transaction", queues=2)
        assert status(server)["queues"] == 6

        async def half_open() -> None:
            async with TransactionProducer(server.grpc, unique("pg")) as producer:
                transaction = producer.begin()
                await transaction.send(Message(topic, b"undecided"))
                now = await asyncio.to_thread(
                    wait_until,
                    lambda: (s := status(server))["producers"] >= 1 and s,
                    20,
                    "the producer in status",
                )
                assert now["pending_transactions"] == 1
                assert now["parked_transactions"] == 0
                assert now["clients"] >= 1
                human = ok(server.cli("status"))
                shown = dict(
                    (key.strip(), value.strip())
                    for key, _, value in (line.partition(":") for line in human.splitlines())
                )
                assert shown["pending transactions"] == "1"
                assert shown["queues"] == "6" and shown["disk free"]

        asyncio.run(asyncio.wait_for(half_open(), 60))
    finally:
        server.stop()
