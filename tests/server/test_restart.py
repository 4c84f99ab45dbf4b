"""Restarting ``halfmoon serve`` under live official clients loses nothing acknowledged.

A SIGTERM stops the server cleanly (exit 0); a SIGKILL under ``flush=sync``
is a crash. Either way, the same data directory brings back every message
whose send was answered OK, and a clean stop also keeps every ack.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Callable

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from tests.server.conftest import ServerProcess, wait_until


def _metric(server: ServerProcess, name: str) -> float:
    """One unlabelled sample from the admin API's Prometheus text (0 when absent)."""
    with urllib.request.urlopen(server.admin + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


pytestmark = pytest.mark.slow


def _send(producer: Producer, topic: str, bodies: list[str]) -> dict[str, str]:
    sent = {}
    for body in bodies:
        msg = Message()
        msg.topic = topic
        msg.body = body.encode()
        sent[producer.send(msg).message_id] = body
    return sent


def _send_after_restart(
    producer: Producer, topic: str, bodies: list[str], timeout: float = 30
) -> dict[str, str]:
    """Send each body, retrying while the client's channel is still backing off.

    The official client gives up after its own few attempts when a send lands
    while its channel is reconnecting; an application would retry. Only
    acknowledged sends are returned, so the test still checks every one.
    """
    sent = {}
    deadline = time.monotonic() + timeout
    for body in bodies:
        while True:
            try:
                sent.update(_send(producer, topic, [body]))
                break
            except Exception:  # noqa: BLE001 - UNAVAILABLE while reconnecting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return sent


def _receive(
    consumer: SimpleConsumer, want: int, timeout: float, ack: bool = True
) -> dict[str, str]:
    got: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        try:
            messages = consumer.receive(32, 15)
        except Exception:  # noqa: BLE001 - the server may still be coming back
            continue
        for m in messages:
            got[m.message_id] = m.body.decode()
            if ack:
                consumer.ack(m)
    return got


def _clients(server: ServerProcess, topic: str, group: str) -> tuple[Producer, SimpleConsumer]:
    cfg = ClientConfiguration(server.grpc, Credentials(), request_timeout=5)
    producer = Producer(cfg, (topic,))
    producer.startup()
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    return producer, consumer


def test_sigterm_restart_keeps_every_acknowledged_send_and_ack(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory().start()
    topic, group = "orders", "billing"
    server.create_topic(topic, "normal", queues=4)
    server.create_group(group)
    producer, consumer = _clients(server, topic, group)
    try:
        first = _send(producer, topic, [f"before-{i}" for i in range(20)])
        consumed_before = _receive(consumer, 10, timeout=10)
        assert len(consumed_before) >= 10

        assert server.stop() == 0, server.log_tail()
        assert any("event=stopped" in line for line in server.lines)
        server.start()  # same data directory, same ports: the clients reconnect by themselves

        second = _send_after_restart(producer, topic, [f"after-{i}" for i in range(5)])
        rest = _receive(consumer, len(first) + len(second) - len(consumed_before), timeout=20)
        # Every sent message arrives; nothing acknowledged before the restart comes back.
        assert set(consumed_before) | set(rest) == set(first) | set(second)
        assert not set(consumed_before) & set(rest)
    finally:
        consumer.shutdown()
        producer.shutdown()
        if server.alive():
            assert server.stop() == 0


def test_crash_with_sync_flush_keeps_every_acknowledged_send(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(settings=("store.flush=sync",)).start()
    topic, group = "payments", "ledger"
    server.create_topic(topic, "normal", queues=2)
    server.create_group(group)
    producer, consumer = _clients(server, topic, group)
    try:
        sent = _send(producer, topic, [f"p-{i}" for i in range(30)])
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        server.start()
        # At least once: un-snapshotted acks may come back, sent messages must.
        got = _receive(consumer, len(sent), timeout=20)
        assert got == sent
        assert any("crashed=True" in line for line in server.lines), (
            "recovery did not see the crash"
        )
    finally:
        consumer.shutdown()
        producer.shutdown()
        if server.alive():
            assert server.stop() == 0


def test_crash_with_sync_flush_delivers_no_acknowledged_ack_again(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """An ack answered OK under sync flush is in the commit log (``%HM_POP%``), not only in
    the consumption snapshot (made an hour apart here, so only the log can keep the acks):
    a SIGKILL right after the acks brings none of the 50 back; the 10 received and never
    acked come back."""
    server = server_factory(
        settings=("store.flush=sync", "broker.offset_persist_interval_ms=1h")
    ).start()
    topic, group = "invoices", "mailer"
    server.create_topic(topic, "normal", queues=2)
    server.create_group(group)
    producer, consumer = _clients(server, topic, group)
    try:
        sent = _send(producer, topic, [f"i-{i}" for i in range(60)])
        acked: dict[str, str] = {}
        unacked: dict[str, str] = {}
        deadline = time.monotonic() + 30
        while len(acked) + len(unacked) < len(sent) and time.monotonic() < deadline:
            for m in consumer.receive(min(32, len(sent) - len(acked) - len(unacked)), 30):
                if len(acked) < 50:
                    consumer.ack(m)  # answered OK, or it raises
                    acked[m.message_id] = m.body.decode()
                else:
                    unacked[m.message_id] = m.body.decode()
        assert len(acked) == 50 and len(unacked) == 10
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        server.start()
        # A restart forgets in-flight deliveries: the unacked ones come back at once.
        again = _receive(consumer, len(unacked), timeout=20)
        again.update(_receive(consumer, 1, timeout=3))  # and nothing else comes back
        assert set(again) == set(unacked), (
            f"{len(set(again) & set(acked))} acknowledged acks lost by the crash"
        )
        assert any("crashed=True" in line for line in server.lines)
    finally:
        consumer.shutdown()
        producer.shutdown()
        if server.alive():
            assert server.stop() == 0


def test_sigterm_answers_parked_long_polls_and_stops_promptly(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory().start()
    server.create_topic("idle", "normal", queues=1)
    server.create_group("waiters")
    cfg = ClientConfiguration(server.grpc, Credentials(), request_timeout=5)
    consumer = SimpleConsumer(cfg, "waiters", {"idle": FilterExpression()}, await_duration=20)
    consumer.startup()
    try:
        parked = consumer.receive_async(1, 15)
        wait_until(
            lambda: _metric(server, "halfmoon_grpc_long_polls") >= 1, 10, "the receive to park"
        )
        started = time.monotonic()
        assert server.stop() == 0
        stop_seconds = time.monotonic() - started
        # Well under the 20 s poll and the 5 s grace: parked polls are answered at once.
        assert stop_seconds < 3.0, f"stop took {stop_seconds:.1f}s"
        assert parked.result(timeout=10) == []
    finally:
        consumer.shutdown()
