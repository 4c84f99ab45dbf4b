"""Unacked AMQP deliveries through the proxies of a real cluster (etcd, two brokers, two
proxies), with pika: a SIGKILLed proxy's go to another proxy's consumer as soon as its lease
ends, redelivered (as RabbitMQ requeues a dead connection's); brokers SIGKILLed and restarted
under a live proxy keep its deliveries with it, where its consumer still acks them, and a
consumer waits through its broker's restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.cluster.cluster_server import ClusterServer
from tests.cluster.test_cluster_amqp import PERSISTENT, connect
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MESSAGES = 10
HELD = 4  # the first consumer's prefetch: held unacked
# The proxies' lease TTL is 2 s here, the broker checks every second: released within ~3 s,
# but a loaded machine renews and answers late. The consumer timeout is 30 minutes.
RELEASED_WITHIN_S = 20.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path / "cluster").start()
    try:
        yield server
    finally:
        server.kill()


def published(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> None:
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for n in range(MESSAGES):
        channel.basic_publish("", queue, b"m%d" % n, PERSISTENT)


def held(
    channel: pika.adapters.blocking_connection.BlockingChannel, queue: str
) -> list[pika.spec.Basic.Deliver]:
    """The first ``HELD`` deliveries of ``queue``, left unacked on ``channel``."""
    channel.basic_qos(prefetch_count=HELD)
    got = []
    for method, _, body in channel.consume(queue, inactivity_timeout=30):
        assert method is not None, f"only {len(got)} of {HELD} deliveries arrived"
        assert body == b"m%d" % len(got)
        got.append(method)
        if len(got) == HELD:
            return got
    raise AssertionError("the consumer ended")


def taken(
    channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, count: int
) -> list[tuple[bytes, bool]]:
    """The next ``count`` deliveries of ``queue``, acked: (body, redelivered)."""
    got = []
    for method, _, body in channel.consume(queue, inactivity_timeout=RELEASED_WITHIN_S):
        assert method is not None, f"only {got} of {count} deliveries arrived"
        channel.basic_ack(method.delivery_tag)
        got.append((body, method.redelivered))
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_a_killed_proxys_unacked_deliveries_go_to_another_proxy_at_once(
    cluster: ClusterServer,
) -> None:
    victim = connect(cluster.proxies[0])
    published(victim.channel(), "held")
    held(victim.channel(), "held")
    cluster.kill_proxy(0)
    killed = time.monotonic()
    survivor = connect(cluster.proxies[1])
    try:
        got = taken(survivor.channel(), "held", MESSAGES)
        waited = time.monotonic() - killed
    finally:
        survivor.close()
    assert sorted(body for body, _ in got) == sorted(b"m%d" % n for n in range(MESSAGES))
    redelivered = {body for body, again in got if again}
    assert redelivered == {b"m%d" % n for n in range(HELD)}
    assert waited < RELEASED_WITHIN_S


def test_brokers_restarted_under_a_live_proxy_leave_its_deliveries_with_it(
    cluster: ClusterServer,
) -> None:
    holder = connect(cluster.proxies[0])
    other = connect(cluster.proxies[1])
    try:
        published(holder.channel(), "steady")
        holding = holder.channel()
        deliveries = held(holding, "steady")
        # A consumer of an empty queue, through the restarts: it waits for its broker.
        waiting = other.channel()
        waiting.queue_declare("later", durable=True)
        later = waiting.consume("later", inactivity_timeout=0.2)
        assert next(later) == (None, None, None)  # consuming, nothing there yet
        for broker in cluster.brokers:  # whichever holds the queue: both, one after the other
            broker.kill()
            broker.start()
        sender = holder.channel()
        sender.confirm_delivery()

        def sent() -> bool:  # nacked while the proxy has yet to reach the restarted broker
            try:
                sender.basic_publish("", "later", b"after", PERSISTENT)
            except pika.exceptions.NackError:
                return False
            return True

        wait_until(sent, timeout=30, what="a publish to be confirmed", interval=0.2)
        deadline = time.monotonic() + RELEASED_WITHIN_S
        method = body = None
        while method is None and time.monotonic() < deadline:
            method, _, body = next(later)
        assert body == b"after", "the consumer did not outlive its broker's restart"
        waiting.basic_ack(method.delivery_tag)
        # Another consumer gets the rest, never what the first one holds.
        rest = taken(other.channel(), "steady", MESSAGES - HELD)
        assert rest == [(b"m%d" % n, False) for n in range(HELD, MESSAGES)]
        # The holder's acks, made after the restart with the tags it had, take for good.
        holding.basic_ack(deliveries[-1].delivery_tag, multiple=True)
        probe = other.channel()

        def emptied() -> bool:
            declared = probe.queue_declare("steady", passive=True)
            return declared.method.message_count == 0

        wait_until(emptied, timeout=30, what="the queue to be empty", interval=0.2)
        # Closing the channel would return what it still held: nothing, the acks took.
        holding.close()
        assert probe.basic_get("steady", auto_ack=True) == (None, None, None)
    finally:
        holder.close()
        other.close()
