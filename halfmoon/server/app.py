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
  mark). A second signal skips the wait.

The front end (:func:`serve_front_end`: gRPC, admin API, sessions) takes any
``Broker``; ``halfmoon proxy`` runs it in front of a broker in another
process (``halfmoon.cluster.proxy_process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from aiohttp import web

from halfmoon.auth import Guard, local_guard
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.facade import Broker, WatchesArrivals
from halfmoon.config import Config, ServerConfig, parse_host_port
from halfmoon.gc_tuning import freeze_startup_heap
from halfmoon.metrics import MetricFamily, default_registry
from halfmoon.server import lite_subscriptions
from halfmoon.server.admin import create_admin_app
from halfmoon.server.admin_http import ClusterMembers
from halfmoon.server.bulk_rpc import BulkReadService, bulk_read_handler
from halfmoon.server.edge_security import Certificates, check_exposure
from halfmoon.server.grpc_endpoint import GrpcEndpoint, format_address
from halfmoon.server.grpc_service import MessagingServicer
from halfmoon.server.handlers import messaging_handler
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.permissive_admin import PermissiveAdminListener
from halfmoon.server.rpc_guard import RpcGuard
from halfmoon.server.telemetry import ClientRegistry, TelemetryCheckSender
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
    clients: ClientRegistry | None = None,
    guard: Guard | None = None,
    certificates: Certificates | None = None,
    reuse_port: bool = False,
    cluster: ClusterMembers | None = None,
) -> tuple[web.AppRunner, str]:
    """Serve the admin API (an aiohttp application) on ``config.server.admin_listen``
    (HTTPS with ``certificates``); the runner (for shutdown) and the bound address."""
    host, port = parse_host_port(config.server.admin_listen, what="admin listen address")
    app = create_admin_app(broker, config, clients=clients, guard=guard, cluster=cluster)
    runner = _AdminRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    ssl_context = certificates.ssl_context() if certificates is not None else None
    if ssl_context is not None and config.tls.mode == "permissive":
        assert runner.server is not None
        try:
            listener = PermissiveAdminListener(
                runner.server, host, port, ssl_context, reuse_port=reuse_port
            )
        except BaseException:
            await runner.cleanup()
            raise
        runner.permissive = listener
        listener.start()
        return runner, format_address(host, listener.port)
    site = web.TCPSite(
        runner,
        host,
        port,
        reuse_address=True,
        reuse_port=reuse_port or None,
        ssl_context=ssl_context,
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = port  # the real port when 0 was asked for
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound = address[1]
            break
    return runner, format_address(host, bound)


async def _stop_admin(runner: web.AppRunner | None) -> None:
    if runner is not None:
        await runner.cleanup()


def _open_store_and_broker(config: Config) -> tuple[MessageStore, InProcessBroker]:
    store = MessageStore(config.store)
    try:
        metadata_dir = Path(config.store.data_dir) / METADATA_DIR_NAME
        broker = InProcessBroker(
            store, metadata_dir, config.broker, transaction_config=config.transaction
        )
    except BaseException:
        store.close()
        raise
    return store, broker


async def serve(config: Config, *, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set or SIGTERM/SIGINT arrives; then shut down cleanly."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    check_exposure(config)
    guard = local_guard(config.auth, Path(config.store.data_dir))
    store, broker = await loop.run_in_executor(None, _open_store_and_broker, config)
    try:
        await serve_front_end(
            config,
            broker,
            stop=stop,
            tick=True,
            started=started,
            source=f"data={config.store.data_dir}",
            guard=guard,
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
    clients' sessions, when the caller publishes them (a cluster proxy's session directory)."""
    server_config: ServerConfig = config.server
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    force = asyncio.Event()
    host, port = parse_host_port(server_config.listen, what="listen address")
    started = time.monotonic() if started is None else started
    registry = registry or ClientRegistry()
    registry.bind_loop(loop)
    if isinstance(broker, WatchesArrivals):  # a network hop away: only topics polled on
        notifier = ArrivalNotifier(loop, watcher=broker)
        broker.add_watched_arrival_listener(notifier.on_arrival)
    else:
        notifier = ArrivalNotifier(loop)
        broker.add_arrival_listener(notifier.on_arrival)
    executor = ThreadPoolExecutor(server_config.worker_threads, thread_name_prefix="halfmoon-rpc")
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", server_config.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ]
    )
    ticker = TickThread(broker, server_config.tick_interval)
    admin = None
    endpoint: GrpcEndpoint | None = None
    try:
        certificates = Certificates(config.tls) if config.tls.mode != "disabled" else None
        endpoint = GrpcEndpoint(
            server, host, port, server_config.listen, certificates, reuse_port=reuse_port
        )
        bound = await endpoint.bind()
        advertised_host = server_config.advertise_host or (
            host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"
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
                messaging_handler(servicer, rpc_guard),
                bulk_read_handler(BulkReadService(servicer, rpc_guard)),
            )
        )
        await server.start()
        await endpoint.serve()
        # Transaction checks reach producers over their telemetry streams.
        broker.set_check_sender(TelemetryCheckSender(registry))
        lite_subscriptions.install_notifier(broker, registry)  # NotifyUnsubscribeLiteCommand
        collector = _grpc_collector(registry, notifier)
        default_registry().add_collector(collector)
        admin, admin_address = await _start_admin(
            broker,
            config,
            registry,
            guard,
            certificates,
            reuse_port=reuse_port,
            cluster=cluster,
        )
        if tick:
            ticker.start()
        _install_signal_handlers(loop, stop, force, certificates, on_reload)
        freeze_startup_heap(server_config.gc_freeze)
        log.info(
            "halfmoon ready grpc=%s admin=%s %s auth=%s tls=%s startup_ms=%d",
            format_address(host, bound),
            admin_address,
            source,
            "on" if guard is not None and guard.enabled else "off",
            config.tls.mode,
            (time.monotonic() - started) * 1000,
        )
        janitor = asyncio.create_task(_expire_idle_clients(registry, stop))
        await stop.wait()
        janitor.cancel()
        servicer.renewer.close()
        default_registry().remove_collector(collector)
        log.info("event=shutdown_begin grace_s=%s", server_config.shutdown_grace)
    finally:
        # Each step runs even if an earlier one failed: the broker must get closed after.
        try:
            broker.set_check_sender(None)
            lite_subscriptions.remove_notifier(broker)
        finally:
            try:
                await _shutdown(server, server_config, notifier, registry, force, admin, endpoint)
            finally:
                if ticker.is_alive():
                    ticker.stop()
                executor.shutdown(wait=True, cancel_futures=False)
                _remove_signal_handlers(loop)


def _grpc_collector(
    registry: ClientRegistry, notifier: ArrivalNotifier
) -> Callable[[], list[MetricFamily]]:
    """Scrape-time gauges of the gRPC front end (they live in the registry and notifier)."""

    def collect() -> list[MetricFamily]:
        sessions = registry.sessions()
        clients = MetricFamily(
            "halfmoon_grpc_clients",
            "gauge",
            "Known clients by type (heartbeat or stream in the last 5 minutes).",
        )
        by_type: dict[str, int] = {}
        for session in sessions:
            kind = session.describe()["client_type"]
            by_type[str(kind)] = by_type.get(str(kind), 0) + 1
        for kind, count in sorted(by_type.items()):
            clients.add(count, client_type=kind)
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
        return [clients, streams, parked]

    return collect


async def _shutdown(
    server: grpc.aio.Server,
    config: ServerConfig,
    notifier: ArrivalNotifier,
    registry: ClientRegistry,
    force: asyncio.Event,
    admin: web.AppRunner | None,
    endpoint: GrpcEndpoint | None = None,
) -> None:
    notifier.wake_all()
    registry.close_all()
    if endpoint is not None:  # no new connections; open ones drain through gRPC's stop
        endpoint.stop_accepting()
    stopping = asyncio.ensure_future(server.stop(config.shutdown_grace))
    forced = asyncio.ensure_future(force.wait())
    done, _ = await asyncio.wait({stopping, forced}, return_when=asyncio.FIRST_COMPLETED)
    if forced in done and not stopping.done():
        log.warning("event=shutdown_forced")
        await server.stop(0)
        with contextlib.suppress(Exception):
            await stopping
    forced.cancel()
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


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop,
    stop: asyncio.Event,
    force: asyncio.Event,
    certificates: Certificates | None = None,
    on_reload: Callable[[], object] | None = None,
) -> None:
    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("event=signal_again signal=%s action=force", signal.Signals(signum).name)
            force.set()
        else:
            log.info("event=signal signal=%s action=shutdown", signal.Signals(signum).name)
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, on_signal, signum)
    reloads: list[Callable[[], object]] = [] if on_reload is None else [on_reload]
    if certificates is not None:
        reloads.insert(0, certificates.reload)

    def reload() -> None:
        for each in reloads:
            each()

    if reloads:  # SIGHUP: new handshakes get the re-read certificates
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, reload)


def _remove_signal_handlers(loop: asyncio.AbstractEventLoop) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signum)


def configure_logging(level: int = logging.INFO) -> None:
    """One event per line on stderr, unless the host program configured logging already."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


def run(config: Config) -> int:
    """Serve until signalled; the process exit status."""
    configure_logging()
    asyncio.run(serve(config))
    return 0
