"""``halfmoon proxy`` in front of a broker process that is SIGKILLed and restarted, driven by the
official Python client (the scenarios that need no crash run through the proxy in
tests/server/test_official_python_client.py and test_conformance.py)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from tests.cluster.proxied_server import ProxiedServer
from tests.server.test_official_python_client import message, receive_all

pytestmark = pytest.mark.slow

WAIT_S = 30.0


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedServer]:
    server = ProxiedServer(tmp_path / "data").start()
    try:
        yield server
    finally:
        server.kill()


def test_a_sigkilled_broker_behind_the_proxy_loses_nothing_acknowledged(
    proxied: ProxiedServer,
) -> None:
    proxied.create_topic("orders", "normal", queues=4)
    proxied.create_group("billing")
    producer = Producer(ClientConfiguration(proxied.grpc, Credentials(), request_timeout=5))
    producer.startup()
    acknowledged: set[str] = set()
    bodies = (f"order-{n}" for n in itertools.count())
    try:
        for _ in range(30):
            acknowledged.add(producer.send(message("orders", next(bodies))).message_id)
        proxied.broker.kill()
        with pytest.raises(Exception):  # noqa: B017 - whatever the client makes of it
            producer.send(message("orders", "while the broker is down"))
        proxied.broker.start()  # same port, same data; the proxy was never restarted
        deadline = time.monotonic() + WAIT_S
        resumed = 0
        while resumed < 30 and time.monotonic() < deadline:
            try:
                acknowledged.add(producer.send(message("orders", next(bodies))).message_id)
                resumed += 1
            except Exception:  # noqa: BLE001 - until the proxy's connection is back
                time.sleep(0.1)
        assert resumed == 30, "sends through the proxy did not resume after the restart"
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(
        ClientConfiguration(proxied.grpc, Credentials(), request_timeout=5),
        "billing",
        {"orders": FilterExpression()},
        await_duration=2,
    )
    consumer.startup()
    try:
        received = {m.message_id for m in receive_all(consumer, len(acknowledged), WAIT_S)}
    finally:
        consumer.shutdown()
    assert acknowledged <= received
