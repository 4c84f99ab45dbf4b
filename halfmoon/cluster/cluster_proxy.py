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
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from halfmoon.broker.facade import Broker
from halfmoon.cluster import peer_tls
from halfmoon.cluster.auth_store import EtcdAuthStore, cluster_guard
from halfmoon.cluster.cluster_broker import ClusterBroker
from halfmoon.cluster.command_relay import CommandRelay, VerifyRequest
from halfmoon.cluster.etcd import EtcdClient
from halfmoon.cluster.etcd_json import parse_coordinator
from halfmoon.cluster.members import read_members
from halfmoon.cluster.membership import Membership
from halfmoon.cluster.metadata import ClusterMetadata
from halfmoon.cluster.registration import register_member
from halfmoon.cluster.remote_broker import RemoteBroker
from halfmoon.cluster.replication_view import add_progress, replication_collector
from halfmoon.cluster.session_directory import SessionDirectory
from halfmoon.cluster.switchover import request_switchover
from halfmoon.cluster.view import ClusterView
from halfmoon.config import Config
from halfmoon.errors import HalfmoonError
from halfmoon.metrics import default_registry
from halfmoon.server.app import configure_logging, serve_front_end
from halfmoon.server.client_commands import ClientAnswer, ClientNotConnected
from halfmoon.server.direct_consume import consume_here
from halfmoon.server.edge_security import check_exposure
from halfmoon.server.telemetry import ClientRegistry

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


class ProxyMembers:
    """The cluster's members for the proxy's admin API."""

    def __init__(
        self,
        broker: ClusterBroker,
        identity: ProxyIdentity,
        directory: SessionDirectory,
        relay: CommandRelay,
    ) -> None:
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
        answer = read_members(parse_coordinator(self.identity.coordinator), self.identity.cluster)
        connected = self.broker.connected()
        for broker in answer["brokers"]:
            remote = connected.get(broker["name"])
            broker["reachable"] = remote is not None and _answers(remote)
        add_progress(answer.get("broker_groups", []))
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
        return request_switchover(endpoints, self.identity.cluster, group, to)


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
) -> None:
    """One worker: serve until ``stop`` is set or SIGTERM/SIGINT arrives."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    check_exposure(config)
    peer_tls.configure(config)
    client = EtcdClient.from_url(identity.coordinator)
    view = ClusterView(client, identity.cluster)
    member = None
    follower = None
    # Users and ACLs from etcd, read before serving and followed while serving (every
    # proxy answers the same); None when this proxy keeps none (see cluster_guard).
    guard = await loop.run_in_executor(
        None, cluster_guard, config.auth, client.endpoints, identity.cluster
    )
    auth_follower = (
        asyncio.create_task(guard.store.follow(client), name="users and ACLs")
        if guard is not None and isinstance(guard.store, EtcdAuthStore)
        else None
    )
    broker = ClusterBroker(view, ClusterMetadata(client, identity.cluster), loop)
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
    replication = replication_collector(client.endpoints, identity.cluster)
    default_registry().add_collector(replication)
    try:
        await view.start()
        # Connect to the brokers listed now, so the first clients find every queue.
        await asyncio.wait_for(loop.run_in_executor(None, broker.sync_connections), FIRST_CONNECT_S)
        follower = asyncio.create_task(broker.follow_view(), name="broker connections")
        if register:
            member = Membership(
                client,
                identity.cluster,
                "proxy",
                identity.name,
                identity.endpoint,
                {"workers": 1},
                ttl_s=identity.ttl_s,
            )
            await member.start()
        await relay.start()  # before the directory names this worker as a client's holder
        await directory.start()
        await serve_front_end(
            config,
            broker,
            stop=stop,
            tick=False,
            started=started,
            source=f"cluster={identity.cluster} proxy={identity.name}",
            reuse_port=reuse_port,
            cluster=ProxyMembers(broker, identity, directory, relay),
            registry=registry,
            guard=guard,
            on_reload=peer_tls.reload,
        )
    finally:
        default_registry().remove_collector(replication)
        if auth_follower is not None:
            auth_follower.cancel()
        await directory.stop()
        await relay.stop()
        if member is not None:
            await member.stop()
        if follower is not None:
            follower.cancel()
        await loop.run_in_executor(None, broker.close)
        await view.stop()
        await client.close()
        log.info("event=stopped")


def run_cluster_proxy(
    config: Config, identity: ProxyIdentity, workers: int = 1, *, worker: bool = False
) -> int:
    """Serve until signalled (one process, or ``workers`` worker processes); the exit status.

    ``worker``: this process is one of a supervised proxy's workers (it shares the ports
    and does not register: its parent does)."""
    configure_logging()
    peer_tls.configure(config)  # the supervisor registers in etcd too
    if workers <= 1:
        asyncio.run(serve_cluster_proxy(config, identity, register=not worker, reuse_port=worker))
        return 0
    return _supervise(identity, workers)


def _supervise(identity: ProxyIdentity, workers: int) -> int:
    """Start the workers (this command again, one worker each, sharing the ports), register
    the proxy, wait; forward SIGTERM/SIGINT to the workers and stop when they all have."""
    argv = _worker_argv(sys.argv[1:])
    children = [subprocess.Popen([sys.executable, "-m", "halfmoon", *argv]) for _ in range(workers)]
    deregister = register_member(
        identity.coordinator,
        identity.cluster,
        "proxy",
        identity.name,
        identity.endpoint,
        {"workers": workers},
        ttl_s=identity.ttl_s,
    )

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, forward)  # each worker re-reads its certificates
    try:
        statuses = [child.wait() for child in children]
    finally:
        deregister()
    log.info("event=workers_stopped statuses=%s pid=%d", statuses, os.getpid())
    return max(statuses, default=0)


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
