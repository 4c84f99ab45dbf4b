"""``halfmoon proxy --coordinator etcd://… --cluster NAME``: a proxy in front of every broker.

One worker process: it follows the cluster in etcd (a :class:`ClusterView`),
keeps a connection to each live broker, and serves the RocketMQ 5 endpoint
and the admin API over a :class:`ClusterBroker`. ``--workers N`` runs N such
processes sharing the listening ports (``SO_REUSEPORT``; the kernel spreads
connections over them); the parent supervises them and holds the proxy's
registration in etcd (one member per proxy, whatever its worker count), so a
SIGKILLed proxy machine disappears from the cluster after its lease.

Every worker is interchangeable: nothing a client does is remembered in a
worker but its sessions and telemetry streams, which the client re-opens on
another worker or proxy after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from halfmoon.broker.facade import Broker
from halfmoon.cluster.coordination.amqp_active import EtcdActiveClaims
from halfmoon.cluster.coordination.amqp_consumers import EtcdClusterConsumers
from halfmoon.cluster.coordination.amqp_topology import EtcdTopologyStore
from halfmoon.cluster.coordination.auth_store import EtcdAuthStore, cluster_guard
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.keys import check_name
from halfmoon.cluster.coordination.members import read_members
from halfmoon.cluster.coordination.membership import Membership
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.coordination.registration import register_member
from halfmoon.cluster.coordination.switchover import request_switchover
from halfmoon.cluster.coordination.view import ClusterView
from halfmoon.cluster.internal.delivery_holders import lease_holder
from halfmoon.cluster.internal.peer_tls import PeerTls
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.proxy.cluster_broker import ClusterBroker
from halfmoon.cluster.proxy.command_relay import CommandRelay, VerifyRequest
from halfmoon.cluster.proxy.replication_view import add_progress, replication_collector
from halfmoon.cluster.proxy.session_directory import SessionDirectory
from halfmoon.config import Config, parse_host_port
from halfmoon.errors import HalfmoonError
from halfmoon.lifecycle import Lifecycle, run_event_loop
from halfmoon.listen.addresses import advertised_host, format_address
from halfmoon.logs import configure_logging
from halfmoon.metrics import default_registry
from halfmoon.server.client_commands import ClientAnswer, ClientNotConnected
from halfmoon.server.direct_consume import consume_here
from halfmoon.server.edge_security import check_exposure
from halfmoon.server.front_end import AmqpBacking, ClusterRole, serve_front_end
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.shutdown_signals import SUPERVISOR_STOP, stop_with_supervisor

log = logging.getLogger("halfmoon.cluster")

# How long the admin API's member listing waits for a broker's answer before calling it
# unreachable (the dashboard's overview asks every 5 s).
REACHABLE_TIMEOUT_S = 1.0
# How long a starting worker waits for the brokers listed in etcd to answer before serving.
FIRST_CONNECT_S = 10.0


@dataclass(frozen=True)
class ProxyIdentity:
    coordinator: str
    cluster: str
    name: str
    endpoint: str  # what clients dial: the advertised host and the listening port
    ttl_s: int

    @classmethod
    def from_config(cls, config: Config) -> ProxyIdentity:
        """Who a cluster proxy is: its endpoint (the advertised host, else the listen host,
        else this machine's name when that is a wildcard, with the listening port) and its
        name (``cluster.proxy_name``, else made of the endpoint); BAD_NAME for a name etcd
        keys cannot hold."""
        assert config.cluster.coordinator is not None and config.cluster.name is not None
        host, port = parse_host_port(config.server.listen, what="listen address")
        advertised = advertised_host(host, config.server.advertise_host)
        name = config.cluster.proxy_name or re.sub(r"[^A-Za-z0-9_.-]", "-", f"{advertised}-{port}")
        check_name("proxy", name)
        return cls(
            config.cluster.coordinator, config.cluster.name, name,
            format_address(advertised, port),
            config.cluster.proxy_lease_ttl_s(),
        )  # fmt: skip


class ProxyMembers:
    """The cluster's members for the proxy's admin API."""

    def __init__(
        self,
        broker: ClusterBroker,
        identity: ProxyIdentity,
        directory: SessionDirectory,
        relay: CommandRelay,
        tls: PeerTls,
    ) -> None:
        self.tls = tls
        self.directory = directory
        self.relay = relay
        self.broker = broker
        self.identity = identity

    async def sessions(self) -> list[dict[str, Any]]:
        return await self.directory.all_sessions()

    async def consume_elsewhere(
        self, client_id: str, group: str, message_id: str, topic: str, timeout_s: float
    ) -> ClientAnswer:
        """consumeMessageDirectly by a client of another worker, relayed to that worker."""
        holders = [
            s["worker"]
            for s in await self.directory.elsewhere(client_id)
            if s.get("group") == group and s.get("stream") and isinstance(s.get("worker"), str)
        ]
        if not holders:
            raise ClientNotConnected(
                f"no consumer {client_id!r} of group {group!r} is connected to any proxy of "
                f"the cluster: list them with 'halfmoon consumer status {group}'"
            )
        request = VerifyRequest(client_id, group, message_id, topic, timeout_s)
        # A client that moved to another worker stays listed on the one it left until
        # that worker republishes (about a second) or its lease ends: a worker that says
        # it no longer holds the client sends us to the next. Any other answer is final,
        # so the client runs the command once at most and the caller's wait stays one
        # relay's.
        for holder in holders[:-1]:
            try:
                return await self.relay.forward(holder, request)
            except ClientNotConnected:
                continue
        return await self.relay.forward(holders[-1], request)

    def member(self, name: str) -> Broker:
        return self.broker.broker(name)

    def members(self) -> dict[str, Any]:
        """Every member from etcd; each broker also says whether this proxy reaches it now
        (a broker killed a moment ago still holds its lease until it expires)."""
        answer = read_members(
            parse_coordinator(self.identity.coordinator), self.identity.cluster, tls=self.tls.etcd
        )
        connected = self.broker.connected()
        for broker in answer["brokers"]:
            remote = connected.get(broker["name"])
            broker["reachable"] = remote is not None and _answers(remote)
        add_progress(answer.get("broker_groups", []), self.tls.internal)
        return answer

    def unused_topics(self, delete: bool) -> dict[str, Any]:
        """The topics brokers hold that etcd does not route (deleted with ``delete``)."""
        found = self.broker.unused_topics(delete=delete)
        return {
            "deleted": delete,
            "topics": [{"broker": broker, "topic": topic} for broker, topic in found],
        }

    def switchover(self, group: str, to: str | None) -> dict[str, Any]:
        endpoints = parse_coordinator(self.identity.coordinator)
        return request_switchover(endpoints, self.identity.cluster, group, to, tls=self.tls.etcd)


def least_free_bytes(view: ClusterView) -> int | None:
    """The least free disk of the live brokers as they last reported it (every 30 s), for
    the AMQP disk alarm: as in a RabbitMQ cluster, one node short of disk blocks the
    publishers of all (a message may be placed on any broker). None: none reported."""
    reported = [
        record["disk_free_bytes"]
        for record in view.brokers.values()
        if isinstance(record.get("disk_free_bytes"), int)
    ]
    return min(reported) if reported else None


def _answers(remote: RemoteBroker) -> bool:
    try:
        remote.connection.hello(timeout_s=REACHABLE_TIMEOUT_S)
    except HalfmoonError:
        return False
    return True


async def serve_cluster_proxy(
    config: Config,
    identity: ProxyIdentity,
    *,
    register: bool = True,
    reuse_port: bool = False,
    stop: asyncio.Event | None = None,
    ready_fd: int | None = None,
) -> None:
    """One worker: serve until ``stop`` is set or SIGTERM/SIGINT arrives. ``ready_fd``: a
    pipe to the supervising parent, told ``ready`` once this worker serves."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    check_exposure(config)
    tls = PeerTls.from_config(config)
    client = EtcdClient.from_url(identity.coordinator, tls=tls.etcd)
    view = ClusterView(client, identity.cluster)
    member = None
    active: EtcdActiveClaims | None = None
    consumers: EtcdClusterConsumers | None = None
    follower = None
    freshener = None
    # Users and ACLs from etcd, read before serving and followed while serving (every
    # proxy answers the same); None when this proxy keeps none (see cluster_guard).
    guard = await loop.run_in_executor(
        None, cluster_guard, config.auth, client.endpoints, identity.cluster, tls.etcd
    )
    auth_follower = (
        asyncio.create_task(guard.store.follow(client), name="users and ACLs")
        if guard is not None and isinstance(guard.store, EtcdAuthStore)
        else None
    )
    broker = ClusterBroker(view, ClusterMetadata(client, identity.cluster), loop, tls=tls.internal)
    registry = ClientRegistry()  # published for every proxy's admin API (session_directory)
    directory = SessionDirectory(client, identity.cluster, identity.name, registry, identity.ttl_s)

    async def execute(request: VerifyRequest) -> ClientAnswer:
        return await consume_here(
            registry,
            broker,
            request.client_id,
            request.group,
            request.message_id,
            request.topic,
            request.timeout_s,
        )

    # Runs what other workers relay to this one's clients (message get --client).
    relay = CommandRelay(client, identity.cluster, directory.worker, execute)
    replication = replication_collector(client.endpoints, identity.cluster, tls)
    default_registry().add_collector(replication)
    try:
        await view.start()
        # Connect to the brokers listed now, so the first clients find every queue.
        await asyncio.wait_for(loop.run_in_executor(None, broker.sync_connections), FIRST_CONNECT_S)
        follower = asyncio.create_task(broker.follow_view(), name="broker connections")
        freshener = asyncio.create_task(broker.keep_writability_fresh(), name="writability")
        member = (
            Membership(
                client,
                identity.cluster,
                "proxy",
                identity.name,
                identity.endpoint,
                {"workers": 1},
                ttl_s=identity.ttl_s,
            )
            if register
            else None
        )

        async def serving() -> None:
            # Listed in etcd (or reported to the supervising parent) only once both ports
            # are bound: a proxy that cannot bind is never shown live by cluster list.
            if member is not None:
                await member.start()
            if ready_fd is not None:
                os.write(ready_fd, b"ready\n")
                os.close(ready_fd)

        await relay.start()  # before the directory names this worker as a client's holder
        await directory.start()
        active = EtcdActiveClaims(
            client, identity.cluster, directory.worker, lambda: directory.lease
        )
        await active.start()
        consumers = EtcdClusterConsumers(
            client, identity.cluster, directory.worker, lambda: directory.lease
        )
        await consumers.start()
        await serve_front_end(
            config,
            broker,
            stop=stop,
            tick=False,
            started=started,
            source=f"cluster={identity.cluster} proxy={identity.name}",
            guard=guard,
            on_reload=tls.reload,
            cluster=ClusterRole(
                ProxyMembers(broker, identity, directory, relay, tls),
                registry,
                on_ready=serving,
                reuse_port=reuse_port,
            ),
            amqp=AmqpBacking(
                topology=EtcdTopologyStore(client, identity.cluster, identity.ttl_s),
                free_bytes=lambda: least_free_bytes(view),
                holder=lambda: lease_holder(directory.lease),
                active_claims=active,
                cluster_consumers=consumers,
            ),
        )
    finally:
        default_registry().remove_collector(replication)
        if auth_follower is not None:
            auth_follower.cancel()
        if active is not None:
            await active.stop()  # before the directory's lease goes, which would end them too
        if consumers is not None:
            await consumers.stop()
        await directory.stop()
        await relay.stop()
        if member is not None:
            await member.stop()
        if follower is not None:
            follower.cancel()
        if freshener is not None:
            freshener.cancel()
        await loop.run_in_executor(None, broker.close)
        await view.stop()
        await client.close()
        log.info("event=stopped")


def run_cluster_proxy(
    config: Config,
    identity: ProxyIdentity,
    workers: int = 1,
    *,
    worker: bool = False,
    ready_fd: int | None = None,
    supervisor: int | None = None,
) -> int:
    """Serve until signalled (one process, or ``workers`` worker processes); the exit status.

    ``worker``: this process is one of a supervised proxy's workers (it shares the ports
    and does not register: its parent does, once every worker said ``ready`` on its
    ``ready_fd``); it stops when its ``supervisor`` (the parent's pid) ends."""
    configure_logging(config.log)
    if worker and supervisor is not None:
        stop_with_supervisor(supervisor)
    if workers <= 1:
        run_event_loop(
            serve_cluster_proxy(
                config, identity, register=not worker, reuse_port=worker, ready_fd=ready_fd
            )
        )
        return 0
    with _shared_amqp_port(config) as amqp_listen:
        # The supervisor registers in etcd too.
        return _supervise(identity, workers, EtcdTls(config.etcd), amqp_listen)


@contextlib.contextmanager
def _shared_amqp_port(config: Config) -> Iterator[str | None]:
    """The AMQP address every worker binds. Port 0 would give each worker a port of its
    own: the supervisor picks one (bound with SO_REUSEPORT, held until the workers end so
    nothing else takes it) and hands it to them, so they share it as they share the gRPC
    port."""
    listen = config.server.amqp_listen
    if not listen:
        yield None
        return
    host, port = parse_host_port(listen, what="AMQP listen address")
    if port != 0:
        yield None
        return
    # Bound, never listening: a listening socket here would be given connections too.
    holder = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind((host or "0.0.0.0", 0))
        yield format_address(host, holder.getsockname()[1])
    finally:
        holder.close()


def _supervise(
    identity: ProxyIdentity, workers: int, etcd_tls: EtcdTls, amqp_listen: str | None = None
) -> int:
    """Start the workers (this command again, one worker each, sharing the ports), register
    the proxy once every worker serves, wait; pass its stop requests (drain, force) and
    SIGHUP on to the workers and stop when they all have. A worker that ends before it
    serves (a port taken, etcd down) stops the others, and the proxy exits without ever
    being listed."""
    argv = _worker_argv(sys.argv[1:])
    if amqp_listen is not None:
        argv += ["--amqp-listen", amqp_listen]
    children: list[subprocess.Popen[bytes]] = []
    # Its own decisions only (a drain, then a force), as SUPERVISOR_STOP: a worker tells
    # them from the copy of the same signal a process group's kill gave it directly. The
    # workers drain; the supervisor waits for them.
    lifecycle = Lifecycle(
        0,
        on_stop=lambda: _signal_all(children, SUPERVISOR_STOP),
        on_force=lambda: _signal_all(children, SUPERVISOR_STOP),
        on_reload=lambda: _signal_all(children, signal.SIGHUP),  # workers re-read certificates
    )
    with lifecycle.capture_signals():
        return _run_workers(identity, workers, etcd_tls, argv, children, lifecycle)


def _run_workers(
    identity: ProxyIdentity,
    workers: int,
    etcd_tls: EtcdTls,
    argv: list[str],
    children: list[subprocess.Popen[bytes]],
    lifecycle: Lifecycle,
) -> int:
    readiness: list[int] = []
    for _ in range(workers):
        read_end, write_end = os.pipe()
        handoff = ["--ready-fd", str(write_end), "--supervisor-pid", str(os.getpid())]
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", "halfmoon", *argv, *handoff],
                pass_fds=(write_end,),
            )
        )
        os.close(write_end)  # the child's copy is the only one: EOF when it ends
        readiness.append(read_end)
    ready = [_told_ready(read_end) for read_end in readiness]
    deregister = None
    if all(ready):
        deregister = register_member(
            identity.coordinator,
            identity.cluster,
            "proxy",
            identity.name,
            identity.endpoint,
            {"workers": workers},
            ttl_s=identity.ttl_s,
            tls=etcd_tls,
        )
    else:
        log.error("event=workers_failed ready=%d of=%d", sum(ready), workers)
        if not lifecycle.stopping.is_set():  # a stop passed on twice would force
            _signal_all(children, SUPERVISOR_STOP)
    try:
        statuses = [child.wait() for child in children]
    finally:
        if deregister is not None:
            deregister()
    log.info("event=workers_stopped statuses=%s pid=%d", statuses, os.getpid())
    if not all(ready):
        return max(max(statuses, default=0), 1)
    return max(statuses, default=0)


def _signal_all(children: Sequence[subprocess.Popen[bytes]], signum: int) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


def _told_ready(read_end: int) -> bool:
    """Whether the worker at the other end of the pipe said ``ready`` before it ended."""
    try:
        with os.fdopen(read_end, "rb") as pipe:
            return pipe.readline().strip() == b"ready"
    except OSError:
        return False


def _worker_argv(argv: Sequence[str]) -> list[str]:
    """This command's arguments for one worker: ``--workers 1 --worker`` (no registration)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return [*out, "--workers", "1", "--worker"]
