"""Consume-transform-produce through aio-pika in ``tx``, with the clients and the broker SIGKILLed.

Worker processes (``tests.amqp.ctp_worker``, aio-pika) read queue A and, in one
transaction per batch, publish each input's output to B and to C and ack the input.
The parent SIGKILLs a worker at random moments (a new one replaces it) and SIGKILLs
the broker (a real ``halfmoon serve``) twice while they run, then checks: every input
has exactly one output on B and exactly one on C, and every input is acked. An input
acked without its outputs would be missing from B and C; outputs committed without
the ack would bring the input back and give it a second pair.

``HALFMOON_AMQP_CTP_MESSAGES`` sets the number of inputs (the full run is 10,000; the
normal suite runs the default); ``HALFMOON_AMQP_CTP_SEED`` replays a run's draws.

A delivery unacked when a worker or the broker died goes back to A at once (the worker's
connection closing, or the broker's restart) and is taken again, redelivered.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest

from halfmoon.amqp.names import stored_name
from tests.amqp.test_tx_crash import connect
from tests.server.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.slow

MESSAGES = int(os.environ.get("HALFMOON_AMQP_CTP_MESSAGES", "300"))
WORKERS = 2
BATCH = 8


class Worker:
    def __init__(self, url: str, queues: tuple[str, str, str], seed: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.amqp.ctp_worker", url, *queues, str(BATCH), str(seed)],
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


def progress(server: ServerProcess, queue: str) -> tuple[int, int]:
    """(inputs the queue's group consumed, deliveries unacked) per the admin API."""
    stored = stored_name("", queue)
    code, body = server.admin_call("GET", f"/v1/groups/{stored}/progress?topic={stored}")
    assert code == 200, body
    queues = body["queues"] if isinstance(body, dict) else body  # type: ignore[index]
    return sum(q["committed_offset"] for q in queues), sum(q["inflight"] for q in queues)


def drain(url: str, queue: str, expected: int) -> list[bytes]:
    """Every message of ``queue`` (auto-ack): until none came for 3 s, or for 1 s once
    ``expected`` arrived (time enough for a duplicate to show)."""
    connection = connect(url)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)
        got: list[bytes] = []
        last = time.monotonic()
        for method, _props, body in channel.consume(queue, auto_ack=True, inactivity_timeout=1):
            if method is not None:
                got.append(body)
                last = time.monotonic()
            elif len(got) >= expected or time.monotonic() - last > 3:
                break
        return got
    finally:
        connection.close()


def test_every_input_gives_exactly_one_output_on_each_queue_across_kills(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("HALFMOON_AMQP_CTP_SEED", "26")))
    server = ServerProcess(
        tmp_path / "data",
        settings=("store.flush=sync",),
    ).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    workers: list[Worker] = []
    try:
        names = ("ctp.a", "ctp.b", "ctp.c")
        connection = connect(url)
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True)
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2)
        for i in range(MESSAGES):
            channel.basic_publish("", names[0], str(i).encode(), persistent)
        connection.close()

        workers = [Worker(url, names, rng.randrange(10**6)) for _ in range(WORKERS)]
        kill_at = [MESSAGES // 3, 2 * MESSAGES // 3]
        worker_kills = broker_kills = 0
        deadline = time.monotonic() + max(240.0, MESSAGES * 0.1)
        next_worker_kill = time.monotonic() + rng.uniform(0.3, 1.5)
        while True:
            consumed, inflight = progress(server, names[0])
            assert time.monotonic() < deadline, (
                f"not done in time: {consumed} of {MESSAGES} consumed, {inflight} unacked; "
                f"worker log: {list(workers[0].lines)[-10:]}"
            )
            if kill_at and consumed >= kill_at[0]:
                kill_at.pop(0)
                server.kill()  # SIGKILL mid-run; the workers keep trying against nothing
                time.sleep(rng.uniform(0.1, 0.5))
                server.start()
                broker_kills += 1
                continue
            if consumed >= MESSAGES and inflight == 0:
                break
            if time.monotonic() >= next_worker_kill:
                victim = rng.randrange(len(workers))
                workers[victim].kill()
                workers[victim] = Worker(url, names, rng.randrange(10**6))
                worker_kills += 1
                next_worker_kill = time.monotonic() + rng.uniform(0.3, 1.5)
            time.sleep(0.1)
        for worker in workers:
            worker.kill()
        assert broker_kills == 2 and worker_kills >= 2, (broker_kills, worker_kills)

        inputs = collections.Counter(str(i).encode() for i in range(MESSAGES))
        for prefix, name in ((b"b:", names[1]), (b"c:", names[2])):
            outputs = collections.Counter(
                body.removeprefix(prefix) for body in drain(url, name, MESSAGES)
            )
            missing = sorted(set(inputs) - set(outputs), key=int)
            assert not missing, f"{name}: inputs acked without their output: {missing[:10]}"
            twice = {body: n for body, n in outputs.items() if n > 1}
            assert not twice, f"{name}: outputs without their ack (given twice): {twice}"
            assert outputs == inputs
        # Nothing comes back to A: every input is acked, none is left unacked.
        assert progress(server, names[0]) == (MESSAGES, 0)
        print(
            f"\n{MESSAGES} inputs, one output each on B and C; {worker_kills} worker kills, "
            f"{broker_kills} broker kills, {sum(w.commits for w in workers)} commits by "
            "the last workers"
        )
    finally:
        for worker in workers:
            worker.kill()
        server.kill()
