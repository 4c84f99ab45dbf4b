"""``x-single-active-consumer`` across the proxies of a real cluster, with pika: of two
consumers on two proxies only the first delivers, and when it goes the other takes over."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from tests.cluster.cluster_server import ClusterServer
from tests.cluster.test_cluster_amqp import PERSISTENT, connect

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path / "cluster").start()
    try:
        yield server
    finally:
        server.kill()


def pump(connections: list[pika.BlockingConnection], done: Callable[[], bool], what: str) -> None:
    """Run the connections' callbacks until ``done`` (a deadline: pika's blocking adapter
    delivers only while its connection processes events)."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for connection in connections:
            connection.process_data_events(time_limit=0.05)


def test_one_consumer_delivers_across_proxies_and_the_next_takes_over(
    cluster: ClusterServer,
) -> None:
    first, second, sender = (
        connect(p) for p in (cluster.proxies[0], cluster.proxies[1], cluster.proxies[0])
    )
    try:
        publishing = sender.channel()
        publishing.queue_declare("one-at-a-time", arguments={"x-single-active-consumer": True})
        publishing.confirm_delivery()

        def publish(first_n: int, count: int) -> None:
            for n in range(first_n, first_n + count):
                publishing.basic_publish("", "one-at-a-time", b"m%d" % n, PERSISTENT)

        got: dict[str, list[bytes]] = {"first": [], "second": []}

        def consume(connection: pika.BlockingConnection, who: str) -> None:
            connection.channel().basic_consume(
                "one-at-a-time",
                lambda _ch, _m, _p, body: got[who].append(body),
                auto_ack=True,
            )

        consume(first, "first")
        publish(0, 5)
        pump([first], lambda: len(got["first"]) == 5, "the first consumer's deliveries")
        consume(second, "second")  # on another proxy: it waits
        publish(5, 10)
        pump([first, second], lambda: len(got["first"]) == 15, "the rest, to the first")
        assert got["second"] == []
        first.close()  # the active consumer goes: the one on the other proxy takes over
        publish(15, 5)
        pump([second], lambda: len(got["second"]) == 5, "the second consumer's deliveries")
        assert got["first"] == [b"m%d" % n for n in range(15)]
        assert got["second"] == [b"m%d" % n for n in range(15, 20)]
    finally:
        for connection in (first, second, sender):
            if connection.is_open:
                connection.close()
