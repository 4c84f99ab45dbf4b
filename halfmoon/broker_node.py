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

Registration is a hook: :class:`BrokerNode` takes a ``register`` callable,
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
import functools
import logging
import shutil
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
from halfmoon.config import Config, parse_host_port, replication_defaults
from halfmoon.config.cluster import DEFAULT_TTL_S
from halfmoon.errors import HalfmoonError
from halfmoon.gc_tuning import freeze_startup_heap
from halfmoon.lifecycle import Lifecycle
from halfmoon.listen.addresses import advertised_host, format_address
from halfmoon.logs import configure_logging
from halfmoon.replication.controller import Controller
from halfmoon.replication.group_broker import GroupOptions, GroupRole
from halfmoon.replication.leader import ReplicationSettings
from halfmoon.server.app import METADATA_DIR_NAME
from halfmoon.server.edge_security import is_loopback
from halfmoon.server.tick import TickThread
from halfmoon.store.dirlock import holding_data_dir
from halfmoon.store.fsutil import fsync_directory
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.cluster")

# Calls served at once; beyond this, callers get RESOURCE_EXHAUSTED (bounded in-flight work).
MAX_CONCURRENT_CALLS = 256
# The send listener's address: the internal listen host on any free port, or none at all.
SEND_LISTEN_AUTO = "auto"


@dataclass(frozen=True)
class BrokerEndpoint:
    """What a registration announces: who this broker is and where its peers reach it."""

    name: str
    address: str  # host:port of the internal protocol
    cluster: str | None
    coordinator: str | None  # e.g. etcd://127.0.0.1:2379
    send_port: int | None = None  # the send listener's port on the same host
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
    """The internal address peers dial (:func:`halfmoon.listen.addresses.advertised_host`)."""
    host, port = parse_host_port(address, what="internal address")
    return format_address(advertised_host(host, advertise_host), port)


def _send_address(send_listen: str | None, listen_host: str) -> tuple[str, int]:
    """Where the send listener binds: proxies' sends have no other route to the broker."""
    if send_listen is None or send_listen == SEND_LISTEN_AUTO:
        return listen_host, 0
    return parse_host_port(send_listen, what="send listen address (HOST:PORT or auto)")


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


class BrokerNode:
    """The broker process: what stays the same across its lives (configuration, how it
    registers, its group, its TLS) and the lives themselves, one at a time.

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

    def __init__(
        self,
        config: Config,
        *,
        cluster: str | None,
        coordinator: str | None,
        register: Registration | None,
        fake_clock_ms: int | None,
        group: GroupOptions | None,
        group_advertise: str | None,
        send_listen: str | None,
    ) -> None:
        if group is not None:
            assert cluster is not None and coordinator is not None, "a group lives in a cluster"
        self.config = config
        self.cluster = cluster
        self.coordinator = coordinator
        self.register = register
        self.fake_clock_ms = fake_clock_ms
        self.group = group
        self.group_advertise = group_advertise
        self.send_listen = send_listen
        self.tls = PeerTls.from_config(config)
        self.name = group.group if group is not None else config.broker.name
        self.address = ""  # host:port the internal protocol is bound to (the first life's)
        self.acknowledged = 0  # what it acknowledged as master before stepping down

    @classmethod
    def from_config(cls, config: Config, *, fake_clock_ms: int | None = None) -> BrokerNode:
        """The broker ``halfmoon broker`` runs: unregistered, registered in the configured
        cluster's etcd under a lease, or a member of the configured broker group (which
        registers and campaigns there itself)."""
        cluster, replication = config.cluster, config.replication
        data_dir = Path(config.store.data_dir)
        facts = {"data_dir": str(data_dir.resolve())}
        facts_source = functools.partial(disk_facts, data_dir)
        group = None
        if replication.group is not None:
            group = GroupOptions(
                replication.group,
                config.broker.name,
                ReplicationSettings(
                    replication.mode,
                    replication.min_insync_replicas,
                    replication.replica_max_lag_ms,
                    replication.replica_max_lag_bytes,
                    replica_reads=replication.replica_reads,
                ),
                ttl_s=cluster.lease_ttl_s or replication_defaults.LEASE_TTL_S,
                facts=dict(facts),
                facts_source=facts_source,
                unclean_election=replication.unclean_election,
            )
        register = (
            functools.partial(
                register_in_etcd,
                ttl_s=cluster.lease_ttl_s or DEFAULT_TTL_S,
                facts=dict(facts),
                facts_source=facts_source,
                advertise_host=cluster.broker_advertise_host,
            )
            if cluster.name is not None
            else None
        )
        return cls(
            config, cluster=cluster.name, coordinator=cluster.coordinator, register=register,
            fake_clock_ms=fake_clock_ms, group=group,
            group_advertise=cluster.broker_advertise_host, send_listen=cluster.broker_send_listen,
        )  # fmt: skip

    def run(self, listen: str, stop: threading.Event | None = None) -> int:
        """Serve until ``stop`` is set or SIGTERM/SIGINT arrives, every life in turn; the
        exit status of the last."""
        # Checked before the directory is locked (or created): a refused listener touches
        # nothing.
        _refuse_exposed_listeners(self.config, self.tls, listen, self.send_listen)
        lifecycle = Lifecycle(
            self.config.server.shutdown_grace, stop=stop, on_reload=self.tls.reload
        )
        rejoining = False
        # Held across every life: between stepping down and rejoining, no other process may
        # open the directory (DATA_DIR_LOCKED; see halfmoon.store.dirlock). The signals too: a
        # stop requested while a life starts is served once it serves (it drains at once).
        with (
            holding_data_dir(self.config.store.data_dir, "halfmoon broker"),
            lifecycle.capture_signals(),
        ):
            while True:
                status = self._live(listen, lifecycle, campaign=not rejoining)
                if status is not None:
                    return status
                listen = self.address  # the same port again (a listen port 0 would pick another)
                rejoining = True
                # Closed, it joins the group again and follows the new master, cutting what it
                # wrote past the new master's log first (a deposed master's unacknowledged tail).
                log.info(
                    "event=rejoining_as_replica group=%s acknowledged=%d",
                    self.group.group if self.group else None, self.acknowledged,
                )  # fmt: skip

    def _live(self, listen: str, lifecycle: Lifecycle, *, campaign: bool) -> int | None:
        """One life: its exit status, or None when it stepped down as its group's master and
        must rejoin as a replica."""
        config = self.config
        configure_logging(config.log)
        started = time.monotonic()
        host, port = parse_host_port(listen, what="internal listen address")
        executor = ThreadPoolExecutor(
            config.server.worker_threads, thread_name_prefix="halfmoon-internal"
        )
        life = _Life(executor, _internal_server(executor), lifecycle.stopping)
        try:
            # Bound before anything else: a taken port fails before the store is opened, and
            # a group member campaigns with the endpoint it serves.
            bound = self.tls.internal.add_port(life.server, format_address(host, port))
            self.address = format_address(host, bound)
            life.store = MessageStore(config.store)
            if self.group is not None:
                self._join_group(life, campaign, started)
            if life.master():
                self._open_broker(life, host)
        except BaseException:
            life.close(lifecycle, grace_s=0)
            raise
        if not life.master():  # a replica, stopped before any controller appointed it
            lifecycle.shutdown_begins(0)
            life.close(lifecycle, grace_s=0)
            log.info("event=stopped")
            return 0
        rejoin = False
        try:
            self._start_serving(life, started)
            rejoin = self._serve(life)
            lifecycle.shutdown_begins(0 if rejoin else None, " rejoin=true" if rejoin else "")
        finally:
            life.close(lifecycle, grace_s=0 if rejoin else lifecycle.grace_s, fenced=rejoin)
            log.info("event=stopped")
        return None if rejoin and not lifecycle.stopping.is_set() else 0

    def _join_group(self, life: _Life, campaign: bool, started: float) -> None:
        """Take this member's role in its group; as a replica, serve replication until
        stopped or appointed master (:meth:`_Life.master` tells which)."""
        assert self.group is not None and self.cluster is not None
        assert self.coordinator is not None and life.store is not None
        metadata_dir = Path(self.config.store.data_dir) / METADATA_DIR_NAME
        role = life.role = GroupRole.decide(
            life.store, self.group, cluster=self.cluster, coordinator=self.coordinator,
            endpoint=advertised_address(self.address, self.group_advertise),
            acknowledged=self.acknowledged, campaign=campaign,
            on_truncate=lambda _cut: forget_log_progress(metadata_dir), tls=self.tls,
        )  # fmt: skip
        life.server.add_generic_rpc_handlers([role.handler(), role.reads.handler()])
        # Any member may act as the cluster's controller (one at a time, etcd decides).
        member = role.member  # its lease changes when a deposed master rejoins
        life.controller = Controller(
            self.coordinator, self.cluster, name=f"{self.group.group}/{self.group.member}",
            lease=lambda: member.lease, unclean=self.group.unclean_election, tls=self.tls,
        )  # fmt: skip
        life.controller.start()
        if not role.is_master:
            life.promoted = self._serve_replica(life, started)
            if life.promoted:
                role.promote()  # appointed by a controller: the broker opens on it next

    def _serve_replica(self, life: _Life, started: float) -> bool:
        """A replica: the replication service only, until stopped (False: the life closes)
        or appointed master by a controller (True: everything stays running for the
        master)."""
        role, config = life.role, self.config
        assert role is not None
        life.server.start()
        freeze_startup_heap(config.server.gc_freeze)
        log.info(
            "halfmoon broker ready name=%s member=%s role=replica internal=%s data=%s "
            "startup_ms=%d",
            role.options.group, role.options.member, self.address, config.store.data_dir,
            (time.monotonic() - started) * 1000,
        )  # fmt: skip
        while not life.stopping.is_set():
            if role.promoted.wait(0.2):
                break
        if life.stopping.is_set():
            return False
        log.info("event=replica_promoted group=%s", role.options.group)
        return True

    def _open_broker(self, life: _Life, host: str) -> None:
        """The broker on the store (or on the role's view of it), what decides transaction
        groups and releases dead proxies' deliveries in a cluster, the internal service and
        the send listener."""
        config, store, role = self.config, life.store, life.role
        assert store is not None
        clock: Clock = (
            FakeClock(self.fake_clock_ms) if self.fake_clock_ms is not None else SystemClock()
        )
        broker = life.broker = InProcessBroker(
            role.broker_store() if role is not None else store,
            Path(config.store.data_dir) / METADATA_DIR_NAME,
            config.broker,
            clock,
            transaction_config=config.transaction,
            # Acks and offsets are as durable as sends, and move with the log to replicas.
            journal_offsets=True,
            admit_send=role.leader.admit if role is not None and role.leader else None,
        )
        if self.cluster is not None and self.coordinator is not None:
            etcd = parse_coordinator(self.coordinator)
            # Transaction groups are decided across brokers (txn_groups.py).
            life.groups = GroupCoordination(
                broker, self.name, self.cluster, etcd,
                record_retention_ms=config.transaction.group_record_retention_ms,
                tls=self.tls.internal, etcd_tls=self.tls.etcd,
            )  # fmt: skip
            # A proxy worker's AMQP deliveries go back to their queue when it ends.
            life.holders = HolderLeases(broker, etcd, tls=self.tls.etcd)
        service = life.service = InternalService(
            broker,
            self.name,
            clock if isinstance(clock, FakeClock) else None,
            life.groups.operations() if life.groups is not None else None,
            fence=role.check_epoch if role is not None else None,
        )
        life.server.add_generic_rpc_handlers([service.handler()])
        life.listener = SendListener(
            service, *_send_address(self.send_listen, host), tls=self.tls.internal
        )
        service.send_port = life.listener.start()
        life.tick = TickThread(broker, config.server.tick_interval)

    def _start_serving(self, life: _Life, started: float) -> None:
        """Listening, announced and registered; the ready line."""
        assert life.service is not None and life.tick is not None
        role, group, config = life.role, self.group, self.config
        if not life.promoted:
            life.server.start()
        if role is not None:
            # Serving now (the service registered, the port listening): tell proxies. A
            # master that is no longer one by now steps down (the serve loop rejoins).
            role.announce()
        if self.fake_clock_ms is None:
            life.tick.start()
        if self.register is not None and role is None:
            life.deregister = self.register(
                BrokerEndpoint(
                    self.name, self.address, self.cluster, self.coordinator,
                    life.service.send_port, self.tls.etcd,
                )
            )  # fmt: skip
        freeze_startup_heap(config.server.gc_freeze)
        log.info(
            "halfmoon broker ready name=%s%s internal=%s%s data=%s startup_ms=%d",
            self.name,
            f" member={group.member} role=master epoch={role.epoch}" if role and group else "",
            self.address,
            f" send_port={life.service.send_port}" if life.service.send_port else "",
            config.store.data_dir,
            (time.monotonic() - started) * 1000,
        )
        if life.groups is not None:  # after the ready line: its recovery may find work at once
            life.groups.start()
        if life.holders is not None:
            life.holders.start()

    def _serve(self, life: _Life) -> bool:
        """Until stopped (False) or deposed as the group's master (True: rejoin)."""
        role = life.role
        while not life.stopping.wait(0.05 if role is not None else 1.0):
            if role is not None and role.demoted.is_set():
                if role.leader is not None:
                    self.acknowledged = role.leader.acknowledged_end
                return True
        return False


def _internal_server(executor: ThreadPoolExecutor) -> grpc.Server:
    return grpc.server(
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


@dataclass
class _Life:
    """What one life of the broker holds (None until made), closed in one order whether the
    life ended or failed to start."""

    executor: ThreadPoolExecutor
    server: grpc.Server
    stopping: threading.Event  # the process's: set when a stop is requested
    store: MessageStore | None = None
    role: GroupRole | None = None
    controller: Controller | None = None
    promoted: bool = False  # a replica appointed master: its server is already started
    broker: InProcessBroker | None = None
    groups: GroupCoordination | None = None
    holders: HolderLeases | None = None
    service: InternalService | None = None
    listener: SendListener | None = None
    tick: TickThread | None = None
    deregister: Callable[[], None] | None = None

    def master(self) -> bool:
        """Whether this life goes on to serve the broker: not a group member, its master, or
        a replica appointed master (a replica stopped while waiting does not)."""
        return self.role is None or self.role.is_master or self.promoted

    def close(self, lifecycle: Lifecycle, *, grace_s: float, fenced: bool = False) -> None:
        """Leave the cluster, stop serving (in-flight calls get ``grace_s`` to finish, then
        are cancelled and counted), then close the broker and the store.

        ``fenced``: the life stepped down as master. Its store must end where the new
        master's epoch began, so what closing would append (traces, an offsets record) is
        refused, and the files beside the log are left as after a crash (recovery's case
        on reopen).
        """
        try:
            if self.deregister is not None:
                with contextlib.suppress(Exception):
                    self.deregister()
            for part in (self.controller, self.role, self.groups, self.holders):
                if part is not None:
                    part.close()
            if self.service is not None:
                service = self.service
                service.close()
                # gRPC's own grace is a backstop past the drain's deadline: the drain cancels
                # what is left itself, so that it can say how much.
                stopped = self.server.stop(2 * grace_s + 1)
                lifecycle.drain(
                    stopped.wait, lambda: len(service.calls), lambda: self.server.stop(0).wait(),
                    grace_s=grace_s,
                )  # fmt: skip
            else:
                self.server.stop(0).wait()
            if self.listener is not None:  # after the drain: its requests were answered too
                self.listener.close()
            if self.tick is not None and self.tick.is_alive():
                self.tick.stop()
            self.executor.shutdown(wait=False, cancel_futures=True)
            if self.broker is not None:
                try:
                    self.broker.close()
                except HalfmoonError as error:
                    if not fenced:
                        raise
                    log.info("event=close_after_handover skipped=%s", error.code)
        finally:
            if self.store is not None:
                self.store.close()


def _refuse_exposed_listeners(
    config: Config, tls: PeerTls, listen: str, send_listen: str | None
) -> None:
    """:class:`InsecureListen` for a listener beyond loopback without mutual TLS (unless
    ``auth.insecure``)."""
    host, _ = parse_host_port(listen, what="internal listen address")
    listening = [
        ("internal listen", listen, host),
        ("send listen", send_listen or SEND_LISTEN_AUTO, _send_address(send_listen, host)[0]),
    ]
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
