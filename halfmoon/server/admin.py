"""The admin HTTP API: JSON over the broker's own methods, an OpenAPI document, metrics.

Every endpoint ends in one call of the :class:`~halfmoon.broker.facade.Broker`
facade (run in a worker thread: broker calls may touch the disk) and translates its
result to JSON; no rule about topics or groups lives here. Errors are JSON::

    {"error": {"code": "TOPIC_NOT_FOUND", "message": "topic 'x' does not exist; ..."}}

with the HTTP status following the error's class: 400 for a bad request,
403 forbidden, 404 not found, 409 conflict, 500 for anything else.

Every endpoint takes ``?namespace=NS``: the topic and group names the request
gives are then taken in namespace NS and the topic and group lists show only
NS's (see :mod:`halfmoon.server.admin_namespace`).

Each module of the API declares its routes beside their handlers (a
:class:`~halfmoon.server.admin_routes.RouteTable`); ``/openapi.json`` is built from
the same declarations (:mod:`halfmoon.server.admin_openapi`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from halfmoon.auth import Guard
from halfmoon.broker.facade import Broker
from halfmoon.config import Config
from halfmoon.errors import HalfmoonError
from halfmoon.metrics import MetricFamily, MetricsRegistry, default_registry
from halfmoon.server.admin_auth import GUARD_KEY, admin_auth
from halfmoon.server.admin_definitions import AMQP_KEY, AmqpHandle
from halfmoon.server.admin_http import (
    BROKER_KEY,
    CLIENTS_KEY,
    CLUSTER_KEY,
    CONFIG_KEY,
    REGISTRY_KEY,
    ClusterMembers,
    error_reply,
    http_status,
    jsonable,
)
from halfmoon.server.admin_namespace import namespaced_names
from halfmoon.server.admin_openapi import ROUTE_TABLES
from halfmoon.server.overview_metrics import overview_collector
from halfmoon.server.telemetry import ClientRegistry

__all__ = ["admin_request_limit", "create_admin_app", "http_status"]

log = logging.getLogger(__name__)

# -- middleware: errors and request metrics ----------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        response = await handler(request)
    except HalfmoonError as exc:
        response = error_reply(http_status(exc), exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}.get(
            exc.status, f"HTTP_{exc.status}"
        )
        message = {
            404: f"no such endpoint: {request.method} {request.path} (see /openapi.json)",
            405: f"{request.method} is not allowed on {request.path}",
            413: (
                f"the request is larger than the admin API's limit of "
                f"{request.app[CONFIG_KEY].broker.max_body_size} bytes of message body "
                f"({request.client_max_size} bytes of request); the limit follows "
                "broker.max_body_size"
            ),
        }.get(exc.status, exc.reason)
        response = error_reply(exc.status, code, message)
    except Exception as exc:  # the API must answer, never drop the connection
        log.exception("admin request %s %s failed", request.method, request.path)
        response = error_reply(
            500,
            "INTERNAL_ERROR",
            f"internal error ({type(exc).__name__}: {exc}); see the server log",
        )
    route = request.match_info.route.resource
    template = route.canonical if route is not None else "unmatched"
    registry = request.app[REGISTRY_KEY]
    registry.counter(
        "halfmoon_admin_requests_total",
        "Admin API requests by route template and HTTP status.",
        ("method", "route", "status"),
    ).inc(method=request.method, route=template, status=response.status)
    registry.counter(
        "halfmoon_admin_request_seconds_total",
        "Time spent answering admin API requests.",
        ("method", "route"),
    ).inc(time.perf_counter() - started, method=request.method, route=template)
    return response


# -- metrics collected from the broker at scrape time -------------------------


def broker_collector(broker: Broker) -> Callable[[], list[MetricFamily]]:
    def collect() -> list[MetricFamily]:
        families: list[MetricFamily] = []
        status = jsonable(broker.status())
        status.update(status.pop("extra", None) or {})  # the broker's own extra counters
        for name, value in status.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            kind = "counter" if name.endswith("_total") else "gauge"
            families.append(
                MetricFamily(f"halfmoon_broker_{name}", kind, f"Broker status field {name}.").add(
                    value
                )
            )
        low = MetricFamily("halfmoon_queue_min_offset", "gauge", "First retained offset per queue.")
        high = MetricFamily(
            "halfmoon_queue_max_offset", "gauge", "One past the last offset per queue."
        )
        for topic in broker.list_topics():
            for queue in jsonable(broker.topic_status(topic.name)):
                labels = {"topic": topic.name, "queue": queue.get("queue_id")}
                low.add(queue.get("min_offset", 0), **labels)
                high.add(queue.get("max_offset", 0), **labels)
        lag = MetricFamily(
            "halfmoon_group_lag", "gauge", "Messages not yet consumed per group and queue."
        )
        inflight = MetricFamily(
            "halfmoon_group_inflight", "gauge", "Messages delivered and not yet acknowledged."
        )
        for group in broker.list_groups():
            for queue in jsonable(broker.group_progress(group.name, None)):
                labels = {
                    "group": group.name,
                    "topic": queue.get("topic"),
                    "queue": queue.get("queue_id"),
                }
                lag.add(queue.get("lag", 0) or 0, **labels)
                inflight.add(queue.get("inflight", 0) or 0, **labels)
        return [*families, low, high, lag, inflight]

    return collect


# -- the application ----------------------------------------------------------


# Room for a JSON request's other fields (properties, keys, a batch's framing) beside
# the body.
_REQUEST_OVERHEAD = 1024 * 1024


def admin_request_limit(config: Config) -> int:
    """The largest admin request body: a message body as large as the broker takes
    (``broker.max_body_size``), base64-encoded as the API carries binary bodies, plus
    room for the rest of the request. One limit, so a send the broker would take is
    never refused by the API in front of it."""
    body = config.broker.max_body_size
    return (body + 2) // 3 * 4 + _REQUEST_OVERHEAD


def create_admin_app(
    broker: Broker,
    config: Config,
    registry: MetricsRegistry | None = None,
    clients: ClientRegistry | None = None,
    guard: Guard | None = None,
    cluster: ClusterMembers | None = None,
    amqp: AmqpHandle | None = None,
) -> web.Application:
    """The admin API over ``broker``; run it with aiohttp's ``AppRunner`` on
    ``config.server.admin_listen``. ``registry`` defaults to the process-wide one;
    ``clients`` is the gRPC server's ClientRegistry (connected consumers), if any;
    ``amqp`` the AMQP endpoint once it serves (its topology in the definitions)."""
    app = web.Application(
        middlewares=[errors_and_metrics, admin_auth, namespaced_names],
        client_max_size=admin_request_limit(config),
    )
    if guard is not None:  # users and ACLs (halfmoon.auth); checked by admin_auth when enabled
        app[GUARD_KEY] = guard
    app[BROKER_KEY] = broker
    app[CONFIG_KEY] = config
    if cluster is not None:
        app[CLUSTER_KEY] = cluster
    registry = registry or default_registry()
    app[REGISTRY_KEY] = registry
    collector = broker_collector(broker)
    registry.add_collector(collector)
    overview = overview_collector(broker, Path(config.store.data_dir))
    registry.add_collector(overview)

    async def forget_broker(app: web.Application) -> None:
        registry.remove_collector(collector)
        registry.remove_collector(overview)

    app.on_cleanup.append(forget_broker)
    if clients is not None:  # the gRPC server's connected clients (admin_clients)
        app[CLIENTS_KEY] = clients
    if amqp is not None:
        app[AMQP_KEY] = amqp
    for table in ROUTE_TABLES:
        table.add_to(app)
    return app
