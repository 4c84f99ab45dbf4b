"""``BrokerConnection`` closed while calls wait for a broker that is gone (a proxy closes its
connection to a group's dead master at every failover, with sends still waiting on it), and
reaching a broker again after it restarted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from halfmoon.cluster.internal.connection import BrokerConnection
from halfmoon.errors import HalfmoonError
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import free_port

CALLERS = 4


def test_closing_a_connection_under_waiting_calls_fails_them_and_leaves_no_thread_behind() -> None:
    """Every caller gets a HalfmoonError (none hangs, none sees grpc's ValueError), and no
    thread dies of an unhandled exception: grpc's connectivity watch, which polls a channel
    from a thread of its own, raised 'Cannot invoke RPC: Channel closed!' there."""
    before = set(threading.enumerate())
    unhandled: list[threading.ExceptHookArgs] = []
    hook = threading.excepthook
    threading.excepthook = unhandled.append
    try:
        connection = BrokerConnection(f"127.0.0.1:{free_port()}")  # nothing listens there
        outcomes: list[str] = []
        waiting = threading.Barrier(CALLERS + 1)

        def call() -> None:
            waiting.wait()
            try:
                connection.call("config", timeout_s=5)
                outcomes.append("answered")
            except HalfmoonError as error:
                outcomes.append(error.code)
            except Exception as error:  # noqa: BLE001 - what the test is about
                outcomes.append(repr(error))

        callers = [threading.Thread(target=call) for _ in range(CALLERS)]
        for caller in callers:
            caller.start()
        waiting.wait()
        # Each caller finds the broker unreachable at once and waits for the channel (up to
        # READY_WAIT_S); close meanwhile, then call again on the closed connection.
        connection.close()
        call_after = threading.Thread(target=call)
        waiting = threading.Barrier(1)
        call_after.start()
        for caller in [*callers, call_after]:
            caller.join(10)
            assert not caller.is_alive(), "a call on a closed connection hangs"
        # Whatever threads the connection started end by themselves, without an error.
        deadline = time.monotonic() + 5
        while set(threading.enumerate()) - before and time.monotonic() < deadline:
            time.sleep(0.05)  # polling threads' exits, with a deadline
    finally:
        threading.excepthook = hook
    assert not unhandled, [f"{u.exc_type.__name__}: {u.exc_value}" for u in unhandled]
    assert not set(threading.enumerate()) - before
    assert outcomes == ["BROKER_UNAVAILABLE"] * (CALLERS + 1), outcomes


def test_the_first_call_after_a_broker_restart_is_answered(tmp_path: Path) -> None:
    """The channel last carried a call before the broker was SIGKILLed; while the broker was
    down an open event stream (as every proxy keeps) made it try to reconnect and back off.
    Right after the restart the channel may still be backing off: grpc then says it found
    no connection to send the call on, so the call never left, and it waits for the channel
    instead of failing as if the broker had died under it."""
    broker = BrokerProcess(tmp_path / "data").start()
    connection = BrokerConnection(broker.address)
    try:
        connection.call("config")
        broker.kill()
        events = connection.events(iter(()))  # waits for the broker: reconnects, backs off
        try:
            connection_attempts_while_down = time.monotonic() + 1.5
            while time.monotonic() < connection_attempts_while_down:
                time.sleep(0.1)  # the broker stays down this long: no event to wait for
            broker.start()
            assert connection.call("config", timeout_s=10) is not None
        finally:
            events.cancel()
    finally:
        connection.close()
        broker.kill()
