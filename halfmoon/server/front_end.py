"""The network front ends of one broker facade: gRPC, the admin API and AMQP, for one life.

startup -> serve -> drain with a deadline -> close, as every halfmoon process does
(:mod:`halfmoon.lifecycle`). :func:`serve_front_end` is what ``halfmoon serve`` runs in front
of its in-process broker and what ``halfmoon proxy`` runs in front of brokers a network hop
away; a :class:`FrontEnd` holds the parts of one such life (listeners, gRPC server, worker
pool, arrival notifier, tick thread, admin runner, AMQP server, metric collectors, signal
handlers) and closes them in one order, each step run even if an earlier one failed,
whether the life ended or failed to start.

What only some callers have is passed as one object each: :class:`AmqpBacking` (where the
AMQP endpoint keeps its topology and who holds its deliveries) and :class:`ClusterRole` (a
cluster proxy's members, sessions and registration).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from aiohttp import web

from halfmoon.amqp import AmqpServer
from halfmoon.amqp.cluster_consumers import ClusterConsumers
from halfmoon.amqp.server import ActiveClaims
from halfmoon.amqp.topology import TopologyStore
from halfmoon.auth import Guard
from halfmoon.broker import broker_metrics
from halfmoon.broker.facade import Broker, WatchesArrivals
from halfmoon.config import Config, parse_host_port
from halfmoon.gc_tuning import freeze_startup_heap
from halfmoon.lifecycle import CallsInFlight, Lifecycle
from halfmoon.listen.addresses import advertised_host, format_address
from halfmoon.listen.permissive import PermissiveAdminListener
from halfmoon.metrics import MetricFamily, default_registry
from halfmoon.server import lite_subscriptions
from halfmoon.server.admin import create_admin_app
from halfmoon.server.admin_definitions import AmqpHandle
from halfmoon.server.admin_http import ClusterMembers
from halfmoon.server.bulk_rpc import BulkReadService, bulk_read_handler
from halfmoon.server.check_sender import TelemetryCheckSender
from halfmoon.server.edge_security import Certificates
from halfmoon.server.grpc_endpoint import GrpcEndpoint
from halfmoon.server.grpc_service import MessagingServicer
from halfmoon.server.handlers import messaging_handler
from halfmoon.server.listeners import Listeners, bind_listeners
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.rpc_guard import RpcGuard
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.server.tick import TickThread

log = logging.getLogger("halfmoon.server")


@dataclass(frozen=True)
class AmqpBacking:
    """Where the AMQP endpoint keeps what is not messages, and who holds its deliveries.

    ``metadata``: the data directory's metadata, where ``halfmoon serve`` keeps exchanges,
    queues and bindings; ``topology``: where a cluster proxy keeps them instead (etcd).
    ``free_bytes``: the free space where messages are stored, for the disk alarm (default:
    the data directory's, with ``metadata``). ``holder``: who holds the endpoint's deliveries
    (a cluster proxy's lease: ``Messaging.receive``'s ``holder``). ``active_claims``: where
    single active consumers are agreed on with the other proxies' workers;
    ``cluster_consumers``: where every worker's consumers are counted."""

    metadata: Path | None = None
    topology: TopologyStore | None = None
    free_bytes: Callable[[], int | None] | None = None
    holder: Callable[[], str] | None = None
    active_claims: ActiveClaims | None = None
    cluster_consumers: ClusterConsumers | None = None


@dataclass(frozen=True)
class ClusterRole:
    """What a cluster proxy's front end has that ``serve``'s has not.

    ``members``: the cluster's members, for the admin API (``?broker=NAME``, ``cluster
    list``). ``registry``: the connected clients' sessions, published to the other proxies
    (the session directory). ``on_ready``: awaited once every listener serves, before the
    ready line (the proxy registers in etcd then: never listed while it cannot serve).
    ``reuse_port``: the ports bound with SO_REUSEPORT, so several worker processes share
    them (the kernel spreads connections over the workers)."""

    members: ClusterMembers
    registry: ClientRegistry
    on_ready: Callable[[], Awaitable[object]] | None = None
    reuse_port: bool = False


async def serve_front_end(
    config: Config,
    broker: Broker,
    *,
    stop: asyncio.Event | None = None,
    tick: bool = True,
    started: float | None = None,
    source: str = "",
    guard: Guard | None = None,
    listeners: Listeners | None = None,
    amqp: AmqpBacking | None = None,
    cluster: ClusterRole | None = None,
    on_reload: Callable[[], object] | None = None,
) -> None:
    """The gRPC endpoint, the admin API and (with ``amqp``) the AMQP endpoint in front of
    ``broker`` until ``stop`` is set or a stop signal arrives; the caller opened the broker
    and closes it. ``tick``: run the broker's tick thread here (False when the broker is
    another process, which ticks itself). ``source`` ends the ready line. ``guard``
    authenticates and authorizes every request at every edge (when enabled).
    ``listeners``: the ports, when the caller bound them first (:func:`bind_listeners`);
    otherwise they are bound here. ``on_reload``: called on SIGHUP beside the listeners'
    certificate reload (a proxy re-reads its etcd and internal-protocol certificates)."""
    started = time.monotonic() if started is None else started
    if listeners is None:
        listeners = await bind_listeners(
            config,
            reuse_port=cluster is not None and cluster.reuse_port,
            amqp=amqp is not None,
        )
    front = FrontEnd(config, broker, listeners, stop or asyncio.Event(), guard, cluster, on_reload)
    try:
        await front.start(tick=tick, amqp=amqp)
        front.ready(started, source)
        await front.serve()
    finally:
        await front.close()


class FrontEnd:
    """One life of the front ends: its parts, :meth:`start`, :meth:`serve` and one
    :meth:`close`."""

    def __init__(
        self,
        config: Config,
        broker: Broker,
        listeners: Listeners,
        stop: asyncio.Event,
        guard: Guard | None,
        cluster: ClusterRole | None,
        on_reload: Callable[[], object] | None,
    ) -> None:
        self.config = config
        self.broker = broker
        self.listeners = listeners
        self.stop = stop
        self.admin_guard = guard  # the admin API serves its users and ACLs even when off
        self.guard = guard if guard is not None and guard.enabled else None
        self.cluster = cluster
        self.loop = asyncio.get_running_loop()
        self.lifecycle = Lifecycle(
            config.server.shutdown_grace,
            on_stop=stop.set,
            on_reload=_reloads(listeners.certificates, on_reload),
        )
        self.calls = CallsInFlight()
        self.registry = cluster.registry if cluster is not None else ClientRegistry()
        self.registry.bind_loop(self.loop)
        if isinstance(broker, WatchesArrivals):  # a network hop away: only topics polled on
            self.notifier = ArrivalNotifier(self.loop, watcher=broker)
            broker.add_watched_arrival_listener(self.notifier.on_arrival)
        else:
            self.notifier = ArrivalNotifier(self.loop)
            broker.add_arrival_listener(self.notifier.on_arrival)
        self.executor = ThreadPoolExecutor(
            config.server.worker_threads, thread_name_prefix="halfmoon-rpc"
        )
        self.ticker = TickThread(broker, config.server.tick_interval)
        self.servicer: MessagingServicer | None = None
        self.admin_sock: socket.socket | None = listeners.admin_sock  # until the admin serves
        self.admin: web.AppRunner | None = None
        self.admin_address = ""
        self.amqp: AmqpServer | None = None
        self.amqp_address = "off"
        self.collectors: list[Callable[[], list[MetricFamily]]] = []
        self.signals = contextlib.ExitStack()
        self.janitor: asyncio.Task[None] | None = None
        self.check_sender_set = False

    async def start(self, *, tick: bool, amqp: AmqpBacking | None) -> None:
        """gRPC first, then the admin API, then AMQP, then the tick thread and the signals."""
        config, broker, listeners = self.config, self.broker, self.listeners
        server_config = config.server
        host, bound = listeners.host, listeners.grpc_port
        advertised = advertised_host(host, server_config.advertise_host, wildcard="127.0.0.1")
        self.servicer = servicer = MessagingServicer(
            broker,
            server_config,
            self.registry,
            self.notifier,
            advertised=(advertised, bound),
            executor=self.executor,
        )
        rpc_guard = RpcGuard(self.guard) if self.guard is not None else None
        listeners.server.add_generic_rpc_handlers(
            (
                messaging_handler(servicer, rpc_guard, self.calls),
                bulk_read_handler(
                    BulkReadService(
                        broker, server_config, self.notifier, servicer.workers, rpc_guard
                    )
                ),
            )
        )
        await listeners.server.start()
        await listeners.endpoint.serve()
        # Transaction checks reach producers over their telemetry streams.
        broker.set_check_sender(TelemetryCheckSender(self.registry))
        self.check_sender_set = True
        lite_subscriptions.install_notifier(broker, self.registry)  # NotifyUnsubscribeLiteCommand
        self._collect(_grpc_collector(self.registry, self.notifier))
        if not tick:  # the broker is other processes (which tick themselves): so are its counters
            self._collect(_counted_collector(broker))
        # With port 0 the configured address is not where clients connect: what the admin
        # API reports (cluster page, routes) is the bound one.
        server_config.listen = format_address(host, bound)
        # The admin API serves before the AMQP endpoint: its definitions reach the AMQP
        # topology through this handle, filled in once the endpoint serves.
        amqp_handle = AmqpHandle()
        assert self.admin_sock is not None
        self.admin, self.admin_address = await _start_admin(
            broker, config, self.admin_sock, self.registry, self.admin_guard,
            listeners.certificates,
            cluster=self.cluster.members if self.cluster is not None else None,
            amqp=amqp_handle,
        )  # fmt: skip
        self.admin_sock = None  # the admin runner's now: closed with it
        if listeners.amqp_sock is not None and amqp is not None:
            await self._start_amqp(amqp, amqp_handle)
        if tick:
            self.ticker.start()
        self.signals.enter_context(self.lifecycle.capture_signals(self.loop))
        if self.cluster is not None and self.cluster.on_ready is not None:
            await self.cluster.on_ready()
        freeze_startup_heap(server_config.gc_freeze)

    async def _start_amqp(self, backing: AmqpBacking, handle: AmqpHandle) -> None:
        config, listeners = self.config, self.listeners
        free_bytes = backing.free_bytes
        if free_bytes is None and backing.metadata is not None:
            free_bytes = functools.partial(_free_bytes, config.store.data_dir)
        certificates = listeners.certificates
        self.amqp = amqp = AmqpServer(
            self.broker,
            backing.metadata,
            guard=self.guard,
            executor=self.executor,
            consumer_timeout_ms=round(config.server.amqp_consumer_timeout * 1000),
            topology_store=backing.topology,
            free_bytes=free_bytes,
            disk_free_limit_bytes=config.server.amqp_disk_free_limit_bytes,
            delivery_holder=backing.holder,
            active_claims=backing.active_claims,
            cluster_consumers=backing.cluster_consumers,
        )
        amqp_sock, listeners.amqp_sock = listeners.amqp_sock, None
        assert amqp_sock is not None
        amqp_bound = await amqp.start(
            amqp_sock,
            certificates.ssl_context() if certificates is not None else None,
            permissive=config.tls.mode == "permissive",
        )
        self.amqp_address = format_address(listeners.amqp_host, amqp_bound)
        handle.server = amqp
        self._collect(_amqp_collector(amqp))

    def _collect(self, collector: Callable[[], list[MetricFamily]]) -> None:
        self.collectors.append(collector)
        default_registry().add_collector(collector)

    def ready(self, started: float, source: str) -> None:
        """The one line that says the process serves, with every bound address."""
        certificates = self.listeners.certificates
        log.info(
            "halfmoon ready grpc=%s admin=%s amqp=%s dashboard=%s %s auth=%s tls=%s startup_ms=%d",
            self.config.server.listen,
            self.admin_address,
            self.amqp_address,
            f"{'https' if certificates is not None else 'http'}://{self.admin_address}/dashboard/",
            source,
            "on" if self.guard is not None else "off",
            self.config.tls.mode,
            (time.monotonic() - started) * 1000,
        )

    async def serve(self) -> None:
        """Until stopped; then the drain begins."""
        self.janitor = asyncio.create_task(_expire_idle_clients(self.registry, self.stop))
        await self.stop.wait()
        self.lifecycle.shutdown_begins()

    async def close(self) -> None:
        """Every part closed in one order, each step even if an earlier one failed (the
        broker, the caller's, must get closed after); the first failure raised at the end."""
        failure: BaseException | None = None
        for step in (self._close_edges, self._unhook_broker, self._drain, self._close_rest):
            try:
                await step()
            except BaseException as exc:  # noqa: BLE001 - the remaining steps still run
                failure = failure or exc
        if failure is not None:
            raise failure

    async def _close_edges(self) -> None:
        if self.janitor is not None:
            self.janitor.cancel()
        if self.servicer is not None:
            self.servicer.renewer.close()
        for collector in self.collectors:
            default_registry().remove_collector(collector)
        self.collectors.clear()
        if self.amqp is not None:
            await self.amqp.close()

    async def _unhook_broker(self) -> None:
        if self.check_sender_set:
            self.broker.set_check_sender(None)
            lite_subscriptions.remove_notifier(self.broker)

    async def _drain(self) -> None:
        await _shutdown(
            self.listeners.server,
            self.lifecycle,
            self.calls,
            self.notifier,
            self.registry,
            self.admin,
            self.listeners.endpoint,
        )

    async def _close_rest(self) -> None:
        listeners = self.listeners
        if self.admin_sock is not None:  # bound, never served
            self.admin_sock.close()
        if listeners.amqp_sock is not None:
            listeners.amqp_sock.close()
        if self.ticker.is_alive():
            self.ticker.stop()
        # Waited for off the loop: a request still running there may need the loop to finish
        # (a cluster proxy's broker calls run their etcd parts on it).
        await self.loop.run_in_executor(None, self.executor.shutdown)
        self.signals.close()


class _AdminRunner(web.AppRunner):
    """The admin application's runner; in ``tls.mode=permissive`` it also owns the
    listener that tells HTTP from HTTPS (aiohttp's sites cannot)."""

    permissive: PermissiveAdminListener | None = None

    async def cleanup(self) -> None:
        if self.permissive is not None:
            await self.permissive.close()
        await super().cleanup()


async def _start_admin(
    broker: Broker,
    config: Config,
    sock: socket.socket,
    clients: ClientRegistry | None = None,
    guard: Guard | None = None,
    certificates: Certificates | None = None,
    cluster: ClusterMembers | None = None,
    amqp: AmqpHandle | None = None,
) -> tuple[web.AppRunner, str]:
    """Serve the admin API (an aiohttp application) on ``sock``, bound to
    ``config.server.admin_listen`` (HTTPS with ``certificates``); the runner (for shutdown)
    and the bound address."""
    host, _ = parse_host_port(config.server.admin_listen, what="admin listen address")
    port = int(sock.getsockname()[1])
    app = create_admin_app(broker, config, clients=clients, guard=guard, cluster=cluster, amqp=amqp)
    runner = _AdminRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    ssl_context = certificates.ssl_context() if certificates is not None else None
    if ssl_context is not None and config.tls.mode == "permissive":
        assert runner.server is not None
        listener = PermissiveAdminListener(runner.server, host, port, ssl_context, sock=sock)
        runner.permissive = listener
        listener.start()
        return runner, format_address(host, port)
    site = web.SockSite(runner, sock, ssl_context=ssl_context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, format_address(host, port)


async def _stop_admin(runner: web.AppRunner | None) -> None:
    if runner is not None:
        await runner.cleanup()


def _free_bytes(data_dir: str | Path) -> int | None:
    try:
        return shutil.disk_usage(data_dir).free
    except OSError:
        return None


def _counted_collector(broker: Broker) -> Callable[[], list[MetricFamily]]:
    """A proxy's view of its brokers' own counters (asked for at scrape time)."""
    return lambda: broker_metrics.families_of(broker.counted_metrics())


def _amqp_collector(amqp: AmqpServer) -> Callable[[], list[MetricFamily]]:
    """AMQP connections in ``halfmoon_clients``: kind AMQP, the client's platform as its
    language, its product and version as its version (pika says "pika 1.3.2")."""

    def collect() -> list[MetricFamily]:
        family = MetricFamily(
            "halfmoon_clients",
            "gauge",
            "Known clients by kind, language and client version (as halfmoon_grpc_clients).",
        )
        builds: dict[tuple[str, str], int] = {}
        for connection in list(amqp.connections):
            properties = getattr(connection, "client_properties", None) or {}
            language = _text(properties.get("platform")) or "unknown"
            product = _text(properties.get("product"))
            version = f"{product} {_text(properties.get('version'))}".strip() or "unknown"
            builds[(language, version)] = builds.get((language, version), 0) + 1
        for (language, version), count in sorted(builds.items()):
            family.add(count, kind="AMQP", language=language, version=version)
        return [family]

    return collect


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


def _grpc_collector(
    registry: ClientRegistry, notifier: ArrivalNotifier
) -> Callable[[], list[MetricFamily]]:
    """Scrape-time gauges of the gRPC front end (they live in the registry and notifier)."""

    def collect() -> list[MetricFamily]:
        sessions = registry.sessions()
        clients = MetricFamily(
            "halfmoon_grpc_clients",
            "gauge",
            "Known clients by type (a telemetry stream now, else a heartbeat in 5 minutes).",
        )
        by_type: dict[str, int] = {}
        for session in sessions:
            kind = session.describe()["client_type"]
            by_type[str(kind)] = by_type.get(str(kind), 0) + 1
        for kind, count in sorted(by_type.items()):
            clients.add(count, client_type=kind)
        by_build = MetricFamily(
            "halfmoon_clients",
            "gauge",
            "Known clients by kind, language and client version (as halfmoon_grpc_clients).",
        )
        builds: dict[tuple[str, str, str], int] = {}
        for session in sessions:
            described = session.describe()
            key = (str(described["client_type"]), str(described["language"]))
            build = (*key, str(described["version"]))
            builds[build] = builds.get(build, 0) + 1
        for (kind, language, version), count in sorted(builds.items()):
            by_build.add(count, kind=kind, language=language, version=version)
        streams = MetricFamily(
            "halfmoon_grpc_telemetry_streams",
            "gauge",
            "Open telemetry streams (clients reachable by command).",
        )
        streams.add(sum(1 for s in sessions if s.has_stream))
        parked = MetricFamily(
            "halfmoon_grpc_long_polls", "gauge", "Receive/pull requests waiting for a message."
        )
        parked.add(notifier.parked())
        return [clients, by_build, streams, parked]

    return collect


async def _shutdown(
    server: grpc.aio.Server,
    lifecycle: Lifecycle,
    calls: CallsInFlight,
    notifier: ArrivalNotifier,
    registry: ClientRegistry,
    admin: web.AppRunner | None,
    endpoint: GrpcEndpoint | None = None,
) -> None:
    notifier.wake_all()
    registry.close_all()
    if endpoint is not None:  # no new connections; open ones drain through gRPC's stop
        endpoint.stop_accepting()
    # gRPC's own grace is a backstop past the drain's deadline: the drain cancels what is
    # left itself, so that it can say how much.
    await lifecycle.drain_async(
        server.stop(2 * lifecycle.grace_s + 1), lambda: len(calls), lambda: server.stop(0)
    )
    if endpoint is not None:
        await endpoint.close()
    try:
        await _stop_admin(admin)
    except Exception:  # noqa: BLE001 - the store still gets closed
        log.exception("event=admin_stop_failed")


async def _expire_idle_clients(registry: ClientRegistry, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(30)
        registry.expire_idle()


def _reloads(
    certificates: Certificates | None, on_reload: Callable[[], object] | None
) -> Callable[[], None] | None:
    """What SIGHUP does: re-read the listeners' certificates, then ``on_reload``."""
    reloads: list[Callable[[], object]] = [] if on_reload is None else [on_reload]
    if certificates is not None:
        reloads.insert(0, certificates.reload)
    if not reloads:
        return None

    def reload() -> None:
        for each in reloads:
            each()

    return reload
