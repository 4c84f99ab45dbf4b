"""Dead-lettering on reject is atomic across a broker SIGKILL (a real ``halfmoon serve``).

A pika client takes each message of S (dead-letter exchange: D's fanout) with Basic.Get
and rejects it without requeue; the broker is SIGKILLed twice at a random point among the
rejects. After each restart: no message is both in S and in D (a copy never exists
without its original's removal), no copy exists twice, every reject the server had
answered past (a later Basic.Get was answered, and a channel handles its methods in
order) is in D, and each input is in S or D (the delivery taken when the broker died,
unacked, is back in S after the restart).
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

from tests.amqp.test_tx_crash import connect, drain, get
from tests.server.conftest import ServerProcess

INPUTS = 80


def reject_until_killed(server: ServerProcess, url: str, kill_after: int, seed: int) -> list[bytes]:
    """Rejects until the broker dies; the inputs whose reject was surely applied."""
    rng = random.Random(seed)
    applied: list[bytes] = []
    conn = connect(url)
    ch = conn.channel()
    done = threading.Event()
    step = {"n": 0}

    def killer() -> None:
        while step["n"] < kill_after and not done.is_set():
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.03))
        server.kill()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    previous: bytes | None = None
    try:
        while True:
            method, body = get(ch, "S", False)
            if previous is not None:
                applied.append(previous)  # answered after the previous reject
            if method is None:
                break
            ch.basic_reject(method.delivery_tag, requeue=False)
            previous = body
            step["n"] += 1
    except (pika.exceptions.AMQPError, OSError):
        pass
    finally:
        done.set()
        thread.join(10)
    assert not server.alive()
    return applied


@pytest.mark.slow
def test_reject_dead_letters_exactly_once_across_broker_kills(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", settings=("store.flush=sync",)).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    try:
        conn = connect(url)
        ch = conn.channel()
        ch.exchange_declare("dlx", "fanout", durable=True)
        ch.queue_declare("D", durable=True)
        ch.queue_bind("D", "dlx")
        ch.queue_declare("S", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
        ch.confirm_delivery()
        inputs = [f"input-{i}".encode() for i in range(INPUTS)]
        for body in inputs:
            ch.basic_publish("", "S", body, pika.BasicProperties(delivery_mode=2))
        conn.close()

        applied: list[bytes] = []
        for round_no, kill_after in enumerate((15, 20)):
            applied += reject_until_killed(server, url, kill_after, seed=round_no)
            server.start()
        conn = connect(url)
        ch = conn.channel()
        in_d, in_s = drain(ch, "D"), drain(ch, "S")
        conn.close()
        assert len(applied) >= 30
        assert max(Counter(in_d).values()) == 1, "a message was dead-lettered twice"
        assert not set(in_s) & set(in_d), "a message is in its queue and dead-lettered"
        assert set(applied) <= set(in_d), "an applied reject lost its message"
        # The delivery taken (unacked) when the broker died is back in S after the restart.
        missing = set(inputs) - set(in_s) - set(in_d)
        assert not missing, missing
    finally:
        if server.alive():
            server.stop()
