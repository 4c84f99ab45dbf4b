"""``halfmoon broker``: one process owning one store and the broker, serving the internal protocol.

Lifecycle (as ``halfmoon serve``'s):

- startup: open the store (crash recovery) and the in-process ``Broker`` on
  it (with the ``transaction`` section), serve the internal protocol
  (:class:`InternalService`) on ``listen``, start the tick thread (delay
  timer, transaction check scans, persistence), register with the
  coordinator when a registration is given, log one ready line.
- shutdown (SIGTERM / SIGINT): deregister, end the event streams, stop
  accepting and let in-flight calls finish for ``server.shutdown_grace``,
  then close the broker and the store. A second signal skips the wait.

Registration is a hook: :func:`run_broker` takes a ``register`` callable,
given the :class:`BrokerEndpoint` once the port is bound, returning the
callable that deregisters it. ``halfmoon broker --cluster --coordinator``
passes :func:`register_in_etcd` (a broker member under an etcd lease, kept
alive in a thread of its own).

``fake_clock_ms`` is for tests only: the broker's clock then stands still
until a peer moves it (``AdvanceClock``), and no tick thread runs (the test
ticks through the facade), so tests written against a fake clock run
unchanged against a broker process.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.clock import Clock, FakeClock, SystemClock
from halfmoon.cluster.connection import MAX_MESSAGE_BYTES
from halfmoon.cluster.etcd_json import parse_coordinator
from halfmoon.cluster.internal_service import InternalService
from halfmoon.cluster.keys import DEFAULT_TTL_S
from halfmoon.cluster.registration import register_member
from halfmoon.cluster.txn_groups import GroupCoordination
from halfmoon.config import Config, parse_host_port
from halfmoon.server.app import METADATA_DIR_NAME, TickThread, configure_logging
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.cluster")

# Listen addresses that name no host a peer could dial.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
# Calls served at once; beyond this, callers get RESOURCE_EXHAUSTED (bounded in-flight work).
MAX_CONCURRENT_CALLS = 256


@dataclass(frozen=True)
class BrokerEndpoint:
    """What a registration announces: who this broker is and where its peers reach it."""

    name: str
    address: str  # host:port of the internal protocol
    cluster: str | None
    coordinator: str | None  # e.g. etcd://127.0.0.1:2379


# Registers the broker; returns the callable that deregisters it.
Registration = Callable[[BrokerEndpoint], Callable[[], None]]


def register_in_etcd(
    endpoint: BrokerEndpoint,
    *,
    ttl_s: int = DEFAULT_TTL_S,
    facts: dict[str, Any] | None = None,
    facts_source: Callable[[], dict[str, Any]] | None = None,
    advertise_host: str | None = None,
) -> Callable[[], None]:
    """The registration of cluster mode: a broker member under an etcd lease of ``ttl_s``.

    The endpoint registered is the one proxies dial: ``advertise_host`` with the bound port;
    without it, the listen address, or this machine's name when that is a wildcard.
    """
    assert endpoint.coordinator is not None and endpoint.cluster is not None
    return register_member(
        endpoint.coordinator,
        endpoint.cluster,
        "broker",
        endpoint.name,
        advertised_address(endpoint.address, advertise_host),
        facts,
        ttl_s=ttl_s,
        facts_source=facts_source,
    )


def disk_facts(data_dir: Path) -> dict[str, Any]:
    """What ``cluster list`` shows of a broker's disk: free bytes and the share used."""
    usage = shutil.disk_usage(data_dir)
    used = round(1 - usage.free / usage.total, 4) if usage.total else None
    return {"disk_free_bytes": usage.free, "disk_used_ratio": used}


def advertised_address(address: str, advertise_host: str | None) -> str:
    host, port = parse_host_port(address, what="internal address")
    if advertise_host is None and host in WILDCARD_HOSTS:
        advertise_host = socket.getfqdn()
    return format_address(advertise_host or host, port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run_broker(
    config: Config,
    listen: str,
    *,
    cluster: str | None = None,
    coordinator: str | None = None,
    register: Registration | None = None,
    fake_clock_ms: int | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives; the exit status."""
    configure_logging()
    started = time.monotonic()
    host, port = parse_host_port(listen, what="internal listen address")
    stop = stop or threading.Event()
    force = threading.Event()
    clock: Clock = FakeClock(fake_clock_ms) if fake_clock_ms is not None else SystemClock()
    store = MessageStore(config.store)
    try:
        broker = InProcessBroker(
            store,
            Path(config.store.data_dir) / METADATA_DIR_NAME,
            config.broker,
            clock,
            transaction_config=config.transaction,
        )
    except BaseException:
        store.close()
        raise
    # In a cluster, transaction groups are decided across brokers (txn_groups.py).
    groups = (
        GroupCoordination(broker, config.broker.name, cluster, parse_coordinator(coordinator))
        if cluster is not None and coordinator is not None
        else None
    )
    service = InternalService(
        broker,
        config.broker.name,
        clock if isinstance(clock, FakeClock) else None,
        groups.operations() if groups is not None else None,
    )
    executor = ThreadPoolExecutor(
        config.server.worker_threads, thread_name_prefix="halfmoon-internal"
    )
    server = grpc.server(
        executor,
        handlers=[service.handler()],
        maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ],
    )
    tick = TickThread(broker, config.server.tick_interval)
    deregister: Callable[[], None] | None = None
    previous = _install_signal_handlers(stop, force)
    try:
        bound = server.add_insecure_port(format_address(host, port))
        if bound == 0:
            raise OSError(f"cannot listen on {listen} (address in use or not available)")
        server.start()
        if fake_clock_ms is None:
            tick.start()
        address = format_address(host, bound)
        if register is not None:
            deregister = register(BrokerEndpoint(config.broker.name, address, cluster, coordinator))
        log.info(
            "halfmoon broker ready name=%s internal=%s data=%s startup_ms=%d",
            config.broker.name,
            address,
            config.store.data_dir,
            (time.monotonic() - started) * 1000,
        )
        if groups is not None:  # after the ready line: its recovery may find work at once
            groups.start()
        while not stop.wait(1.0):
            pass
        log.info("event=shutdown_begin grace_s=%s", config.server.shutdown_grace)
    finally:
        try:
            if deregister is not None:
                with contextlib.suppress(Exception):
                    deregister()
            if groups is not None:
                groups.close()
            service.close()
            grace = 0 if force.is_set() else config.server.shutdown_grace
            stopped = server.stop(grace)
            while not stopped.wait(0.1):
                if force.is_set():
                    log.warning("event=shutdown_forced")
                    server.stop(0).wait()
                    break
            if tick.is_alive():
                tick.stop()
            executor.shutdown(wait=False, cancel_futures=True)
            broker.close()
        finally:
            store.close()
            _restore_signal_handlers(previous)
            log.info("event=stopped")
    return 0


_Handler = Callable[[int, FrameType | None], object] | int | None


def _install_signal_handlers(stop: threading.Event, force: threading.Event) -> dict[int, _Handler]:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("event=signal_again signal=%s action=force", signal.Signals(signum).name)
            force.set()
        else:
            log.info("event=signal signal=%s action=shutdown", signal.Signals(signum).name)
            stop.set()

    previous: dict[int, _Handler] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous  # embedded in a test: the caller stops it with ``stop``
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, on_signal)
    return previous


def _restore_signal_handlers(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
