"""The broker's send listener against a real ``halfmoon broker`` process: the handshake, bad
input on raw sockets, and a proxy's sends over it (their crash and silence cases run for both
transports in test_remote_broker.py and test_proxy.py, TLS in test_cluster_tls.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from halfmoon.broker import OutgoingMessage, TopicExists, TopicNotFound
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.internal.send.frames import HEADER, MAX_FRAME_BYTES, frame
from halfmoon.cluster.internal.send.stream import StreamSender
from tests.cluster.broker_processes import BrokerProcess

WAIT_S = 10.0


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("send-listener") / "data").start()
    yield broker
    broker.kill()


def _connect(process: BrokerProcess) -> socket.socket:
    assert process.send_port is not None
    sock = socket.create_connection(("127.0.0.1", process.send_port), timeout=WAIT_S)
    return sock


def _read_frame(sock: socket.socket) -> Any:
    header = _read_exactly(sock, HEADER.size)
    (size,) = HEADER.unpack(header)
    return wire.decode(_read_exactly(sock, size))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _closed(sock: socket.socket) -> bool:
    """Whether the broker closed the connection (reads end) within WAIT_S."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _hello(version: str | None = None) -> bytes:
    return frame(wire.encode({"version": version or wire.version_token(), "peer": "test"}))


def _sends_still_work(process: BrokerProcess) -> None:
    remote = RemoteBroker(process.address)
    try:
        with contextlib.suppress(TopicExists):  # the module's broker is shared
            remote.create_topic("alive", queue_count=1)

        async def one() -> str:
            sent = await remote.send_async([OutgoingMessage("alive", b"x", message_id="ok")])
            assert remote._sender().send_port == process.send_port
            return sent[0].message_id

        assert asyncio.run(one()) == "ok"
    finally:
        remote.close()


def test_the_hello_is_answered_with_the_broker_and_its_send_port(process: BrokerProcess) -> None:
    remote = RemoteBroker(process.address)
    try:
        answer = remote.connection.hello()
    finally:
        remote.close()
    assert answer["send_port"] == process.send_port
    with _connect(process) as sock:
        sock.sendall(_hello())
        assert _read_frame(sock) == {
            "broker": "broker-a",
            "version": wire.version_token(),
            "send_port": process.send_port,
        }


def test_a_peer_of_another_version_is_refused_with_a_stable_code_and_closed(
    process: BrokerProcess,
) -> None:
    with _connect(process) as sock:
        sock.sendall(_hello("0:0000000000000000"))
        answer = _read_frame(sock)
        assert isinstance(answer, wire.WireVersionMismatch)
        assert answer.code == "WIRE_VERSION_MISMATCH" and "0:0000" in answer.message
        assert _closed(sock)

    async def send_as_stranger() -> None:
        remote = RemoteBroker(process.address)
        metadata = tuple(
            (k, "0:0000000000000000" if k == wire.VERSION_HEADER else v)
            for k, v in remote.connection.metadata
        )
        sender = StreamSender(
            remote.connection.target, metadata, timeout_s=5, send_port=process.send_port
        )
        try:
            with pytest.raises(wire.WireVersionMismatch):
                await sender.send([OutgoingMessage("alive", b"never")])
        finally:
            await sender.close()
            remote.close()

    asyncio.run(send_as_stranger())


@pytest.mark.parametrize(
    argnames=("name", "data"),
    ids=lambda value: value if isinstance(value, str) else "",
    argvalues=[
        ("a hello that is not msgpack", frame(b"\xc1 not msgpack")),
        ("a hello that is not a map", frame(wire.encode(["version"]))),
        ("a frame too large", HEADER.pack(MAX_FRAME_BYTES + 1)),
        ("a request that is not msgpack", _hello() + frame(b"\xc1 junk")),
        ("a request of the wrong shape", _hello() + frame(wire.encode({"not": "a request"}))),
        ("a request with a bad timeout", _hello() + frame(wire.encode([1, -5, []]))),
        ("a frame cut short", _hello() + HEADER.pack(100) + b"short"),
    ],
)
def test_bad_input_closes_that_connection_and_the_broker_serves_on(
    process: BrokerProcess, name: str, data: bytes
) -> None:
    with _connect(process) as sock:
        sock.sendall(data)
        if name == "a frame cut short":
            sock.shutdown(socket.SHUT_WR)  # the peer stops mid-frame
        frames: list[Any] = []
        while True:
            try:
                frames.append(_read_frame(sock))
            except (ConnectionError, wire.MalformedRequest):
                break
        refusals = [f for f in frames if isinstance(f, list) and f[0] is None]
        if "request" in name or "too large" in name:
            assert refusals and isinstance(refusals[0][1], wire.MalformedRequest), frames
            assert refusals[0][1].code == "MALFORMED_REQUEST"
        if "too large" in name:
            assert "exceeds the limit" in refusals[0][1].message
    assert process.process is not None and process.process.poll() is None
    _sends_still_work(process)


def test_concurrent_stream_sends_share_requests_and_each_caller_gets_its_own_answer(
    process: BrokerProcess,
) -> None:
    remote = RemoteBroker(process.address)
    remote.create_topic("orders", queue_count=4)

    async def send_one(i: int) -> object:
        topic = "orders" if i % 10 else "missing"  # every tenth caller fails on its own
        try:
            return await remote.send_async(
                [OutgoingMessage(topic, str(i).encode(), message_id=f"id-{i}")]
            )
        except TopicNotFound as error:
            return error

    async def scenario() -> tuple[list[object], StreamSender]:
        answers = list(await asyncio.gather(*(send_one(i) for i in range(500))))
        return answers, remote._sender()  # the one of this loop, which carried them

    try:
        answers, sender = asyncio.run(scenario())
        assert sender.send_port == process.send_port
        assert sender.sends == 500 and sender.requests < 500 / 4  # coalesced
    finally:
        remote.close()
    for i, answer in enumerate(answers):
        if i % 10:
            assert isinstance(answer, list) and answer[0].message_id == f"id-{i}"
        else:
            assert isinstance(answer, TopicNotFound)


def test_a_request_larger_than_a_frame_fails_its_callers_with_a_clear_error(
    process: BrokerProcess,
) -> None:
    remote = RemoteBroker(process.address)

    async def scenario() -> None:
        sender = StreamSender(
            remote.connection.target,
            remote.connection.metadata,
            timeout_s=5,
            send_port=process.send_port,
            max_bytes=2 * MAX_FRAME_BYTES,
        )
        try:
            with pytest.raises(wire.MalformedRequest, match="exceeds the internal frame limit"):
                await sender.send([OutgoingMessage("orders", bytes(MAX_FRAME_BYTES + 1))])
            assert sender.requests == 0  # refused before anything was sent
        finally:
            await sender.close()

    try:
        asyncio.run(scenario())
    finally:
        remote.close()
