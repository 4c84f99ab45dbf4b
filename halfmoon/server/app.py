"""``halfmoon serve``: one process with the store, the broker, gRPC and the admin API.

Lifecycle (as uvicorn's): startup → serve → shutdown.

- startup: open the store (crash recovery happens here), the broker on it
  (with the ``transaction`` section; its recovery redoes any commit a crash
  cut short), the gRPC server, the admin API; point transaction checks at
  the producers' telemetry streams; start the tick thread (``broker.tick()``
  every ``tick_interval``: due delay messages, transaction check scans,
  offset and consumption snapshots); log one ready line with the bound
  addresses.
- shutdown (SIGTERM / SIGINT): stop accepting, wake every parked long poll
  and end every telemetry stream so in-flight RPCs finish, wait up to
  ``shutdown_grace`` for the rest, then close the broker (persists offsets
  and consumption state) and the store (flush, checkpoint, clean-shutdown
  mark). A second request skips the wait; copies of one (a process group's
  signal, a supervisor's) are one request (:mod:`halfmoon.shutdown_signals`).

The front end (:func:`serve_front_end`: gRPC, admin API, sessions) takes any
``Broker``; ``halfmoon proxy`` runs it in front of a broker in another
process (``halfmoon.cluster.proxy.proxy_process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from aiohttp import web

from halfmoon.amqp import AmqpServer
from halfmoon.amqp.server import ActiveClaims
from halfmoon.amqp.topology import TopologyStore
from halfmoon.auth import Guard, local_guard
from halfmoon.broker import broker_metrics
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.facade import Broker, WatchesArrivals
from halfmoon.config import Config, ServerConfig, parse_host_port
from halfmoon.gc_tuning import freeze_startup_heap
from halfmoon.lifecycle import CallsInFlight, Lifecycle
from halfmoon.listen.addresses import WILDCARD_HOSTS, format_address
from halfmoon.listen.permissive import PermissiveAdminListener
from halfmoon.logs import configure_logging
from halfmoon.metrics import MetricFamily, default_registry
from halfmoon.server import lite_subscriptions
from halfmoon.server.admin import create_admin_app
from halfmoon.server.admin_definitions import AmqpHandle
from halfmoon.server.admin_http import ClusterMembers
from halfmoon.server.bulk_rpc import BulkReadService, bulk_read_handler
from halfmoon.server.check_sender import TelemetryCheckSender
from halfmoon.server.edge_security import Certificates, check_exposure
from halfmoon.server.grpc_endpoint import GrpcEndpoint
from halfmoon.server.grpc_service import MessagingServicer
from halfmoon.server.handlers import messaging_handler
from halfmoon.server.listeners import Listeners, bind_listeners
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.rpc_guard import RpcGuard
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.store.dirlock import holding_data_dir
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.server")

METADATA_DIR_NAME = "metadata"


class TickThread(threading.Thread):
    """Calls ``broker.tick()`` every ``interval`` seconds; a failing tick is logged, not fatal.

    While a transaction check scan is under way (``tick()`` says True) the
    next tick follows at once: each tick works on the scan for at most its
    budget (``transaction.check_tick_budget_ms``) and then lets the delay
    timer and the periodic persistence run, so they are not starved, but the
    scan is no longer idle between ticks (it was two thirds of the time).
    """

    def __init__(self, broker: Broker, interval: float) -> None:
        super().__init__(name="halfmoon-tick", daemon=True)
        self._broker = broker
        self._interval = interval
        self._stopping = threading.Event()

    def run(self) -> None:
        failures = 0
        wait = self._interval
        while not self._stopping.wait(wait):
            more = False
            try:
                more = self._broker.tick()
                failures = 0
            except Exception:  # noqa: BLE001 - keep ticking; say so once per streak
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.exception("event=tick_failed failures=%d", failures)
            wait = 0 if more else self._interval

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)


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


def _open_store_and_broker(config: Config) -> tuple[MessageStore, InProcessBroker]:
    store = MessageStore(config.store)
    try:
        metadata_dir = Path(config.store.data_dir) / METADATA_DIR_NAME
        broker = InProcessBroker(
            store,
            metadata_dir,
            config.broker,
            transaction_config=config.transaction,
            journal_offsets=True,  # an answered ack or offset commit is as durable as a send
        )
    except BaseException:
        store.close()
        raise
    return store, broker


async def serve(config: Config, *, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set or SIGTERM/SIGINT arrives; then shut down cleanly.

    Startup order is what keeps a second process harmless: the data directory's lock first
    (:mod:`halfmoon.store.dirlock`; refused with ``DATA_DIR_LOCKED`` while another process
    holds it), then both ports (a taken port fails here), and only then anything in the data
    directory (users, store, metadata)."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    check_exposure(config)
    with holding_data_dir(config.store.data_dir, "halfmoon serve"):
        listeners = await bind_listeners(config, amqp=True)
        try:
            guard = local_guard(config.auth, Path(config.store.data_dir))
            store, broker = await loop.run_in_executor(None, _open_store_and_broker, config)
        except BaseException:
            await listeners.close()
            raise
        try:
            await serve_front_end(
                config,
                broker,
                stop=stop,
                tick=True,
                started=started,
                source=f"data={config.store.data_dir}",
                guard=guard,
                listeners=listeners,
                amqp_metadata=Path(config.store.data_dir) / METADATA_DIR_NAME,
            )
        finally:
            # Each step runs even if an earlier one failed: the store must get closed.
            try:
                broker.close()
            finally:
                store.close()
                log.info("event=stopped")


async def serve_front_end(
    config: Config,
    broker: Broker,
    *,
    stop: asyncio.Event | None = None,
    tick: bool = True,
    started: float | None = None,
    source: str = "",
    guard: Guard | None = None,
    reuse_port: bool = False,
    cluster: ClusterMembers | None = None,
    on_reload: Callable[[], object] | None = None,
    registry: ClientRegistry | None = None,
    listeners: Listeners | None = None,
    on_ready: Callable[[], Awaitable[object]] | None = None,
    amqp_metadata: Path | None = None,
    amqp_topology: TopologyStore | None = None,
    amqp_free_bytes: Callable[[], int | None] | None = None,
    amqp_holder: Callable[[], str] | None = None,
    amqp_active: ActiveClaims | None = None,
) -> None:
    """The gRPC endpoint and the admin API in front of ``broker`` until stopped; the caller
    opened the broker and closes it. ``tick``: run the broker's tick thread here (False when
    the broker is another process, which ticks itself). ``source`` ends the ready line.
    ``reuse_port``: bind both ports with SO_REUSEPORT, so several worker processes share
    them (the kernel spreads connections over the workers). ``cluster``: in cluster mode,
    the cluster's members, for the admin API (``?broker=NAME``, ``cluster list``).
    ``guard`` authenticates and authorizes every request at both edges (when enabled).
    ``on_reload``: called on SIGHUP beside the listeners' certificate reload (a cluster
    proxy re-reads its etcd and internal-protocol certificates). ``registry``: the connected
    clients' sessions, when the caller publishes them (a cluster proxy's session directory).
    ``listeners``: the ports, when the caller bound them first (:func:`bind_listeners`);
    otherwise they are bound here. ``on_ready``: awaited once both listeners are bound and
    serving, before the ready line (a cluster proxy registers in etcd then: never listed
    while it cannot serve). ``amqp_metadata``: the data directory's metadata, where
    ``halfmoon serve``'s AMQP endpoint keeps its exchanges, queues and bindings;
    ``amqp_topology``: where a cluster proxy keeps them instead (etcd). With either,
    ``server.amqp_listen`` is served (bound here with the other ports unless ``listeners``
    holds it). ``amqp_free_bytes``: the free space where messages are stored, for the AMQP
    disk alarm (default: the data directory's, when ``amqp_metadata`` names one).
    ``amqp_holder``: who holds the AMQP endpoint's deliveries (a cluster proxy's lease:
    ``Messaging.receive``'s ``holder``). ``amqp_active``: where single active consumers are
    agreed on with the other proxies' workers."""
    server_config: ServerConfig = config.server
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    started = time.monotonic() if started is None else started
    serves_amqp = amqp_metadata is not None or amqp_topology is not None
    if listeners is None:
        listeners = await bind_listeners(config, reuse_port=reuse_port, amqp=serves_amqp)
    server, endpoint, certificates = listeners.server, listeners.endpoint, listeners.certificates
    lifecycle = Lifecycle(
        server_config.shutdown_grace, on_stop=stop.set, on_reload=_reloads(certificates, on_reload)
    )
    calls = CallsInFlight()
    host, bound = listeners.host, listeners.grpc_port
    registry = registry or ClientRegistry()
    registry.bind_loop(loop)
    if isinstance(broker, WatchesArrivals):  # a network hop away: only topics polled on
        notifier = ArrivalNotifier(loop, watcher=broker)
        broker.add_watched_arrival_listener(notifier.on_arrival)
    else:
        notifier = ArrivalNotifier(loop)
        broker.add_arrival_listener(notifier.on_arrival)
    executor = ThreadPoolExecutor(server_config.worker_threads, thread_name_prefix="halfmoon-rpc")
    ticker = TickThread(broker, server_config.tick_interval)
    admin = None
    admin_sock: socket.socket | None = listeners.admin_sock
    amqp: AmqpServer | None = None
    signals = contextlib.ExitStack()
    try:
        advertised_host = server_config.advertise_host or (
            host if host not in WILDCARD_HOSTS else "127.0.0.1"
        )
        servicer = MessagingServicer(
            broker,
            server_config,
            registry,
            notifier,
            advertised=(advertised_host, bound),
            executor=executor,
        )
        rpc_guard = RpcGuard(guard) if guard is not None and guard.enabled else None
        server.add_generic_rpc_handlers(
            (
                messaging_handler(servicer, rpc_guard, calls),
                bulk_read_handler(
                    BulkReadService(broker, server_config, notifier, servicer.workers, rpc_guard)
                ),
            )
        )
        await server.start()
        await endpoint.serve()
        # Transaction checks reach producers over their telemetry streams.
        broker.set_check_sender(TelemetryCheckSender(registry))
        lite_subscriptions.install_notifier(broker, registry)  # NotifyUnsubscribeLiteCommand
        collectors = [_grpc_collector(registry, notifier)]
        if not isinstance(broker, InProcessBroker):  # its counters live in other processes
            collectors.append(_counted_collector(broker))
        for collector in collectors:
            default_registry().add_collector(collector)
        # With port 0 the configured address is not where clients connect: what the admin
        # API reports (cluster page, routes) is the bound one.
        server_config.listen = format_address(host, bound)
        # The admin API serves before the AMQP endpoint: its definitions reach the AMQP
        # topology through this handle, filled in once the endpoint serves.
        amqp_handle = AmqpHandle()
        admin, admin_address = await _start_admin(
            broker, config, listeners.admin_sock, registry, guard, certificates, cluster=cluster,
            amqp=amqp_handle,
        )  # fmt: skip
        admin_sock = None  # the admin runner's now: closed with it
        amqp_address = "off"
        if listeners.amqp_sock is not None and serves_amqp:
            if amqp_free_bytes is None and amqp_metadata is not None:
                amqp_free_bytes = functools.partial(_free_bytes, config.store.data_dir)
            amqp = AmqpServer(
                broker,
                amqp_metadata,
                guard=guard if guard is not None and guard.enabled else None,
                executor=executor,
                consumer_timeout_ms=round(server_config.amqp_consumer_timeout * 1000),
                topology_store=amqp_topology,
                free_bytes=amqp_free_bytes,
                disk_free_limit_bytes=server_config.amqp_disk_free_limit_bytes,
                delivery_holder=amqp_holder,
                active_claims=amqp_active,
            )
            amqp_sock, listeners.amqp_sock = listeners.amqp_sock, None
            amqp_bound = await amqp.start(
                amqp_sock,
                certificates.ssl_context() if certificates is not None else None,
                permissive=config.tls.mode == "permissive",
            )
            amqp_address = format_address(listeners.amqp_host, amqp_bound)
            amqp_handle.server = amqp
            collectors.append(_amqp_collector(amqp))
            default_registry().add_collector(collectors[-1])
        if tick:
            ticker.start()
        signals.enter_context(lifecycle.capture_signals(loop))
        if on_ready is not None:
            await on_ready()
        freeze_startup_heap(server_config.gc_freeze)
        log.info(
            "halfmoon ready grpc=%s admin=%s amqp=%s dashboard=%s %s auth=%s tls=%s startup_ms=%d",
            format_address(host, bound),
            admin_address,
            amqp_address,
            f"{'https' if certificates is not None else 'http'}://{admin_address}/dashboard/",
            source,
            "on" if guard is not None and guard.enabled else "off",
            config.tls.mode,
            (time.monotonic() - started) * 1000,
        )
        janitor = asyncio.create_task(_expire_idle_clients(registry, stop))
        await stop.wait()
        janitor.cancel()
        servicer.renewer.close()
        for collector in collectors:
            default_registry().remove_collector(collector)
        lifecycle.shutdown_begins()
    finally:
        # Each step runs even if an earlier one failed: the broker must get closed after.
        try:
            if amqp is not None:
                await amqp.close()
            broker.set_check_sender(None)
            lite_subscriptions.remove_notifier(broker)
        finally:
            try:
                await _shutdown(server, lifecycle, calls, notifier, registry, admin, endpoint)
            finally:
                if admin_sock is not None:  # bound, never served
                    admin_sock.close()
                if listeners.amqp_sock is not None:
                    listeners.amqp_sock.close()
                if ticker.is_alive():
                    ticker.stop()
                # Waited for off the loop: a request still running there may need the loop
                # to finish (a cluster proxy's broker calls run their etcd parts on it).
                await loop.run_in_executor(None, executor.shutdown)
                signals.close()


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


def run(config: Config) -> int:
    """Serve until signalled; the process exit status."""
    configure_logging(config.log)
    asyncio.run(serve(config))
    return 0
