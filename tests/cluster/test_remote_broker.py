"""``RemoteBroker`` against real ``halfmoon broker`` processes: crashes, versions, deadlines,
malformed requests, coalescing and the event streams (the facade contract itself runs in
tests/broker/test_facade_contract.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from halfmoon.broker import FakeClock, FilterSpec, MessageType, OutgoingMessage, TopicNotFound
from halfmoon.broker.transactions.check import CheckRequest
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.etcd_tls import PLAIN
from halfmoon.cluster.coordination.members import read_members
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.connection import SEND_TIMEOUT_S, BrokerConnection
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.internal.send.stream import StreamSender
from halfmoon.errors import HalfmoonError
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import EtcdServer

WAIT_S = 10.0
EVERYTHING = FilterSpec()


@pytest.fixture
def process(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data").start()
    yield broker
    broker.kill()


@pytest.fixture
def remote(process: BrokerProcess) -> Iterator[RemoteBroker]:
    client = RemoteBroker(process.address)
    yield client
    client.close()


def stored_bodies(broker: RemoteBroker, topic: str) -> list[bytes]:
    bodies: list[bytes] = []
    for route in broker.route(topic):
        offset = 0
        while True:
            pulled = broker.pull("audit", topic, route.queue_id, offset, 256, EVERYTHING)
            bodies += [m.body for m in pulled.messages]
            if not pulled.messages:
                break
            offset = pulled.next_offset
    return sorted(bodies)


def test_a_sigkilled_broker_restarts_and_the_remote_carries_on_losing_nothing_acknowledged(
    process: BrokerProcess, remote: RemoteBroker
) -> None:
    remote.create_topic("orders", queue_count=4)
    acknowledged: list[bytes] = []
    failed = 0
    stop = threading.Event()
    lock = threading.Condition()

    def produce(worker: int) -> None:
        nonlocal failed
        n = 0
        while not stop.is_set():
            body = f"{worker}-{n}".encode()
            n += 1
            try:
                remote.send([OutgoingMessage("orders", body)])
            except HalfmoonError:
                with lock:
                    failed += 1
                continue
            with lock:
                acknowledged.append(body)
                lock.notify_all()

    workers = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
    for worker in workers:
        worker.start()
    try:
        with lock:
            assert lock.wait_for(lambda: len(acknowledged) >= 200, WAIT_S * 3)
        process.kill()  # SIGKILL mid-stream: some sends in flight fail, none acknowledged is lost
        before_restart = len(acknowledged)
        process.start()  # same port, same data directory
        with lock:  # the same RemoteBroker reconnected
            assert lock.wait_for(lambda: len(acknowledged) >= before_restart + 200, WAIT_S * 3)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    stored = stored_bodies(remote, "orders")
    assert set(acknowledged) <= set(stored)
    assert len(set(stored)) == len(stored)  # nothing stored twice by a retry of ours


def test_a_peer_of_another_version_is_refused_with_a_stable_code(process: BrokerProcess) -> None:
    stranger = BrokerConnection(process.address, version_token="0:0000000000000000")
    try:
        with pytest.raises(wire.WireVersionMismatch) as info:
            stranger.hello()
        assert info.value.code == "WIRE_VERSION_MISMATCH" and "0:0000" in info.value.message
        with pytest.raises(wire.WireVersionMismatch):
            stranger.call("status")
    finally:
        stranger.close()
    remote = RemoteBroker(process.address)  # the right version is served
    assert remote.broker_name == "broker-a"
    remote.close()


def test_a_call_past_its_deadline_fails_with_a_deadline_error_and_the_next_one_works(
    process: BrokerProcess, remote: RemoteBroker
) -> None:
    process.pause()  # SIGSTOP: the broker answers nothing
    try:
        with pytest.raises(wire.BrokerDeadlineExceeded) as info:
            remote.connection.call("status", timeout_s=0.5)
        assert info.value.code == "BROKER_DEADLINE_EXCEEDED"
    finally:
        process.resume()
    assert remote.status().name == "broker-a"


# A proxy's sends reach the broker over its send listener, their one route.
@pytest.fixture
def send_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data").start()
    assert broker.send_port is not None
    yield broker
    broker.kill()


def test_a_silent_broker_fails_stream_sends_within_the_send_deadline_and_they_resume(
    send_process: BrokerProcess,
) -> None:
    process = send_process
    remote = RemoteBroker(process.address)
    try:
        _silent_broker_scenario(process, remote)
    finally:
        remote.close()


def _silent_broker_scenario(process: BrokerProcess, remote: RemoteBroker) -> None:
    remote.create_topic("silent", queue_count=1)

    def one(body: str) -> list[OutgoingMessage]:
        return [OutgoingMessage("silent", body.encode(), message_id=body)]

    async def scenario() -> tuple[float, float]:
        assert (await remote.send_async(one("before")))[0].message_id == "before"
        assert remote._sender().send_port == process.send_port  # the transport under test
        process.pause()  # SIGSTOP: the stream stays open, nothing is answered
        try:
            started = time.monotonic()
            with pytest.raises(wire.BrokerDeadlineExceeded):
                await remote.send_async(one("unknown"))  # the outcome is unknown
            silent_s = time.monotonic() - started
            assert remote.suspect()
            started = time.monotonic()
            with pytest.raises(wire.BrokerUnavailable):
                await remote.send_async(one("refused"))  # suspect: at once, not queued
            suspect_s = time.monotonic() - started
        finally:
            process.resume()
        deadline = time.monotonic() + WAIT_S
        while True:  # the stream was reset: a fresh one carries the next sends
            try:
                assert (await remote.send_async(one("after")))[0].message_id == "after"
                return silent_s, suspect_s
            except (wire.BrokerUnavailable, wire.BrokerDeadlineExceeded):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)  # a poll with a deadline

    silent_s, suspect_s = asyncio.run(scenario())
    assert silent_s <= SEND_TIMEOUT_S + 1
    assert suspect_s < 0.5
    assert {b"before", b"after"} <= set(stored_bodies(remote, "silent"))


def test_a_sigkilled_broker_restarts_and_stream_sends_resume_losing_nothing_acknowledged(
    send_process: BrokerProcess,
) -> None:
    process = send_process
    remote = RemoteBroker(process.address)
    remote.create_topic("orders", queue_count=2)
    acknowledged: list[bytes] = []

    async def produce(bodies: list[bytes]) -> None:
        for outcome, body in zip(
            await asyncio.gather(
                *(remote.send_async([OutgoingMessage("orders", b)]) for b in bodies),
                return_exceptions=True,
            ),
            bodies,
            strict=True,
        ):
            if not isinstance(outcome, BaseException):
                acknowledged.append(body)

    async def scenario() -> None:
        await produce([f"before-{i}".encode() for i in range(100)])
        assert len(acknowledged) == 100
        process.kill()
        with pytest.raises((wire.BrokerUnavailable, wire.BrokerDeadlineExceeded)):
            await remote.send_async([OutgoingMessage("orders", b"while down")])
        await asyncio.to_thread(process.start)  # same gRPC port; the listener's may differ
        deadline = time.monotonic() + WAIT_S
        while len(acknowledged) < 200:  # the proxy finds the broker (and its new port) again
            await produce([f"after-{len(acknowledged)}-{i}".encode() for i in range(20)])
            if time.monotonic() > deadline:
                raise AssertionError("stream sends did not resume after the restart")
            await asyncio.sleep(0.1)  # a poll with a deadline
        assert remote._sender().send_port == process.send_port

    try:
        asyncio.run(scenario())
        stored = stored_bodies(remote, "orders")
    finally:
        remote.close()
    assert set(acknowledged) <= set(stored)
    assert len(set(stored)) == len(stored)  # nothing stored twice by a retry of ours


@pytest.mark.parametrize(
    ("method", "request_bytes"),
    [
        ("Call", b"\xc1 not msgpack"),
        ("Call", wire.encode(["no_such_operation", [], {}])),
        ("Call", wire.encode(["__init__", [], {}])),
        ("Call", wire.encode(["status", [1, 2, 3], {}])),  # wrong arguments
        ("Call", wire.encode({"not": "a call"})),
    ],
)
def test_a_malformed_request_gets_an_error_and_the_broker_stays_up(
    remote: RemoteBroker, method: str, request_bytes: bytes
) -> None:
    answer = wire.decode(remote.connection.send_raw(method, request_bytes))
    assert isinstance(answer, wire.MalformedRequest)
    assert answer.code == "MALFORMED_REQUEST"
    assert remote.status().name == "broker-a"


def test_an_ill_typed_batch_fails_alone_and_nothing_of_it_is_stored(
    process: BrokerProcess, remote: RemoteBroker
) -> None:
    remote.create_topic("orders", queue_count=1)
    assert process.send_port is not None
    ill_typed = [
        [OutgoingMessage("orders", "text, not bytes")],  # type: ignore[arg-type]
        [OutgoingMessage("orders", b"x", properties={"k": 1})],  # type: ignore[dict-item]
        [OutgoingMessage("orders", b"x", queue_id=True)],
    ]

    async def one_request() -> tuple[list[object], int]:
        sender = StreamSender(
            remote.connection.target,
            remote.connection.metadata,
            send_port=process.send_port,  # type: ignore[arg-type]
            timeout_s=5,
        )
        try:  # sent in one loop turn: one request of four batches
            batches = [[OutgoingMessage("orders", b"good")], *ill_typed]
            answers = await asyncio.gather(
                *(sender.send(b) for b in batches), return_exceptions=True
            )
            return list(answers), sender.requests
        finally:
            await sender.close()

    answers, requests = asyncio.run(one_request())
    assert requests == 1
    assert [m.topic for m in answers[0]] == ["orders"]  # type: ignore[union-attr]
    assert all(isinstance(a, wire.MalformedRequest) for a in answers[1:])
    assert stored_bodies(remote, "orders") == [b"good"]


def test_concurrent_single_sends_are_coalesced_and_each_caller_gets_its_own_answer(
    process: BrokerProcess, remote: RemoteBroker
) -> None:
    remote.create_topic("orders", queue_count=4)

    def send_one(i: int) -> object:
        topic = "orders" if i % 10 else "missing"  # every tenth caller fails on its own
        try:
            return remote.send([OutgoingMessage(topic, str(i).encode(), message_id=f"id-{i}")])
        except TopicNotFound as error:
            return error

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(send_one, range(1_000)))
    for i, answer in enumerate(answers):
        if i % 10:
            assert isinstance(answer, list) and answer[0].message_id == f"id-{i}"
        else:
            assert isinstance(answer, TopicNotFound)
    # Off any event loop, the sends went the one route, from the remote's own send loop.
    assert remote._send_loop is not None
    sender = remote._senders[remote._send_loop.loop]
    assert sender.send_port == process.send_port
    assert sender.sends == 1_000
    assert sender.requests < sender.sends / 4  # coalesced, not one request per send
    assert len(stored_bodies(remote, "orders")) == 900


def test_arrivals_reach_listeners_of_another_connection(
    process: BrokerProcess, remote: RemoteBroker
) -> None:
    remote.create_topic("orders", queue_count=2)
    listener_side = RemoteBroker(process.address)
    heard: list[tuple[str, int]] = []
    arrived = threading.Event()

    def on_arrival(topic: str, queue_id: int) -> None:
        heard.append((topic, queue_id))
        arrived.set()

    try:
        listener_side.add_arrival_listener(on_arrival)
        remote.send([OutgoingMessage("orders", b"x", queue_id=1)])
        assert arrived.wait(WAIT_S)
        assert heard == [("orders", 1)]
    finally:
        listener_side.close()


def test_checks_and_lite_notices_are_pushed_to_the_connection_that_asked(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    process = BrokerProcess(tmp_path / "data", fake_clock_ms=clock.now_ms()).start()
    producer_side, checker_side = RemoteBroker(process.address), RemoteBroker(process.address)
    asked: list[CheckRequest] = []
    told: list[tuple[str, ...]] = []
    notified = threading.Event()

    def notify(*notice: str) -> None:
        told.append(notice)
        notified.set()

    class Sender:
        def send_checks(self, checks: list[CheckRequest]) -> list[bool]:
            asked.extend(checks)
            return [False] * len(checks)  # no live producer here: the broker must hear that

    try:
        checker_side.set_check_sender(Sender())
        checker_side.set_lite_unsubscribe_notifier(notify)
        producer_side.create_topic("payments", MessageType.TRANSACTION, queue_count=1)
        (half,) = producer_side.send(
            [
                OutgoingMessage(
                    "payments", b"h", message_type=MessageType.TRANSACTION, producer_group="pg"
                )
            ]
        )
        producer_side.connection.advance_clock(3_600_000)
        while producer_side.tick():
            pass
        assert [(c.transaction_id, c.topic, c.message.body) for c in asked] == [
            (half.transaction_id, "payments", b"h")
        ]
        assert producer_side.transaction_stats().checks_unsent_total >= 1

        producer_side.create_topic("chat", MessageType.LITE, queue_count=1)
        producer_side.create_group("bots")
        producer_side.send(
            [OutgoingMessage("chat", b"x", message_type=MessageType.LITE, lite_topic="s1")]
        )
        producer_side.sync_lite_subscription("client-1", "bots", "chat", "partial_add", ["s1"])
        assert producer_side.delete_lite_topic("chat", "s1") == 1
        assert notified.wait(WAIT_S)
        assert told == [("client-1", "bots", "chat", "s1")]
    finally:
        producer_side.close()
        checker_side.close()
        assert process.stop() == 0


def test_broker_command_wants_cluster_and_coordinator_together(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "halfmoon", "broker", "--data-dir", str(tmp_path), "--cluster", "c"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")},
    )
    assert result.returncode == 2
    assert "go together" in result.stderr


def test_a_broker_registers_in_etcd_with_its_internal_address_and_leaves_on_stop(
    tmp_path: Path, etcd: EtcdServer, cluster_name: str
) -> None:
    broker = BrokerProcess(
        tmp_path / "data", extra=("--cluster", cluster_name, "--coordinator", etcd.url)
    ).start()
    try:
        (member,) = read_members(parse_coordinator(etcd.url), cluster_name, tls=PLAIN)["brokers"]
        assert (member["name"], member["endpoint"]) == ("broker-a", broker.address)
        remote = RemoteBroker(member["endpoint"])  # reachable there
        assert remote.broker_name == "broker-a"
        remote.close()
    finally:
        assert broker.stop() == 0
    assert read_members(parse_coordinator(etcd.url), cluster_name, tls=PLAIN)["brokers"] == []


def test_the_event_stream_is_reopened_after_a_broker_restart(
    process: BrokerProcess, remote: RemoteBroker
) -> None:
    remote.create_topic("orders", queue_count=2)
    arrived = threading.Event()
    remote.add_arrival_listener(lambda topic, queue_id: arrived.set())
    process.kill()
    process.start()  # same port and data: the listener's stream must find it again
    deadline = time.monotonic() + WAIT_S
    while not arrived.is_set() and time.monotonic() < deadline:
        # Sent until heard: arrivals between the restart and the stream's reopening are
        # wake-ups nobody was subscribed to (long polls also wake on their own timeout).
        # A send while the channel reconnects fails at once (BROKER_UNAVAILABLE): again.
        with contextlib.suppress(HalfmoonError):
            remote.send([OutgoingMessage("orders", b"after restart", queue_id=0)])
        arrived.wait(0.2)
    assert arrived.is_set()


def test_a_standalone_cluster_brokers_answered_acks_survive_its_sigkill(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A cluster-mode broker outside a broker group journals its acks too (``%HM_POP%``):
    under sync flush an answered ack is durable, not only at the consumption snapshot
    (made an hour apart here). After a SIGKILL only the never-acked messages come back."""
    process = BrokerProcess(
        tmp_path / "data",
        name="solo",
        extra=(
            "--cluster", "acks-solo", "--coordinator", etcd.url, "--lease-ttl", "2",
            "--set", "broker.offset_persist_interval_ms=1h",
        ),
    ).start()  # fmt: skip
    remote = RemoteBroker(process.address, timeout_s=10)
    try:
        remote.create_topic("jobs", queue_count=2)
        remote.create_group("workers", consume_from="earliest")
        remote.send([OutgoingMessage("jobs", f"j-{i}".encode()) for i in range(60)])
        views = []
        deadline = time.monotonic() + WAIT_S
        while len(views) < 60 and time.monotonic() < deadline:
            views += remote.receive("workers", "jobs", EVERYTHING, 32, 60_000)
        assert len(views) == 60
        for view in views[:50]:
            remote.ack("workers", "jobs", view.receipt_handle)  # answered, or it raises
        process.kill()
        remote.close()
        process.start()
        remote = RemoteBroker(process.address, timeout_s=10)
        again: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while len(again) < 10 and time.monotonic() < deadline:
            again += [v.body for v in remote.receive("workers", "jobs", EVERYTHING, 32, 60_000)]
        again += [v.body for v in remote.receive("workers", "jobs", EVERYTHING, 32, 60_000)]
        assert sorted(again) == sorted(v.body for v in views[50:])
    finally:
        remote.close()
        process.kill()


def test_a_closed_remote_stops_its_send_loop_and_refuses_sends(process: BrokerProcess) -> None:
    remote = RemoteBroker(process.address)
    remote.create_topic("orders", queue_count=1)
    assert remote.send([OutgoingMessage("orders", b"before")])[0].message_id
    assert remote._send_loop is not None
    loop = remote._send_loop.loop
    remote.close()
    assert remote._send_loop is None and loop.is_closed()
    with pytest.raises(wire.BrokerUnavailable):
        remote.send([OutgoingMessage("orders", b"after close")])
