"""Stop signals: a signal to the whole process group drains like one to the process (serve,
broker, a proxy with two workers), copies of one request are one request, and only a second
request after the first was logged forces."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from halfmoon.shutdown_signals import REPEAT_WINDOW_S, SUPERVISOR_STOP, StopRequests
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.cluster_server import ClusterProxy, wait_until
from tests.cluster.etcd_server import EtcdServer
from tests.server.conftest import ServerProcess

# -- the policy, on a fake clock ---------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _requests() -> tuple[StopRequests, _Clock, list[str]]:
    clock = _Clock()
    calls: list[str] = []
    requests = StopRequests(
        lambda: calls.append("stop"), lambda: calls.append("force"), clock=clock
    )
    return requests, clock, calls


def test_a_repeat_within_the_window_is_the_same_request() -> None:
    requests, clock, calls = _requests()
    assert requests.received(signal.SIGTERM) == "shutdown"
    clock.now += 0.002  # GNU timeout: the child, then its group
    assert requests.received(signal.SIGTERM) == "none"
    assert calls == ["stop"]
    clock.now += REPEAT_WINDOW_S
    assert requests.received(signal.SIGINT) == "force"
    assert requests.received(signal.SIGINT) == "none"
    assert calls == ["stop", "force"]


def test_a_supervisors_copy_of_a_signal_already_had_does_not_count() -> None:
    requests, clock, calls = _requests()
    assert requests.received(signal.SIGTERM) == "shutdown"
    clock.now += 5  # however late the copy comes
    assert requests.received(SUPERVISOR_STOP) == "none"
    assert calls == ["stop"]
    assert requests.received(SUPERVISOR_STOP) == "force"  # the supervisor decided to force
    assert calls == ["stop", "force"]


def test_the_groups_signal_after_the_supervisors_copy_does_not_count() -> None:
    requests, clock, calls = _requests()
    assert requests.received(SUPERVISOR_STOP) == "shutdown"
    clock.now += 5
    assert requests.received(signal.SIGTERM) == "none"
    clock.now += 5
    assert requests.received(signal.SIGTERM) == "force"  # a second Ctrl-C on the group
    assert calls == ["stop", "force"]


# -- real processes ----------------------------------------------------------------------


def _exit_status(process_wait: Callable[[float], int], what: str, log: Callable[[], str]) -> int:
    try:
        return process_wait(30)
    except Exception as error:  # noqa: BLE001 - the log says why
        raise AssertionError(f"{what} did not stop: {error}\n{log()}") from None


def _assert_drained(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "action=shutdown" in text, text
    assert "event=shutdown_begin" in text, text
    assert "action=force" not in text, text
    assert "event=shutdown_forced" not in text, text


def _as_timeout_does(pid: int) -> None:
    """GNU ``timeout``'s way: the process, then at once its whole group."""
    os.kill(pid, signal.SIGTERM)
    os.killpg(pid, signal.SIGTERM)


def _hold_a_call(address: str) -> tuple[threading.Event, grpc.Future]:
    """A call in flight until the returned event is set: its request never completes, so
    a drain waits for it (up to ``shutdown_grace``)."""
    channel = grpc.insecure_channel(address)
    release = threading.Event()

    def never() -> Iterator[bytes]:
        release.wait(60)
        return
        yield b""

    method = channel.stream_unary(
        "/apache.rocketmq.v2.MessagingService/QueryRoute",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    held = method.future(never())
    # A call after it on the same connection, answered: the server has the held one too.
    probe = channel.unary_unary(
        "/apache.rocketmq.v2.MessagingService/QueryRoute",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    probe(b"", timeout=20)
    return release, held


def _force_after_report(pid: int, lines: list[str], what: str) -> None:
    """Signal the group once, wait until the process logged it, then signal again until it
    says it forces (a repeat inside the copy window is ignored, by design)."""
    os.killpg(pid, signal.SIGTERM)
    wait_until(lambda: any("action=shutdown" in line for line in lines), 20, f"{what} drains")

    def forced() -> bool:
        if any("action=force" in line for line in lines):
            return True
        os.killpg(pid, signal.SIGTERM)
        return False

    wait_until(forced, 20, f"{what} forces: " + "\n".join(lines[-15:]))


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data", settings=("server.shutdown_grace=30",))
    server.own_process_group = True
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_serve_drains_on_a_signal_to_its_process_and_its_group(serve: ServerProcess) -> None:
    assert serve.proc is not None
    _as_timeout_does(serve.proc.pid)
    assert _exit_status(serve.proc.wait, "serve", serve.log_tail) == 0
    _assert_drained(serve.lines)  # the kernel may have merged the two: either way, a drain


def test_serve_forces_on_a_second_signal_after_the_first_was_logged(
    serve: ServerProcess,
) -> None:
    assert serve.proc is not None
    release, call = _hold_a_call(serve.grpc)
    try:
        _force_after_report(serve.proc.pid, serve.lines, "serve")
        # well before the 30 s grace: the force skipped the wait for the held call
        assert _exit_status(serve.proc.wait, "serve", serve.log_tail) == 0
    finally:
        release.set()
    forced = [line for line in serve.lines if "event=shutdown_forced" in line]
    assert forced and "calls_cancelled=" in forced[0], serve.log_tail()  # says how much
    assert call.done()


def test_broker_drains_on_a_signal_to_its_process_and_its_group(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker", own_process_group=True).start()
    try:
        _as_timeout_does(broker.pid)
        assert broker.process is not None
        status = _exit_status(broker.process.wait, "broker", lambda: "".join(broker.output))
    finally:
        broker.kill()
    assert status == 0
    lines = [line.rstrip("\n") for line in broker.output]
    _assert_drained(lines)
    assert any("event=stopped" in line for line in lines)


@pytest.fixture
def proxy_with_workers(tmp_path: Path) -> Iterator[ClusterProxy]:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    broker = BrokerProcess(
        tmp_path / "broker", extra=("--cluster", "sig", "--coordinator", etcd.url)
    )
    proxy = ClusterProxy(
        tmp_path / "proxy", etcd, "sig", workers=2, settings=("server.shutdown_grace=30",)
    )
    proxy.own_process_group = True
    try:
        broker.start()
        proxy.start(60)
        # start() returns at the first worker's ready line: wait for the second one's too.
        wait_until(
            lambda: sum("halfmoon ready" in line for line in proxy.lines) >= 2, 60, "both workers"
        )
        yield proxy
    finally:
        proxy.kill()
        broker.stop()
        etcd.stop()


@pytest.mark.slow
def test_a_proxys_workers_drain_on_a_signal_to_the_group(
    proxy_with_workers: ClusterProxy,
) -> None:
    proxy = proxy_with_workers
    assert proxy.proc is not None
    os.killpg(proxy.proc.pid, signal.SIGTERM)  # the supervisor and both workers get it
    assert _exit_status(proxy.proc.wait, "proxy", proxy.log_tail) == 0, proxy.log_tail()
    _assert_drained(proxy.lines)
    shutdowns = [line for line in proxy.lines if "action=shutdown" in line]
    assert len(shutdowns) == 3, proxy.log_tail()  # the supervisor's and each worker's
    assert any("event=workers_stopped statuses=[0, 0]" in line for line in proxy.lines)


@pytest.mark.slow
def test_a_proxys_workers_force_on_a_second_signal_after_the_first_was_logged(
    proxy_with_workers: ClusterProxy,
) -> None:
    proxy = proxy_with_workers
    assert proxy.proc is not None
    release, _call = _hold_a_call(proxy.address)
    try:
        _force_after_report(proxy.proc.pid, proxy.lines, "proxy")
        assert _exit_status(proxy.proc.wait, "proxy", proxy.log_tail) == 0, proxy.log_tail()
    finally:
        release.set()
    forced = [line for line in proxy.lines if "event=shutdown_forced" in line]
    assert forced and "calls_cancelled=" in forced[0], proxy.log_tail()  # says how much
