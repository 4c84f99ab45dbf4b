"""Connection.Blocked / Unblocked on the disk alarm, through pika.

Against a real ``halfmoon serve`` whose limit makes this machine's disk count as full
(nothing is filled): the capability is advertised and a publisher is blocked at its
first publish while a consumer's connection is not. In process, with the free space
under the test's control: a blocked connection is not read, and once the space is back
it gets Unblocked and the publish it sent meanwhile is stored and confirmed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from halfmoon.amqp import AmqpServer
from halfmoon.amqp.connection import SERVER_PROPERTIES
from halfmoon.broker.broker import Broker
from halfmoon.config import Config
from halfmoon.listen import listening_socket
from halfmoon.store.store import MessageStore
from tests.server.conftest import ServerProcess
from tests.waiting import wait_until

EVERY_DISK = 10**18  # bytes: more than any disk has free


def test_the_capability_is_advertised() -> None:
    assert SERVER_PROPERTIES["capabilities"]["connection.blocked"] is True  # type: ignore[index]


@pytest.fixture
def full_disk_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path / "data",
        settings=(
            "server.amqp_listen=127.0.0.1:0",
            f"server.amqp_disk_free_limit_bytes={EVERY_DISK}",
        ),
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _connect(address: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@{address}/%2F"))


def test_a_publisher_is_blocked_when_the_disk_counts_as_full(
    full_disk_server: ServerProcess,
) -> None:
    consumer = _connect(full_disk_server.amqp_address)
    publisher = _connect(full_disk_server.amqp_address)
    try:
        blocked: list[object] = []
        publisher.add_on_connection_blocked_callback(lambda _, frame: blocked.append(frame))
        consuming = consumer.channel()
        consuming.queue_declare("work")  # a connection that does not publish is served
        publishing = publisher.channel()
        publishing.basic_publish("", "work", b"first")

        def told() -> bool:
            publisher.process_data_events(time_limit=0.1)
            return bool(blocked)

        wait_until(told, timeout=30, what="Connection.Blocked")
        assert blocked[0].method.reason == "low on disk"  # type: ignore[attr-defined]
        # The publish that met the alarm is handled; a connection that only consumes is
        # still served.
        method, _, body = wait_until(
            lambda: (got := consuming.basic_get("work", auto_ack=True))[0] and got,
            timeout=30,
            what="the first message",
        )
        assert body == b"first"
        assert "event=amqp_disk_alarm set" in "\n".join(full_disk_server.lines)
    finally:
        consumer.close()
        # The publisher's socket is not read: its Close would wait for an answer.
        publisher._impl._transport._sock.close()  # type: ignore[attr-defined]


class InProcess:
    """An AmqpServer on its own loop in a thread, over an in-process broker, with the free
    space a test sets."""

    def __init__(self, data_dir: Path) -> None:
        config = Config()
        self.store = MessageStore(dataclasses.replace(config.store, data_dir=data_dir))
        self.broker = Broker(self.store, data_dir / "metadata", config.broker)
        self.free: int = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: AmqpServer = self.call(self._start())
        self.address = f"127.0.0.1:{self.port}"

    async def _start(self) -> AmqpServer:
        server = AmqpServer(
            self.broker, None, free_bytes=lambda: self.free, disk_free_limit_bytes=1000
        )
        sock = listening_socket("127.0.0.1", 0)
        self.port = await server.start(sock)
        return server

    def call(self, coroutine: object) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)  # type: ignore[arg-type]

    def set_free(self, free: int) -> None:
        self.free = free
        self.call(self.server.disk_alarm.check())

    def reading(self) -> list[bool]:
        async def states() -> list[bool]:
            return [c._transport.is_reading() for c in self.server.connections]  # type: ignore[attr-defined]

        return self.call(states())  # type: ignore[return-value]

    def close(self) -> None:
        self.call(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.broker.close()
        self.store.close()


@pytest.fixture
def in_process(tmp_path: Path) -> Iterator[InProcess]:
    server = InProcess(tmp_path)
    try:
        yield server
    finally:
        server.close()


def test_blocked_until_the_disk_recovers_then_unblocked_and_nothing_lost(
    in_process: InProcess,
) -> None:
    in_process.set_free(10)  # below the limit of 1000
    publisher = _connect(in_process.address)
    try:
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
        publisher.add_on_connection_unblocked_callback(lambda *_: events.append("unblocked"))
        channel = publisher.channel()
        channel.queue_declare("q")
        assert in_process.reading() == [True]  # declaring is not publishing
        channel.basic_publish("", "q", b"one")

        def until(event: str) -> bool:
            publisher.process_data_events(time_limit=0.1)
            return event in events

        wait_until(lambda: until("blocked"), timeout=30, what="Connection.Blocked")
        assert in_process.reading() == [False]  # the server reads nothing more from it
        channel.basic_publish("", "q", b"two")  # sent, waits in the socket

        in_process.set_free(10_000)
        wait_until(lambda: until("unblocked"), timeout=30, what="Connection.Unblocked")
        assert events == ["blocked", "unblocked"]
        assert in_process.reading() == [True]
        got = []
        for method, _, body in channel.consume("q", inactivity_timeout=30):
            assert method is not None, got
            got.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(got) == 2:
                break
        channel.cancel()
        assert got == [b"one", b"two"]
    finally:
        publisher.close()
