"""``halfmoon broker``: one process owning one store and the broker, serving the internal protocol.

It assembles the layers (store, broker, cluster coordination, replication),
which is why it lives above ``halfmoon.cluster`` and ``halfmoon.replication``
rather than in either.

Lifecycle (as ``halfmoon serve``'s):

- startup: open the store (crash recovery) and the in-process ``Broker`` on
  it (with the ``transaction`` section), serve the internal protocol
  (:class:`InternalService`) on ``listen``, start the tick thread (delay
  timer, transaction check scans, persistence), register with the
  coordinator when a registration is given, log one ready line.
- shutdown (SIGTERM / SIGINT): deregister, end the event streams, stop
  accepting and let in-flight calls finish for ``server.shutdown_grace``,
  cancel those left (and log how many), then close the broker and the store.
  A second request skips the wait (:mod:`halfmoon.lifecycle`, as ``serve``
  and ``proxy``).

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
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from halfmoon.auth.errors import InsecureListen
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.clock import Clock, FakeClock, SystemClock
from halfmoon.broker.groups import GroupRegistry
from halfmoon.broker.topics import TopicRegistry
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.etcd_tls import PLAIN, EtcdTls
from halfmoon.cluster.coordination.registration import register_member
from halfmoon.cluster.internal.connection import MAX_MESSAGE_BYTES
from halfmoon.cluster.internal.delivery_holders import HolderLeases
from halfmoon.cluster.internal.internal_service import InternalService
from halfmoon.cluster.internal.peer_tls import PeerTls
from halfmoon.cluster.internal.send.listener import SendListener
from halfmoon.cluster.internal.txn_groups import GroupCoordination
from halfmoon.config import Config, parse_host_port
from halfmoon.config.cluster import DEFAULT_TTL_S
from halfmoon.errors import HalfmoonError
from halfmoon.gc_tuning import freeze_startup_heap
from halfmoon.lifecycle import Lifecycle
from halfmoon.logs import configure_logging
from halfmoon.replication.controller import Controller
from halfmoon.replication.group_broker import GroupOptions, GroupRole
from halfmoon.server.app import METADATA_DIR_NAME, TickThread
from halfmoon.server.edge_security import is_loopback
from halfmoon.store.dirlock import holding_data_dir
from halfmoon.store.fsutil import fsync_directory
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.cluster")

# Listen addresses that name no host a peer could dial.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
# Calls served at once; beyond this, callers get RESOURCE_EXHAUSTED (bounded in-flight work).
MAX_CONCURRENT_CALLS = 256
# The send listener's address: the internal listen host on any free port, or none at all.
SEND_LISTEN_AUTO = "auto"
SEND_LISTEN_OFF = "off"


@dataclass(frozen=True)
class BrokerEndpoint:
    """What a registration announces: who this broker is and where its peers reach it."""

    name: str
    address: str  # host:port of the internal protocol
    cluster: str | None
    coordinator: str | None  # e.g. etcd://127.0.0.1:2379
    send_port: int | None = None  # the send listener's port on the same host, if it listens
    etcd_tls: EtcdTls = PLAIN  # how this process reaches the coordinator


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
        {**(facts or {}), "send_port": endpoint.send_port} if endpoint.send_port else facts,
        ttl_s=ttl_s,
        facts_source=facts_source,
        tls=endpoint.etcd_tls,
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


def _send_address(send_listen: str | None, listen_host: str) -> tuple[str, int] | None:
    if send_listen is None or send_listen == SEND_LISTEN_OFF:
        return None
    if send_listen == SEND_LISTEN_AUTO:
        return listen_host, 0
    return parse_host_port(send_listen, what="send listen address")


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# Broker snapshots that are configuration, not progress through the log: kept across a cut.
_CONFIGURATION_FILES = frozenset({TopicRegistry.FILE, GroupRegistry.FILE})


def forget_log_progress(metadata_dir: Path) -> None:
    """Remove the broker's snapshots of progress through the log (offsets and their journal
    position, transactions, delay timer, pop and consumption state) before the log is cut:
    they may count records that are going. The member is left with what any replica has (no
    snapshots), and a broker opened on it later rebuilds them from the log as one opened on a
    replica does (offsets from their journal, transactions from their queues). Files first,
    log after: a crash between leaves a log still ahead, cut again at the next start."""
    if not metadata_dir.is_dir():
        return
    for path in sorted(metadata_dir.glob("*.json")):
        if path.name not in _CONFIGURATION_FILES:
            log.warning("event=broker_snapshot_dropped path=%s reason=log_truncation", path)
            path.unlink(missing_ok=True)
    fsync_directory(metadata_dir)


def run_broker(
    config: Config,
    listen: str,
    *,
    cluster: str | None = None,
    coordinator: str | None = None,
    register: Registration | None = None,
    fake_clock_ms: int | None = None,
    stop: threading.Event | None = None,
    group: GroupOptions | None = None,
    group_advertise: str | None = None,
    send_listen: str | None = SEND_LISTEN_AUTO,
) -> int:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives; the exit status.

    With ``group`` (and ``cluster`` and ``coordinator``) the broker is a member of
    a broker group: it registers and campaigns there (``halfmoon.replication``)
    instead of through ``register``; as master it serves the broker under the
    group's name, as replica only the replication service.

    A master that steps down (a planned switchover, or deposed and back in
    touch with etcd) closes everything and starts over on the same data
    directory and port: recovery, then a replica that waits for the controller
    (no campaign) and cuts its unreplicated tail before following. Starting
    over rather than switching in place leaves no state of the master's broker
    (pending transactions, timers, pop state in memory) behind.

    ``send_listen`` is where the send listener (:mod:`halfmoon.cluster.internal.send.listener`)
    listens: ``host:port``, ``auto`` (the ``listen`` host, any free port) or None (none:
    proxies send over the gRPC stream). Its port is announced in the Hello answer and
    the etcd member record.
    """
    # Checked before the directory is locked (or created): a refused listener touches nothing.
    tls = PeerTls.from_config(config)
    _refuse_exposed_listeners(config, tls, listen, send_listen)
    lifecycle = Lifecycle(config.server.shutdown_grace, stop=stop, on_reload=tls.reload)
    bound: list[str] = []
    acknowledged: list[int] = [0]  # what it acknowledged as master before stepping down
    rejoining = False
    # Held across every life: between stepping down and rejoining, no other process may
    # open the directory (DATA_DIR_LOCKED; see halfmoon.store.dirlock). The signals too: a
    # stop requested while a life starts is served once it serves (it drains at once).
    with holding_data_dir(config.store.data_dir, "halfmoon broker"), lifecycle.capture_signals():
        while True:
            status = _run_broker_once(
                config, listen, cluster=cluster, coordinator=coordinator, register=register,
                fake_clock_ms=fake_clock_ms, lifecycle=lifecycle, tls=tls, group=group,
                group_advertise=group_advertise, bound_to=bound, send_listen=send_listen,
                acknowledged=acknowledged, campaign=not rejoining,
            )  # fmt: skip
            if status is not None:
                return status
            listen = bound[0]  # the same port again (a listen port 0 would pick another)
            rejoining = True
            # Closed, it joins the group again and follows the new master, cutting what it
            # wrote past the new master's log first (a deposed master's unacknowledged tail).
            log.info(
                "event=rejoining_as_replica group=%s acknowledged=%d",
                group.group if group else None, acknowledged[0],
            )  # fmt: skip


def _refuse_exposed_listeners(
    config: Config, tls: PeerTls, listen: str, send_listen: str | None
) -> None:
    """:class:`InsecureListen` for a listener beyond loopback without mutual TLS (unless
    ``auth.insecure``)."""
    host, _ = parse_host_port(listen, what="internal listen address")
    send_address = _send_address(send_listen, host)
    listening = [("internal listen", listen, host)]
    if send_address is not None:
        listening.append(("send listen", str(send_listen), send_address[0]))
    for what, given, bound_host in listening:
        if tls.internal.enabled or is_loopback(bound_host) or config.auth.insecure:
            continue
        # As serve refuses an unauthenticated client port beyond loopback: a broker answers
        # every caller as a trusted proxy, so one facing a network must know its peers.
        raise InsecureListen(
            f"the {what} address {given} is not a loopback address and mutual TLS is off: "
            "anyone who reaches it could read and write every queue. Set [internal] ca, cert "
            "and key (docs/security.md), or pass --insecure to accept that"
        )


def _run_broker_once(
    config: Config,
    listen: str,
    *,
    cluster: str | None,
    coordinator: str | None,
    register: Registration | None,
    fake_clock_ms: int | None,
    lifecycle: Lifecycle,
    tls: PeerTls,
    group: GroupOptions | None,
    group_advertise: str | None,
    bound_to: list[str],
    acknowledged: list[int],
    campaign: bool,
    send_listen: str | None,
) -> int | None:
    """One life of the broker: its exit status, or None when it stepped down as its group's
    master and must rejoin as a replica."""
    configure_logging(config.log)
    started = time.monotonic()
    host, port = parse_host_port(listen, what="internal listen address")
    send_address = _send_address(send_listen, host)
    stop = lifecycle.stopping
    clock: Clock = FakeClock(fake_clock_ms) if fake_clock_ms is not None else SystemClock()
    executor = ThreadPoolExecutor(
        config.server.worker_threads, thread_name_prefix="halfmoon-internal"
    )
    server = grpc.server(
        executor,
        maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ],
    )
    try:
        # Bound before anything else: a taken port fails before the store is opened, and a
        # group member campaigns with the endpoint it serves.
        bound = tls.internal.add_port(server, format_address(host, port))  # OSError if taken
        store = MessageStore(config.store)
    except BaseException:
        server.stop(0)
        executor.shutdown(wait=False, cancel_futures=True)
        raise
    address = format_address(host, bound)
    bound_to[:] = [address]
    role: GroupRole | None = None
    controller: Controller | None = None
    promoted = False  # a replica appointed master: the server is already started
    try:
        if group is not None:
            assert cluster is not None and coordinator is not None
            metadata_dir = Path(config.store.data_dir) / METADATA_DIR_NAME
            role = GroupRole.decide(
                store, group, cluster=cluster, coordinator=coordinator,
                endpoint=advertised_address(address, group_advertise),
                acknowledged=acknowledged[0], campaign=campaign,
                on_truncate=lambda _cut: forget_log_progress(metadata_dir), tls=tls,
            )  # fmt: skip
            server.add_generic_rpc_handlers([role.handler(), role.reads.handler()])
            # Any member may act as the cluster's controller (one at a time, etcd decides).
            member = role.member  # its lease changes when a deposed master rejoins
            controller = Controller(
                coordinator, cluster, name=f"{group.group}/{group.member}",
                lease=lambda: member.lease, unclean=group.unclean_election, tls=tls,
            )  # fmt: skip
            controller.start()
            if not role.is_master:
                if not _serve_replica(
                    config, server, executor, store, role, address, started, lifecycle
                ):
                    controller.close()
                    return 0
                role.promote()  # appointed by a controller: open the broker below
                promoted = True
    except BaseException:
        if controller is not None:
            controller.close()
        server.stop(0)
        executor.shutdown(wait=False, cancel_futures=True)
        if role is not None:
            role.close()
        store.close()
        raise
    name = group.group if group is not None else config.broker.name
    try:
        broker = InProcessBroker(
            role.broker_store() if role is not None else store,
            Path(config.store.data_dir) / METADATA_DIR_NAME,
            config.broker,
            clock,
            transaction_config=config.transaction,
            # Acks and offsets are as durable as sends, and move with the log to replicas.
            journal_offsets=True,
            admit_send=role.leader.admit if role is not None and role.leader else None,
        )
    except BaseException:
        server.stop(0)
        if controller is not None:
            controller.close()
        if role is not None:
            role.close()
        store.close()
        raise
    # In a cluster, transaction groups are decided across brokers (txn_groups.py).
    groups = (
        GroupCoordination(
            broker,
            name,
            cluster,
            parse_coordinator(coordinator),
            record_retention_ms=config.transaction.group_record_retention_ms,
            tls=tls.internal,
            etcd_tls=tls.etcd,
        )
        if cluster is not None and coordinator is not None
        else None
    )
    # In a cluster, a proxy worker's AMQP deliveries go back to their queue when it ends.
    holders = (
        HolderLeases(broker, parse_coordinator(coordinator), tls=tls.etcd)
        if cluster is not None and coordinator is not None
        else None
    )
    service = InternalService(
        broker,
        name,
        clock if isinstance(clock, FakeClock) else None,
        groups.operations() if groups is not None else None,
        fence=role.check_epoch if role is not None else None,
    )
    server.add_generic_rpc_handlers([service.handler()])
    listener: SendListener | None = None
    if send_address is not None:
        listener = SendListener(service, *send_address, tls=tls.internal)
        try:
            service.send_port = listener.start()
        except BaseException:
            listener.close()
            server.stop(0)
            if controller is not None:
                controller.close()
            if role is not None:
                role.close()
            broker.close()
            store.close()
            raise
    tick = TickThread(broker, config.server.tick_interval)
    deregister: Callable[[], None] | None = None
    rejoin = False
    try:
        if not promoted:
            server.start()
        if role is not None:
            # Serving now (the service registered, the port listening): tell proxies. A
            # master that is no longer one by now steps down (the loop below rejoins).
            role.announce()
        if fake_clock_ms is None:
            tick.start()
        if register is not None and role is None:
            deregister = register(
                BrokerEndpoint(name, address, cluster, coordinator, service.send_port, tls.etcd)
            )
        freeze_startup_heap(config.server.gc_freeze)
        log.info(
            "halfmoon broker ready name=%s%s internal=%s%s data=%s startup_ms=%d",
            name,
            f" member={group.member} role=master epoch={role.epoch}" if role and group else "",
            address,
            f" send_port={service.send_port}" if service.send_port else "",
            config.store.data_dir,
            (time.monotonic() - started) * 1000,
        )
        if groups is not None:  # after the ready line: its recovery may find work at once
            groups.start()
        if holders is not None:
            holders.start()
        while not stop.wait(0.05 if role is not None else 1.0):
            if role is not None and role.demoted.is_set():
                rejoin = True
                if role.leader is not None:
                    acknowledged[0] = role.leader.acknowledged_end
                break
        lifecycle.shutdown_begins(0 if rejoin else None, " rejoin=true" if rejoin else "")
    finally:
        try:
            if deregister is not None:
                with contextlib.suppress(Exception):
                    deregister()
            if controller is not None:
                controller.close()
            if role is not None:
                role.close()
            if groups is not None:
                groups.close()
            if holders is not None:
                holders.close()
            service.close()
            grace = 0 if rejoin else lifecycle.grace_s
            # gRPC's own grace is a backstop past the drain's deadline: the drain cancels
            # what is left itself, so that it can say how much.
            stopped = server.stop(2 * grace + 1)
            lifecycle.drain(
                stopped.wait, lambda: len(service.calls), lambda: server.stop(0).wait(),
                grace_s=grace,
            )  # fmt: skip
            if listener is not None:  # after the drain above: its requests were answered too
                listener.close()
            if tick.is_alive():
                tick.stop()
            executor.shutdown(wait=False, cancel_futures=True)
            if rejoin:
                # Its store is fenced: the log must end where the new master's epoch began,
                # so what closing would append (traces, an offsets record) is refused, and the
                # files beside the log are left as after a crash (recovery's case on reopen).
                try:
                    broker.close()
                except HalfmoonError as error:
                    log.info("event=close_after_handover skipped=%s", error.code)
            else:
                broker.close()
        finally:
            store.close()
            log.info("event=stopped")
    return None if rejoin and not stop.is_set() else 0


def _serve_replica(
    config: Config,
    server: grpc.Server,
    executor: ThreadPoolExecutor,
    store: MessageStore,
    role: GroupRole,
    address: str,
    started: float,
    lifecycle: Lifecycle,
) -> bool:
    """A replica: the replication service only, until stopped (then leave and close: False)
    or appointed master by a controller (True: everything left running for the master)."""
    stop = lifecycle.stopping
    promoted = False
    try:
        server.start()
        freeze_startup_heap(config.server.gc_freeze)
        log.info(
            "halfmoon broker ready name=%s member=%s role=replica internal=%s data=%s "
            "startup_ms=%d",
            role.options.group,
            role.options.member,
            address,
            config.store.data_dir,
            (time.monotonic() - started) * 1000,
        )
        while not stop.is_set():
            if role.promoted.wait(0.2):
                promoted = not stop.is_set()
                break
        if promoted:
            log.info("event=replica_promoted group=%s", role.options.group)
        else:
            lifecycle.shutdown_begins(0)
    finally:
        if not promoted:  # promoted, nothing closes: the process goes on as master
            try:
                role.close()
                server.stop(0).wait()
                executor.shutdown(wait=False, cancel_futures=True)
            finally:
                store.close()
                log.info("event=stopped")
    return promoted
