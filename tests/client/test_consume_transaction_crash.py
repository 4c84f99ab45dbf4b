"""Consume-transform-produce exactly once, with workers and the broker SIGKILLed.

Workers (real processes, ``ctp_worker``) read topic A, send the transformed
message to B and ack the input in one transaction. The parent kills workers
at random moments (a new one replaces each) and kills the broker twice while
they run, then checks: every input has exactly one output, and every input
is acked (nothing comes back to the group). An input acked without its
output would be missing from B; an output committed without its ack would
bring its input back and give a second output.

``HALFMOON_CTP_MESSAGES`` sets the number of inputs (the issue's full run is
10,000; CI runs the default).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from halfmoon.client import Message, MessageView, Producer, PullConsumer
from tests.client.conftest import ServerProcess, unique
from tests.server.conftest import ROOT

pytestmark = pytest.mark.slow

MESSAGES = int(os.environ.get("HALFMOON_CTP_MESSAGES", "600"))
WORKERS = 2
BATCH = 10
SETTINGS = (
    "store.flush=sync",
    "broker.min_receive_invisible_ms=1s",
    "transaction.snapshot_interval_ms=200ms",
)


class Worker:
    def __init__(self, server: ServerProcess, names: tuple[str, str, str], seed: int) -> None:
        source, sink, group = names
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.client.ctp_worker", server.grpc, source, sink, group,
             str(BATCH), str(seed)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.commits = 0
        self.lines: collections.deque[str] = collections.deque(maxlen=50)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("C "):
                self.commits += 1

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def acked(server: ServerProcess, group: str, topic: str) -> tuple[int, int]:
    """(messages the group consumed, messages in flight) per the admin API."""
    code, body = server.admin_call("GET", f"/v1/groups/{group}/progress?topic={topic}")
    assert code == 200, body
    queues = body["queues"] if isinstance(body, dict) else body  # type: ignore[index]
    return (
        sum(q["committed_offset"] for q in queues),
        sum(q["inflight"] for q in queues),
    )


async def produce(server: ServerProcess, topic: str) -> None:
    async with Producer(server.grpc) as producer:
        for start in range(0, MESSAGES, 100):
            await producer.send_batch(
                [Message(topic, str(i).encode()) for i in range(start, min(start + 100, MESSAGES))]
            )


async def read_all(server: ServerProcess, topic: str) -> list[MessageView]:
    async with PullConsumer(server.grpc, unique("audit"), auto_commit=False) as reader:
        queues = await reader.fetch_queues(topic)
        await reader.assign(queues)
        for queue in queues:
            await reader.seek_to_beginning(queue)
        got: list[MessageView] = []
        idle = 0
        while idle < 3:
            batch = await reader.poll(0.5)
            got += batch
            idle = 0 if batch else idle + 1
        return got


def test_every_input_gives_exactly_one_output_across_kills(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("HALFMOON_CTP_SEED", "16")))
    server = ServerProcess(tmp_path / "data", settings=SETTINGS).start()
    workers: list[Worker] = []
    try:
        source, sink, group = unique("ctp-a"), unique("ctp-b"), unique("ctp-g")
        server.create_topic(source, queues=4)
        server.create_topic(sink, message_type="transaction", queues=4)
        server.create_group(group, max_delivery_attempts=1000)
        asyncio.run(produce(server, source))
        names = (source, sink, group)
        workers = [Worker(server, names, rng.randrange(10**6)) for _ in range(WORKERS)]
        kill_at = [MESSAGES // 3, 2 * MESSAGES // 3]
        worker_kills = broker_kills = 0
        deadline = time.monotonic() + max(240.0, MESSAGES * 0.06)
        next_worker_kill = time.monotonic() + rng.uniform(0.3, 2.0)
        while True:
            assert time.monotonic() < deadline, (
                f"not done in time: {acked(server, group, source)} of {MESSAGES}; "
                f"worker log: {list(workers[0].lines)[-10:]}"
            )
            consumed, inflight = acked(server, group, source)
            if consumed >= MESSAGES and inflight == 0:
                break
            if kill_at and consumed >= kill_at[0]:
                kill_at.pop(0)
                server.kill()  # SIGKILL mid-run, workers keep going against nothing
                time.sleep(rng.uniform(0.1, 0.5))
                server.start()
                broker_kills += 1
            if time.monotonic() >= next_worker_kill:
                victim = rng.randrange(len(workers))
                workers[victim].kill()
                workers[victim] = Worker(server, names, rng.randrange(10**6))
                worker_kills += 1
                next_worker_kill = time.monotonic() + rng.uniform(0.3, 2.0)
            time.sleep(0.1)
        assert broker_kills == 2 and worker_kills >= 2
        for worker in workers:
            worker.kill()

        outputs = asyncio.run(read_all(server, sink))
        counts = collections.Counter(m.body for m in outputs)
        expected = {f"out:{i}".encode() for i in range(MESSAGES)}
        assert set(counts) == expected, (
            f"missing outputs (acked without output): {sorted(expected - set(counts))[:10]}"
        )
        duplicates = {body: n for body, n in counts.items() if n > 1}
        assert not duplicates, (
            f"{len(duplicates)} outputs without their ack (given twice or more), e.g. "
            f"{sorted(duplicates.items())[:10]}"
        )
        # Nothing comes back to the group: every input is acked.
        consumed, inflight = acked(server, group, source)
        assert (consumed, inflight) == (MESSAGES, 0)
        print(
            f"\n{MESSAGES} inputs, {len(outputs)} outputs, {worker_kills} worker kills, "
            f"{broker_kills} broker kills"
        )
    finally:
        for worker in workers:
            worker.kill()
        server.kill()
