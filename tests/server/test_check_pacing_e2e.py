"""A producer that answers checks slowly, against a real server: nothing parked, everything
resolved.

Unpaced, the server would queue every due check on the producer's stream at
each scan; with answers slower than ``check_retry_ms`` the unanswered ones
are sent again and again and reach ``check_max``. Paced, the stream holds at
most ``max_outstanding_checks_per_producer`` unanswered checks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from halfmoon.client import Message, TransactionProducer, TransactionResolution
from tests.server.conftest import ServerProcess

ORPHANS = 150
CHECK_MAX = 3
CAP = 8
SETTINGS = (
    "transaction.timeout_ms=200ms",  # also the retry time
    "transaction.check_interval_ms=300ms",
    f"transaction.check_max={CHECK_MAX}",
    f"transaction.max_outstanding_checks_per_producer={CAP}",
)


class SlowCommitter:
    """Commits every transaction it is asked about, taking its time over each."""

    def __init__(self) -> None:
        self.checks = 0

    def execute_local_transaction(self, message, arg):
        return TransactionResolution.UNKNOWN

    async def check_local_transaction(self, message):
        self.checks += 1
        await asyncio.sleep(0.015)  # the producer's local lookup, ~60 answers/s with one worker
        return TransactionResolution.COMMIT


def transactions(server: ServerProcess, path: str) -> list[dict]:
    code, body = server.admin_call("GET", path)
    assert code == 200, body
    return body["transactions"]  # type: ignore[index]


def test_a_slow_producer_resolves_every_orphan_and_none_is_parked(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, settings=SETTINGS).start()
    try:
        topic = "slow-orders"
        server.create_topic(topic, message_type="transaction")
        listener = SlowCommitter()

        async def scenario() -> None:
            async with TransactionProducer(
                server.grpc, "slow-pg", listener, topics=[topic], check_workers=1
            ) as producer:
                for i in range(ORPHANS):
                    await producer.begin().send(
                        Message(topic, f"orphan-{i}".encode())
                    )  # never ended
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 40
                while loop.time() < deadline:
                    pending = await asyncio.to_thread(
                        transactions, server, f"/v1/transactions?topic={topic}"
                    )
                    if not pending:
                        break
                    assert not any(t["state"] == "parked" for t in pending), pending
                    await asyncio.sleep(0.2)

        asyncio.run(scenario())
        assert transactions(server, f"/v1/transactions?topic={topic}") == []
        assert transactions(server, "/v1/transactions/parked") == []
        code, status = server.admin_call("GET", f"/v1/topics/{topic}/status")
        assert code == 200
        committed = sum(int(q["max_offset"]) - int(q["min_offset"]) for q in status["queues"])  # type: ignore[index]
        assert committed == ORPHANS
        # Paced: few checks beyond one per transaction (a duplicate only after a stall of the
        # producer).
        assert ORPHANS <= listener.checks < ORPHANS * 2
    finally:
        server.stop()
