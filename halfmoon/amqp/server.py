"""The AMQP listener: connections, the shared topology, consumers by queue, arrival wake-ups.

One :class:`AmqpServer` serves every AMQP connection of a process in front of
one broker facade. It owns what connections share: the topology (exchanges,
queues, bindings; kept by a :class:`~halfmoon.amqp.topology.TopologyStore`:
the data directory, or etcd for every proxy of a cluster), the consumers of
each queue (for consumer counts, exclusive consumers and the server-sent
Cancel when a queue is deleted; in cluster mode with every other proxy
worker's, through :mod:`halfmoon.amqp.cluster_consumers`), and
:class:`Arrivals`, which turns the broker's arrival listener (called from the
appending thread) into wake-ups of the consumers parked on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import socket
import ssl
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol

from pamqp import base, commands

from halfmoon import failpoints
from halfmoon.amqp.cluster_consumers import ClusterConsumers, ConsumersUnknown, Deletion, Refusal
from halfmoon.amqp.consumer import Consumer
from halfmoon.amqp.dead_letter import DeadLetters
from halfmoon.amqp.disk_alarm import DiskAlarm
from halfmoon.amqp.housekeeping import Housekeeping
from halfmoon.amqp.queues import DELIVERY_TIMEOUT_MS, Queues
from halfmoon.amqp.reply_codes import (
    ACCESS_REFUSED,
    NOT_FOUND,
    RESOURCE_LOCKED,
    AmqpChannelError,
)
from halfmoon.amqp.topology import LocalTopologyStore, Queue, Topology, TopologyStore, VHost
from halfmoon.auth import Guard
from halfmoon.auth.guard import Need, group, topic
from halfmoon.broker.facade import Broker
from halfmoon.errors import HalfmoonError
from halfmoon.listen.permissive import PermissiveAdminListener

log = logging.getLogger("halfmoon.amqp")

# Methods that change the topology: in cluster mode each first reads what other proxies
# changed (a binding unbound or an exchange deleted here must be the one etcd holds).
_CHANGES_TOPOLOGY = (
    commands.Exchange.Declare,
    commands.Exchange.Delete,
    commands.Exchange.Bind,
    commands.Exchange.Unbind,
    commands.Queue.Declare,
    commands.Queue.Bind,
    commands.Queue.Unbind,
    commands.Queue.Delete,
    commands.Queue.Purge,
    commands.Basic.Consume,
)
# Methods that only look a queue up: they read etcd again only when the queue is missing.
_LOOKS_UP = (commands.Basic.Get,)


class Arrivals:
    """Consumers waiting on a topic, woken when the broker appends to it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: dict[str, set[asyncio.Event]] = {}

    def watch(self, stored: str, event: asyncio.Event) -> None:
        self._waiting.setdefault(stored, set()).add(event)

    def unwatch(self, stored: str, event: asyncio.Event) -> None:
        waiting = self._waiting.get(stored)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._waiting[stored]

    def on_arrival(self, stored: str, queue_id: int) -> None:
        """The broker's arrival listener (any thread; never blocks)."""
        if stored in self._waiting:
            self._loop.call_soon_threadsafe(self.notify, stored)

    def notify(self, stored: str) -> None:
        for event in list(self._waiting.get(stored, ())):
            event.set()


class ActiveClaims(Protocol):
    """Where the servers of a cluster (its proxies' workers) agree on which one's consumer of
    an ``x-single-active-consumer`` queue is active (a cluster proxy's etcd claims); without
    one, this server alone decides."""

    on_change: Callable[[], None]  # a claim was won: its waiting consumers may deliver

    def holds(self, stored: str) -> bool: ...

    def want(self, stored: str, wanted: bool) -> None: ...


class AmqpServer:
    def __init__(
        self,
        broker: Broker,
        metadata_dir: Path | None,
        *,
        guard: Guard | None = None,
        executor: Executor | None = None,
        consumer_timeout_ms: int = DELIVERY_TIMEOUT_MS,
        topology_store: TopologyStore | None = None,
        free_bytes: Callable[[], int | None] | None = None,
        disk_free_limit_bytes: int = 0,
        delivery_holder: Callable[[], str] | None = None,
        active_claims: ActiveClaims | None = None,
        cluster_consumers: ClusterConsumers | None = None,
    ) -> None:
        """``topology_store``: where exchanges, queues and bindings are kept (default: the
        ``amqp.json`` file in ``metadata_dir``; None there too: memory only).
        ``free_bytes``: the free space where messages are stored; below
        ``disk_free_limit_bytes`` publishers are blocked (:mod:`halfmoon.amqp.disk_alarm`).
        ``delivery_holder``: who holds the deliveries (:class:`~halfmoon.amqp.queues.Queues`).
        ``active_claims``: where single active consumers are agreed on with other servers.
        ``cluster_consumers``: where the consumers of every server of a cluster are counted
        (None: this server's are all there are)."""
        self.broker = broker
        self.topology = Topology(
            topology_store
            or LocalTopologyStore(metadata_dir / "amqp.json" if metadata_dir else None)
        )
        self.topology.on_queue_gone = self._queue_gone
        self.disk_alarm = DiskAlarm(
            free_bytes or (lambda: None),
            disk_free_limit_bytes if free_bytes is not None else 0,
            self._alarm_changed,
        )
        # Connection ids name the owners of exclusive queues, which other proxies of a
        # cluster see too: unique per process, not only within it.
        self._instance = secrets.token_hex(4)
        self._connection_ids = itertools.count(1)
        self.queues = Queues(broker, executor, consumer_timeout_ms, delivery_holder)
        self.dead_letters = DeadLetters(self.queues)
        self.guard = guard
        self.arrivals = Arrivals(asyncio.get_running_loop())
        broker.add_arrival_listener(self.arrivals.on_arrival)
        self.connections: set[object] = set()
        # Per queue, its consumers in the order they started (a dict keeps the order: with
        # x-single-active-consumer the first one is the active one).
        self._consumers: dict[int, dict[Consumer, None]] = {}
        self._claims = active_claims
        if active_claims is not None:
            active_claims.on_change = self._wake_all
        self.cluster_consumers = cluster_consumers
        if cluster_consumers is not None:
            cluster_consumers.on_lost = self._consumer_lost
        # Tasks nobody awaits (a connection's cleanup, a cancel told to a client, a detach
        # retried): held here until they end, as the loop keeps only weak references.
        self._background: set[asyncio.Task[None]] = set()
        self._servers: list[asyncio.Server] = []
        self._sniffing: list[PermissiveAdminListener] = []  # tls.mode=permissive's listeners
        self._opened = False
        self.housekeeping = Housekeeping(self)

    async def start(
        self,
        sock: socket.socket,
        ssl_context: ssl.SSLContext | None = None,
        *,
        permissive: bool = False,
    ) -> int:
        """Serve on the bound, listening ``sock`` (AMQPS with ``ssl_context``; with
        ``permissive`` too, AMQP and AMQPS both, told apart by each connection's first
        byte, as the gRPC and admin ports do in ``tls.mode=permissive``); its port."""
        from halfmoon.amqp.connection import AmqpConnection

        if not self._opened:
            self._opened = True
            await self.topology.open()
            await self.disk_alarm.start()
        if permissive and ssl_context is not None:
            host = sock.getsockname()[0]
            listener = PermissiveAdminListener(
                lambda: AmqpConnection(self),
                host,
                int(sock.getsockname()[1]),
                ssl_context,
                sock=sock,
                listener="amqp",
            )
            listener.start()
            self._sniffing.append(listener)
        else:
            loop = asyncio.get_running_loop()
            server = await loop.create_server(
                lambda: AmqpConnection(self), sock=sock, ssl=ssl_context
            )
            self._servers.append(server)
        self.housekeeping.start()
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        """Stop accepting, send 320 CONNECTION_FORCED to every connection, and wait briefly."""
        await self.housekeeping.stop()
        for listener in self._sniffing:
            await listener.close()
        self._sniffing.clear()
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.shutdown()  # type: ignore[attr-defined]
        for server in self._servers:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(server.wait_closed(), 2)
        self._servers.clear()
        await self.disk_alarm.stop()
        await self.topology.close()

    def _alarm_changed(self, active: bool) -> None:
        for connection in list(self.connections):
            connection.alarm_changed(active)  # type: ignore[attr-defined]

    def connection_id(self) -> str:
        return f"amqp-{self._instance}-{next(self._connection_ids)}"

    def owns(self, queue: Queue) -> bool:
        """Whether ``queue`` is exclusive to a connection of this server."""
        owner = queue.exclusive_owner
        return owner is not None and owner.startswith(f"amqp-{self._instance}-")

    def cluster_of(self, queue: Queue) -> ClusterConsumers | None:
        """Where ``queue``'s consumers are counted beyond this server: the cluster's record,
        but for an exclusive queue, which only its own connection may consume from (an RPC
        reply queue then costs no etcd round trip), and in local mode."""
        return None if queue.exclusive_owner is not None else self.cluster_consumers

    # -- the topology, with other proxies' changes -------------------------------------------

    async def catch_up_before(self, vhost: VHost, method: base.Frame) -> None:
        if isinstance(method, _CHANGES_TOPOLOGY):
            await self.topology.catch_up(vhost)

    async def caught_up_after(
        self, vhost: VHost, method: base.Frame, error: AmqpChannelError
    ) -> bool:
        """Whether ``method``, refused for a missing entity, is worth running again: the
        entity may have been declared through another proxy a moment ago."""
        if error.code != NOT_FOUND or not isinstance(method, _LOOKS_UP):
            return False
        return await self.topology.catch_up(vhost)

    async def route(
        self, vhost: VHost, exchange: str, routing_key: str, headers: Mapping[str, Any]
    ) -> list[Queue]:
        """The queues a publish reaches. Routed on what this process knows; a publish that
        reaches nothing (or names an unknown exchange) reads etcd again first, so what
        another proxy declared before this publish was sent is never missed."""
        try:
            targets = vhost.route(exchange, routing_key, headers)
        except AmqpChannelError as error:
            if error.code != NOT_FOUND or not await self.topology.catch_up(vhost):
                raise
            return vhost.route(exchange, routing_key, headers)
        if not targets and await self.topology.catch_up(vhost):
            return vhost.route(exchange, routing_key, headers)
        return targets

    def _queue_gone(self, vhost: VHost, queue: Queue) -> None:
        """Another proxy deleted ``queue`` (or its owner's proxy died): cancel its consumers
        here as a local delete does."""
        consumers = list(self._consumers.pop(id(queue), ()))
        self._claim(queue, False)
        for consumer in consumers:
            consumer.channel.consumer_lost(consumer)
            self._detach_later(consumer)

    def _consumer_lost(self, consumer_id: str) -> None:
        """The cluster let one of this server's consumers go (its record was lost with a
        lapsed lease and another server took the queue since): cancel it."""
        for consumers in self._consumers.values():
            for consumer in consumers:
                if _consumer_id(consumer) == consumer_id:
                    del consumers[consumer]
                    consumer.queue.consumers -= 1
                    if not consumers:
                        self._claim(consumer.queue, False)
                    consumer.channel.consumer_lost(consumer)
                    return

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task this server holds until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _detach_later(self, consumer: Consumer) -> None:
        cluster = self.cluster_of(consumer.queue)
        if cluster is not None:
            self.in_background(cluster.detach(_consumer_id(consumer)))

    # -- consumers by queue -----------------------------------------------------------

    def consumers_of(self, queue: Queue) -> list[Consumer]:
        return list(self._consumers.get(id(queue), ()))

    def may_deliver(self, consumer: Consumer) -> bool:
        """False for a waiting consumer of an ``x-single-active-consumer`` queue: one after this
        server's first, or any while another server of the cluster holds the queue."""
        queue = consumer.queue
        if not queue.arguments.get("x-single-active-consumer"):
            return True
        consumers = self._consumers.get(id(queue))
        first = consumers is not None and next(iter(consumers), None) is consumer
        return first and (self._claims is None or self._claims.holds(queue.stored))

    def _wake_all(self) -> None:
        for consumers in self._consumers.values():
            for consumer in consumers:
                consumer.wake()

    def _claim(self, queue: Queue, wanted: bool) -> None:
        if self._claims is not None and queue.arguments.get("x-single-active-consumer"):
            self._claims.want(queue.stored, wanted)

    async def consumer_count(self, queue: Queue) -> int:
        """Its consumers on every server of the cluster (this server's alone, logged, while
        the cluster cannot say: a count is a hint, nothing is decided on it)."""
        here = len(self._consumers.get(id(queue), ()))
        cluster = self.cluster_of(queue)
        if cluster is None:
            return here
        try:
            return await cluster.count(queue.stored)
        except ConsumersUnknown as error:
            log.warning("event=amqp_consumer_count_unknown queue=%s error=%s", queue.stored, error)
            return here

    async def in_use(self, queue: Queue, class_method: tuple[int, int]) -> bool:
        """Whether the queue has a consumer on any server of the cluster (``if-unused``);
        405 RESOURCE_LOCKED while the cluster cannot say."""
        cluster = self.cluster_of(queue)
        if self._consumers.get(id(queue)) or cluster is None:
            return bool(self._consumers.get(id(queue)))
        try:
            return await cluster.count(queue.stored) > 0
        except ConsumersUnknown as error:
            raise _unknown(queue, error, class_method) from None

    async def add_consumer(self, queue: Queue, consumer: Consumer) -> None:
        """Start counting ``consumer``: 403 ACCESS_REFUSED while an exclusive consumer holds
        the queue, or for an exclusive one while the queue has any consumer, on any server
        of the cluster (decided in etcd there, so of two servers racing one wins)."""
        vhost = consumer.channel.vhost
        others = self._consumers.get(id(queue), {})
        if any(c.exclusive for c in others) or (consumer.exclusive and others):
            raise _in_exclusive_use(queue, vhost.name)
        cluster = self.cluster_of(queue)
        if cluster is not None:
            try:
                refused = await cluster.attach(_consumer_id(consumer), queue, consumer.exclusive)
            except ConsumersUnknown as error:
                raise _unknown(queue, error, (60, 20)) from None
            if refused is Refusal.EXCLUSIVE:
                raise _in_exclusive_use(queue, vhost.name)
            if refused is Refusal.DELETING or vhost.queues.get(queue.name) is not queue:
                if refused is None:  # deleted while the consumer was being recorded
                    await cluster.detach(_consumer_id(consumer))
                raise AmqpChannelError(
                    NOT_FOUND, f"no queue {queue.name!r} in vhost {vhost.name!r}", 60, 20
                )
        self._consumers.setdefault(id(queue), {})[consumer] = None
        queue.consumers += 1
        self._claim(queue, True)

    def used(self, queue: Queue) -> None:
        """Declared (not passively), read by Basic.Get, or left by its last consumer here:
        its x-expires clock restarts (the whole cluster's, in cluster mode)."""
        queue.touch()
        cluster = self.cluster_of(queue)
        if cluster is not None:
            cluster.used(queue)

    async def created(self, queue: Queue) -> None:
        """A queue declared here for the first time, before other servers can see it."""
        cluster = self.cluster_of(queue)
        if cluster is not None:
            try:
                await cluster.created(queue.stored)
            except ConsumersUnknown as error:
                raise _unknown(queue, error, (50, 10)) from None

    async def remove_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        consumers = self._consumers.get(id(queue))
        if consumers is None or consumer not in consumers:
            return
        del consumers[consumer]
        queue.consumers -= 1
        self.used(queue)  # x-expires counts from the last consumer's going
        for waiting in consumers:  # a single active consumer's successor starts now
            waiting.wake()
        if not consumers:
            del self._consumers[id(queue)]
            self._claim(queue, False)
        cluster = self.cluster_of(queue)
        if cluster is not None:
            await cluster.detach(_consumer_id(consumer))
        if queue.auto_delete and not self._consumers.get(id(queue)):
            vhost = consumer.channel.vhost
            if vhost.queues.get(queue.name) is queue and await self.may_delete(
                queue, Deletion.AUTO_DELETE
            ):
                await self.delete_queue(vhost, queue)

    async def may_delete(self, queue: Queue, why: Deletion) -> bool:
        """Whether this server deletes a queue nobody asked to delete: always, alone; in a
        cluster, only the one server etcd lets, and only while ``why`` holds there."""
        cluster = self.cluster_of(queue)
        return cluster is None or await cluster.claim_deletion(queue, why)

    async def delete_queue(self, vhost: VHost, queue: Queue) -> None:
        """Cancel its consumers (Basic.Cancel to clients that asked), forget it, drop its
        topic and group."""
        consumers = list(self._consumers.pop(id(queue), ()))
        for consumer in consumers:
            await consumer.channel.cancel_from_server(consumer)
        self._claim(queue, False)
        try:
            if vhost.queues.get(queue.name) is queue:
                vhost.remove_queue(queue.name)
                await self.topology.save()
            await self.queues.delete(queue.stored)
        except BaseException:
            for consumer in consumers:
                self._detach_later(consumer)
            raise
        cluster = self.cluster_of(queue)
        if cluster is not None:
            failpoints.amqp("queue-deleted-before-its-keys")
            await cluster.deleted(queue.stored)  # its consumers' keys too

    # -- authorization ------------------------------------------------------------------

    def authorize(self, connection: object, kind: str, name: str, exchange: bool) -> None:
        """RabbitMQ's configure / write / read on halfmoon's ACL actions (docs/security.md)."""
        user = getattr(connection, "user", None)
        guard = self.guard
        if guard is None or not guard.enabled or user is None:
            return
        vhost: VHost = connection.vhost  # type: ignore[attr-defined]
        from halfmoon.amqp.names import stored_name

        stored = stored_name(vhost.namespace, name)
        needs: Sequence[Need]
        if kind == "configure":
            needs = [Need.of(topic("*" if exchange else stored), "Create")]
            if exchange:
                from halfmoon.auth.guard import CLUSTER

                needs = [Need.of(CLUSTER, "Update")]
        elif kind == "write":
            needs = [Need.of(topic(stored), "Pub")]
        else:
            needs = [Need.of(topic(stored), "Sub"), Need.of(group(stored), "Sub")]
        try:
            guard.authorize(user, needs, connection.peer, f"amqp.{kind}")  # type: ignore[arg-type,attr-defined]
        except HalfmoonError as exc:
            raise AmqpChannelError(ACCESS_REFUSED, exc.message) from None


def _consumer_id(consumer: Consumer) -> str:
    """Unique in the cluster: the channel's client id names the process and connection."""
    return f"{consumer.channel.client_id}-{consumer.tag}"


def _in_exclusive_use(queue: Queue, vhost: str) -> AmqpChannelError:
    return AmqpChannelError(
        ACCESS_REFUSED, f"queue {queue.name!r} in vhost {vhost!r} in exclusive use", 60, 20
    )


def _unknown(
    queue: Queue, error: ConsumersUnknown, class_method: tuple[int, int]
) -> AmqpChannelError:
    return AmqpChannelError(
        RESOURCE_LOCKED,
        f"cannot tell what consumes queue {queue.name!r} on the other proxies: the cluster's "
        f"coordinator (etcd) is unreachable; try again ({error})",
        *class_method,
    )
