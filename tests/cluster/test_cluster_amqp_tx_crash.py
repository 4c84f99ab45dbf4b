"""tx.commit through a cluster proxy is atomic across queues on two brokers and a SIGKILL.

Each transaction publishes message n to a queue held by broker-a and to one held by
broker-b (through proxy B), then commits. Each broker in turn is SIGKILLed at a random
moment of the loop, so a commit is cut before, during or after its group's decision,
and restarted. At the end (read through proxy A, once recovery has settled every group):
both queues hold the same messages, each once, and every transaction whose Commit-Ok the
client saw is among them. (A kill that fails a publish closes the connection with 541;
the Tx.Commit the client had already sent behind it must not commit the rest.)
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pika
import pika.exceptions
import pytest

from tests.cluster.cluster_server import ClusterProxy, ClusterServer
from tests.cluster.test_cluster_amqp import PERSISTENT, _queue_on
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

T = TypeVar("T")

LOOP_LIMIT_S = 90.0  # a round ends at its broker's kill, well before this


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path / "cluster").start()
    try:
        yield server
    finally:
        server.kill()


def _connect(proxy: ClusterProxy) -> pika.BlockingConnection:
    url = f"amqp://guest:guest@{proxy.amqp_address}/%2F?heartbeat=0&blocked_connection_timeout=60"
    return wait_until(
        lambda: _try(lambda: pika.BlockingConnection(pika.URLParameters(url))),
        timeout=60,
        what=f"a connection to {proxy.amqp_address}",
    )


def _try(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except (pika.exceptions.AMQPError, OSError):
        return None


def _close(connection: pika.BlockingConnection) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection.close()


def test_tx_commit_through_a_proxy_survives_each_broker_killed(cluster: ClusterServer) -> None:
    on_a, on_b = _queue_on("broker-a", "crash"), _queue_on("broker-b", "crash")
    setup = _connect(cluster.proxies[0])
    for name in (on_a, on_b):
        setup.channel().queue_declare(name, durable=True)
    _close(setup)

    committed: set[int] = set()
    n = 0
    for victim in cluster.brokers:
        publisher = _connect(cluster.proxies[1])
        channel = publisher.channel()
        channel.tx_select()
        killer = threading.Timer(random.uniform(0.3, 1.5), victim.kill)
        killer.start()
        ended = time.monotonic() + LOOP_LIMIT_S
        try:
            while time.monotonic() < ended:
                body = b"%d" % n
                channel.basic_publish("", on_a, body, PERSISTENT)
                channel.basic_publish("", on_b, body, PERSISTENT)
                n += 1
                channel.tx_commit()
                committed.add(n - 1)
        except (pika.exceptions.AMQPError, OSError):
            pass  # the commit the kill cut: applied everywhere or nowhere
        finally:
            killer.join()
        assert victim.process is not None and victim.process.poll() is not None
        _close(publisher)
        victim.start()
    assert len(committed) >= 2, "the kills came before any commit"

    seen: dict[str, Counter[bytes]] = {on_a: Counter(), on_b: Counter()}
    reader: list[pika.BlockingConnection] = []

    def settled() -> bool:
        if not reader:
            reader.append(_connect(cluster.proxies[0]))
        try:
            channel = reader[0].channel()
            for name, counts in seen.items():
                while True:
                    method, _, body = channel.basic_get(name, auto_ack=True)
                    if method is None:
                        break
                    counts[body] += 1
            channel.close()
        except (pika.exceptions.AMQPError, OSError):
            _close(reader.pop())
            return False
        wanted = {b"%d" % i for i in committed}
        return set(seen[on_a]) == set(seen[on_b]) and wanted <= set(seen[on_a])

    wait_until(settled, timeout=120, what="both queues to hold the same transactions")
    for counts in seen.values():
        assert max(counts.values()) == 1, counts.most_common(3)
    for connection in reader:
        _close(connection)
