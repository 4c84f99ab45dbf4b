"""Topic routes: which queues a topic has, where they live, what they accept.

Routes come from ``QueryRoute`` on the access point and are cached per topic.
Concurrent first lookups of one topic share a single RPC. The client's
background loop refreshes every cached route (every 30 s by default), so
queues added or moved are picked up without a restart; a failed refresh
keeps the old route (a restarting server must not empty the cache).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2, service_pb2

from halfmoon.client.connection import ConnectionPool, endpoint_of, endpoints_pb
from halfmoon.client.errors import TopicNotFound, raise_for_status

pb = definition_pb2
log = logging.getLogger("halfmoon.client.route")

_PERM = {
    pb.Permission.READ: "r",
    pb.Permission.WRITE: "w",
    pb.Permission.READ_WRITE: "rw",
}


@dataclass(frozen=True)
class QueueInfo:
    """One message queue of a topic: ``(broker_name, queue_id)`` and its endpoint."""

    topic: str
    queue_id: int
    permission: str
    broker_name: str
    endpoint: str
    accept_types: frozenset[int]

    @property
    def readable(self) -> bool:
        return "r" in self.permission

    @property
    def writable(self) -> bool:
        return "w" in self.permission

    @property
    def key(self) -> str:
        """``broker@queue_id``: stable across route refreshes, used for allocation."""
        return f"{self.broker_name}@{self.queue_id}"

    def to_wire(self, namespace: str = "") -> pb.MessageQueue:
        return pb.MessageQueue(
            topic=pb.Resource(name=self.topic, resource_namespace=namespace),
            id=self.queue_id,
            broker=pb.Broker(name=self.broker_name, endpoints=endpoints_pb(self.endpoint)),
        )


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    queues: tuple[QueueInfo, ...]

    def writable(self) -> list[QueueInfo]:
        return [q for q in self.queues if q.writable]

    def readable(self) -> list[QueueInfo]:
        return [q for q in self.queues if q.readable]

    def endpoints(self) -> list[str]:
        return sorted({q.endpoint for q in self.queues})


def route_of(
    topic: str, response: service_pb2.QueryRouteResponse, fallback_endpoint: str
) -> TopicRoute:
    queues = []
    for mq in response.message_queues:
        endpoint = endpoint_of(mq.broker.endpoints) or fallback_endpoint
        queues.append(
            QueueInfo(
                topic=topic,
                queue_id=mq.id,
                permission=_PERM.get(mq.permission, ""),
                broker_name=mq.broker.name or endpoint,
                endpoint=endpoint,
                accept_types=frozenset(mq.accept_message_types),
            )
        )
    queues.sort(key=lambda q: (q.broker_name, q.queue_id))
    return TopicRoute(topic, tuple(queues))


class RouteCache:
    """Cached :class:`TopicRoute` per topic; ``on_endpoint`` hears of each new endpoint."""

    def __init__(
        self,
        pool: ConnectionPool,
        namespace: str = "",
        on_endpoint: Callable[[str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._namespace = namespace
        self._routes: dict[str, TopicRoute] = {}
        self._pending: dict[str, asyncio.Future[TopicRoute]] = {}
        self._known_endpoints: set[str] = set()
        self._on_endpoint = on_endpoint

    def cached(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    def topics(self) -> list[str]:
        return list(self._routes)

    async def get(self, topic: str) -> TopicRoute:
        """The topic's route (cached); raises :class:`TopicNotFound` for an unknown topic."""
        route = self._routes.get(topic)
        if route is not None:
            return route
        return await self.refresh(topic)

    async def refresh(self, topic: str) -> TopicRoute:
        """Ask the server for the topic's route now (concurrent callers share the RPC)."""
        pending = self._pending.get(topic)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[TopicRoute] = asyncio.get_running_loop().create_future()
        self._pending[topic] = future
        try:
            route = await self._query(topic)
            self._routes[topic] = route
            for endpoint in route.endpoints():
                if endpoint not in self._known_endpoints:
                    self._known_endpoints.add(endpoint)
                    if self._on_endpoint is not None:
                        self._on_endpoint(endpoint)
            future.set_result(route)
            return route
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._pending.pop(topic, None)

    async def _query(self, topic: str) -> TopicRoute:
        connection = self._pool.access_point
        request = service_pb2.QueryRouteRequest(
            topic=pb.Resource(name=topic, resource_namespace=self._namespace),
            endpoints=endpoints_pb(connection.target),
        )
        response = await connection.call("QueryRoute", request, retry_unavailable=True)
        raise_for_status(response.status, "QueryRoute")
        route = route_of(topic, response, connection.target)
        if not route.queues:
            raise TopicNotFound(
                f"QueryRoute: topic {topic!r} has no queues",
                code="TOPIC_NOT_FOUND",
                rpc="QueryRoute",
            )
        return route

    async def refresh_all(self) -> None:
        """Refresh every cached route; failures keep the old route and are logged."""
        for topic in list(self._routes):
            try:
                await self.refresh(topic)
            except TopicNotFound:
                log.warning("event=route_gone topic=%s", topic)
                self._routes.pop(topic, None)
            except Exception as exc:  # noqa: BLE001 - a refresh must not kill the loop
                log.info("event=route_refresh_failed topic=%s error=%r", topic, exc)
