"""The transaction timeout with real processes: a group nobody decides is rolled back by the
broker within its timeout plus a scan interval, whatever a crash lost, and the input it
received comes back (nothing lost).

A worker SIGKILLed between its first send and its first ack (a per-transaction timeout), and a
broker SIGKILLed after ``tx.send`` + ``tx.ack`` and before the commit (the broker's default,
``transaction.group_timeout_ms``, set short): ``halfmoon transaction list`` ends empty.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halfmoon.client import (
    ClientConfig,
    Message,
    MessageSelector,
    MessageView,
    SimpleConsumer,
    TransactionIncomplete,
    TransactionProducer,
    TransactionRolledBack,
)
from tests.client.conftest import ServerProcess, run, unique
from tests.server.conftest import ROOT

pytestmark = pytest.mark.slow

TIMEOUT_S = 4.0
SCAN_S = 1.0  # transaction.group_timeout_scan_ms's default
SETTINGS = ("store.flush=sync", "broker.min_receive_invisible_ms=1s")
INVISIBLE_S = 3


def start_server(tmp_path: Path, *settings: str) -> ServerProcess:
    return ServerProcess(
        tmp_path / "data",
        settings=(*SETTINGS, *settings),
    ).start()


def prepare(server: ServerProcess) -> tuple[str, str, str, str]:
    """Input and output topics, the workers' group, and a reader of the output that starts
    before anything is written (it would see the output if it ever appeared)."""
    source, sink, group, reader = unique("in"), unique("out"), unique("g"), unique("reader")
    server.create_topic(source, queues=1)
    server.create_topic(sink, message_type="transaction", queues=1)
    server.create_group(group)
    server.create_group(reader, consume_from="earliest")
    return source, sink, group, reader


def pending(server: ServerProcess) -> list[dict]:
    code, body = server.admin_call("GET", "/v1/transactions")
    assert code == 200, body
    rows = body["transactions"] if isinstance(body, dict) else body
    return list(rows)  # type: ignore[arg-type]


def wait_rolled_back(server: ServerProcess, since: float) -> float:
    """Seconds from ``since`` until no transaction is pending (polled)."""
    deadline = since + TIMEOUT_S + SCAN_S + 20  # generous: the machine may be loaded
    while pending(server):
        assert time.monotonic() < deadline, f"still pending: {pending(server)}"
        time.sleep(0.2)
    return time.monotonic() - since


def transaction_list(server: ServerProcess) -> list[object]:
    done = server.cli("transaction", "list", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    return list(listed["transactions"] if isinstance(listed, dict) else listed)


async def receive(
    server: ServerProcess, group: str, topic: str, want: int, within: float
) -> list[MessageView]:
    got: list[MessageView] = []
    async with SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while len(got) < want and loop.time() < deadline:
            for message in await consumer.receive(32, 30, wait=0.5):
                got.append(message)
                await consumer.ack(message)
    return got


async def send_input(server: ServerProcess, topic: str) -> None:
    async with TransactionProducer(server.grpc, unique("pg")) as producer:
        await producer.send(Message(topic, b"input"))


def test_a_worker_killed_between_send_and_ack_leaves_nothing_pending(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        source, sink, group, reader = prepare(server)
        run(send_input(server, source))
        worker = subprocess.Popen(
            [sys.executable, "-m", "tests.client.stalled_worker", server.grpc, source, sink,
             group, str(TIMEOUT_S)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            assert worker.stdout is not None
            line = worker.stdout.readline()
            assert line.strip() == "SENT", line + worker.stdout.read()
            sent = time.monotonic()
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
        finally:
            if worker.poll() is None:
                worker.kill()
        assert len(pending(server)) == 1  # the half message, undecided
        took = wait_rolled_back(server, sent)
        assert took >= TIMEOUT_S - 0.5, f"rolled back after {took:.1f}s, before its timeout"
        assert transaction_list(server) == []
        # The input was never acked: another worker gets it; the output never appears.
        again = run(receive(server, group, source, 1, within=INVISIBLE_S + 15))
        assert [m.body for m in again] == [b"input"]
        assert run(receive(server, reader, sink, 1, within=2)) == []
        assert any("event=transaction_group_timed_out" in line for line in server.lines)
    finally:
        if server.alive():
            server.stop()


def test_a_broker_killed_before_the_commit_rolls_the_group_back_after_restart(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path, f"transaction.group_timeout_ms={int(TIMEOUT_S * 1000)}")
    try:
        source, sink, group, reader = prepare(server)
        run(send_input(server, source))

        async def half_done() -> None:
            config = ClientConfig(server.grpc, request_timeout=2.0)
            async with (
                TransactionProducer(config, unique("pg")) as producer,
                SimpleConsumer(config, group, {source: MessageSelector.all()}) as consumer,
            ):
                received: list[MessageView] = []
                while not received:
                    received = await consumer.receive(1, INVISIBLE_S, wait=1)
                tx = consumer.transaction(producer)  # the broker's default timeout
                await tx.send(Message(sink, b"output"))
                await tx.ack(received[0])
                assert server.proc is not None
                server.proc.send_signal(signal.SIGKILL)
                server.proc.wait(10)
                server.start()
                restarted = time.monotonic()
                assert len(pending(server)) == 1  # recovered from the log, undecided
                # Its deadline came back from the half record: the broker decides alone.
                wait_rolled_back(server, restarted)
                with pytest.raises((TransactionRolledBack, TransactionIncomplete)):
                    for _ in range(50):  # until the client's channel is back
                        try:
                            await tx.commit()
                        except (TransactionRolledBack, TransactionIncomplete):
                            raise
                        except Exception:  # noqa: BLE001 - still reconnecting
                            await asyncio.sleep(0.2)
                assert tx.outcome == "rolled back"

        run(half_done(), timeout=120)
        assert transaction_list(server) == []
        again = run(receive(server, group, source, 1, within=INVISIBLE_S + 15))
        assert [m.body for m in again] == [b"input"]  # the acked input: not lost
        assert run(receive(server, reader, sink, 1, within=2)) == []
    finally:
        if server.alive():
            server.stop()
