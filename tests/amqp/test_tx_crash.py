"""tx.commit is atomic across queues and across a broker SIGKILL (a real ``halfmoon serve``).

A consume-transform-produce loop through pika: each transaction takes one input from A,
publishes an output to B and one to C, acks the input, commits. The broker is SIGKILLed
twice at a random point of a transaction (before, during or after its commit). After
each restart: every transaction the client saw committed has both outputs; no output
exists twice; B and C hold the same inputs; no input is both still in A and in B (an
ack never applied without its outputs, outputs never visible without the ack).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.server.conftest import ServerProcess

INPUTS = 60


QUIET_S = 3.0  # right after a restart the queues fill in as recovery redispatches them


def get(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, ack: bool):
    """Basic.Get, retried until the queue has been empty for ``QUIET_S``."""
    deadline = time.monotonic() + QUIET_S
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=ack)
        if method is not None or time.monotonic() > deadline:
            return method, body
        time.sleep(0.1)


def drain(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> list[bytes]:
    out = []
    while True:
        method, body = get(channel, queue, True)
        if method is None:
            return out
        out.append(body)


def connect(url: str) -> pika.BlockingConnection:
    deadline = time.monotonic() + 30
    while True:
        try:
            return pika.BlockingConnection(pika.URLParameters(url))
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_until_killed(server: ServerProcess, url: str, kill_after: int, seed: int) -> list[bytes]:
    """Transactions until the broker dies; the inputs whose Commit-Ok arrived."""
    rng = random.Random(seed)
    committed: list[bytes] = []
    conn = connect(url)
    ch = conn.channel()
    ch.tx_select()
    done = threading.Event()
    step = {"n": 0}

    def killer() -> None:
        while step["n"] < kill_after and not done.is_set():
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))  # somewhere inside the next transaction
        server.kill()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        while True:
            method, body = get(ch, "A", False)
            if method is None:
                break
            ch.basic_publish("", "B", body)
            ch.basic_publish("", "C", body)
            ch.basic_ack(method.delivery_tag)
            ch.tx_commit()
            committed.append(body)
            step["n"] += 1
    except (pika.exceptions.AMQPError, OSError):
        pass
    finally:
        done.set()
        thread.join(10)
    assert not server.alive()
    return committed


@pytest.mark.slow
def test_tx_commit_is_atomic_across_queues_and_broker_kills(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", settings=("store.flush=sync",)).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    try:
        conn = connect(url)
        ch = conn.channel()
        for q in ("A", "B", "C"):
            ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        inputs = [f"input-{i}".encode() for i in range(INPUTS)]
        for body in inputs:
            ch.basic_publish("", "A", body, pika.BasicProperties(delivery_mode=2))
        conn.close()

        committed: list[bytes] = []
        for round_no, kill_after in enumerate((10, 15)):
            committed += run_until_killed(server, url, kill_after, seed=round_no)
            server.start()
        conn = connect(url)
        ch = conn.channel()
        in_b, in_c, in_a = drain(ch, "B"), drain(ch, "C"), drain(ch, "A")
        conn.close()
        assert len(committed) >= 25
        assert Counter(in_b) == Counter(in_c), "B and C disagree: a commit applied in part"
        assert max(Counter(in_b).values()) == 1, "an output exists twice"
        assert set(committed) <= set(in_b), "a transaction answered Commit-Ok was lost"
        assert not set(in_a) & set(in_b), "an input has its outputs but was not acked"
        # Each input is in exactly one place: those the transaction under way at a kill held
        # unacked are back in A after the restart.
        missing = set(inputs) - set(in_a) - set(in_b)
        assert not missing, missing
    finally:
        if server.alive():
            server.stop()
