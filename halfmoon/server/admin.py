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

Endpoints (``/openapi.json`` describes each, with its request and answer):

    GET    /v1/status                       broker status
    GET    /v1/config                       the running configuration
    GET    /v1/topics                       list topics (?search=, ?offset=, ?limit=)
    POST   /v1/topics                       create a topic
    GET    /v1/topics/{topic}               one topic
    PATCH  /v1/topics/{topic}               change queues / perm / type
    DELETE /v1/topics/{topic}               delete a topic
    GET    /v1/topics/{topic}/status        min/max offsets per queue
    GET    /v1/groups                       list consumer groups (?search=, ?offset=, ?limit=)
    POST   /v1/groups                       create a group
    GET    /v1/groups/{group}               one group
    PATCH  /v1/groups/{group}               change a group
    DELETE /v1/groups/{group}               delete a group
    GET    /v1/groups/{group}/progress      committed offset, lag, in flight per queue
    GET    /v1/transactions                 undecided transactions (?topic=, ?limit=)
    GET    /v1/transactions/parked          transactions parked after the check limit
    POST   /v1/transactions/{id}/commit     an operator's commit (also of a parked one)
    POST   /v1/transactions/{id}/rollback   an operator's rollback
    POST   /v1/transactions/{id}/resume     put a parked transaction back under checks
    POST   /v1/transaction-groups/{group}/commit|rollback   decide a transaction group
    GET    /metrics                         Prometheus text
    GET    /openapi.json, /healthz
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from halfmoon.auth import Guard
from halfmoon.broker.facade import Broker
from halfmoon.broker.groups import RetryPolicy
from halfmoon.broker.message import MessageType
from halfmoon.config import Config, config_to_dict
from halfmoon.errors import HalfmoonError
from halfmoon.metrics import CONTENT_TYPE, MetricFamily, MetricsRegistry, default_registry
from halfmoon.server import (
    admin_dashboard,
    admin_dead_letters,
    admin_lite,
    admin_messages,
    admin_operations,
    admin_users,
)
from halfmoon.server.admin_auth import GUARD_KEY, admin_auth
from halfmoon.server.admin_http import (
    BROKER_KEY,
    CLUSTER_KEY,
    CONFIG_KEY,
    REGISTRY_KEY,
    ApiError,
    ClusterMembers,
    broker_of,
    call,
    error_reply,
    existing_group,
    existing_topic,
    http_status,
    jsonable,
    read_body,
    reject_unknown,
    reply,
    take,
)
from halfmoon.server.admin_namespace import namespaced_names
from halfmoon.server.admin_openapi import openapi_document
from halfmoon.server.admin_paging import page_of
from halfmoon.server.telemetry import ClientRegistry

log = logging.getLogger(__name__)

TOPIC_TYPES = [t.value for t in MessageType]
PERMS = ["rw", "r", "w"]
CONSUME_FROM = ["latest", "earliest", "auto"]


def retry_policy_from(body: dict[str, Any]) -> RetryPolicy | None:
    data = take(body, "retry_policy", dict)
    if data is None:
        return None
    kind = take(data, "kind", str, choices=["customized", "exponential"]) or "customized"
    if kind == "exponential":
        return RetryPolicy.exponential(
            take(data, "initial_ms", int, required=True, minimum=0),
            take(data, "max_ms", int, required=True, minimum=0),
            float(take(data, "multiplier", (int, float)) or 2.0),
        )
    levels = take(data, "levels_ms", list, required=True)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in levels):
        raise ApiError("field 'levels_ms' must be an array of integers (milliseconds)")
    return RetryPolicy.customized(tuple(levels))


# -- handlers ----------------------------------------------------------------


async def get_status(request: web.Request) -> web.Response:
    return reply(await call(broker_of(request).status))


async def get_config(request: web.Request) -> web.Response:
    return reply(config_to_dict(request.app[CONFIG_KEY]))


async def list_topics(request: web.Request) -> web.Response:
    topics = await call(broker_of(request).list_topics)
    return reply(page_of(request, "topics", topics))


async def create_topic(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"name", "message_type", "queue_count", "perm", "brokers"})
    name = take(body, "name", str, required=True)
    message_type = take(body, "message_type", str, choices=TOPIC_TYPES) or "normal"
    queue_count = take(body, "queue_count", int, minimum=1)
    if queue_count is None:
        queue_count = _default_queue_count(request)
    perm = take(body, "perm", str, choices=PERMS) or "rw"
    # Cluster mode only: the brokers to place the queues on (mqadmin updateTopic -b).
    brokers = take(body, "brokers", list) or []
    if not all(isinstance(b, str) for b in brokers):
        raise ApiError("field 'brokers' must be an array of broker names")
    topic = await call(
        broker_of(request).create_topic,
        name,
        MessageType(message_type),
        queue_count,
        perm,
        brokers,
    )
    return reply(topic, status=201)


def _default_queue_count(request: web.Request) -> int:
    # The broker's own setting: it may change at runtime (PATCH /v1/runtime-config).
    return broker_of(request).config.default_queue_count


async def get_topic(request: web.Request) -> web.Response:
    return reply(await call(broker_of(request).get_topic, request.match_info["topic"]))


async def update_topic(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"message_type", "queue_count", "perm", "trace"})
    changes: dict[str, Any] = {
        "queue_count": take(body, "queue_count", int, minimum=1),
        "perm": take(body, "perm", str, choices=PERMS),
        "trace": take(body, "trace", bool),
    }
    message_type = take(body, "message_type", str, choices=TOPIC_TYPES)
    if message_type is not None:
        changes["message_type"] = MessageType(message_type)
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        raise ApiError("nothing to change: give queue_count, perm, message_type or trace")
    name = request.match_info["topic"]
    return reply(await call(broker_of(request).update_topic, name, **changes))


async def delete_topic(request: web.Request) -> web.Response:
    name = request.match_info["topic"]
    await call(broker_of(request).delete_topic, name)
    return reply({"deleted": name})


async def topic_status(request: web.Request) -> web.Response:
    name = request.match_info["topic"]
    queues = await call(broker_of(request).topic_status, name)
    return reply({"topic": name, "queues": queues})


GROUP_FIELDS = {
    "fifo": bool,
    "max_delivery_attempts": int,
    "consume_from": str,
    "consume_enabled": bool,
    "broadcast": bool,
}


def group_settings(body: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for name, kind in GROUP_FIELDS.items():
        value = take(
            body,
            name,
            kind,
            choices=CONSUME_FROM if name == "consume_from" else None,
            minimum=1 if name == "max_delivery_attempts" else None,
        )
        if value is not None:
            settings[name] = value
    policy = retry_policy_from(body)
    if policy is not None:
        settings["retry_policy"] = policy
    return settings


async def list_groups(request: web.Request) -> web.Response:
    groups = await call(broker_of(request).list_groups)
    return reply(page_of(request, "groups", groups))


async def create_group(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"name", "retry_policy", *GROUP_FIELDS})
    name = take(body, "name", str, required=True)
    group = await call(broker_of(request).create_group, name, **group_settings(body))
    return reply(group, status=201)


async def get_group(request: web.Request) -> web.Response:
    group = await call(existing_group, broker_of(request), request.match_info["group"])
    return reply(group)


async def update_group(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"retry_policy", *GROUP_FIELDS})
    changes = group_settings(body)
    if not changes:
        raise ApiError(
            f"nothing to change: give any of {', '.join([*GROUP_FIELDS, 'retry_policy'])}"
        )
    name = request.match_info["group"]
    return reply(await call(broker_of(request).update_group, name, **changes))


async def delete_group(request: web.Request) -> web.Response:
    name = request.match_info["group"]
    await call(broker_of(request).delete_group, name)
    return reply({"deleted": name})


async def group_progress(request: web.Request) -> web.Response:
    broker = broker_of(request)
    name = request.match_info["group"]
    topic = request.query.get("topic") or None
    await call(existing_group, broker, name)
    if topic is not None:
        await call(existing_topic, broker, topic)
    queues = await call(broker.group_progress, name, topic)
    return reply({"group": name, "topic": topic, "queues": queues})


# -- transactions ------------------------------------------------------------

TRANSACTION_LIMIT = 1000


def _limit(request: web.Request) -> int:
    text = request.query.get("limit")
    if text is None:
        return TRANSACTION_LIMIT
    try:
        value = int(text)
    except ValueError:
        raise ApiError(f"query parameter 'limit' must be an integer, not {text!r}") from None
    if value < 1:
        raise ApiError(f"query parameter 'limit' must be at least 1, not {value}")
    return value


async def list_transactions(request: web.Request) -> web.Response:
    topic = request.query.get("topic") or None
    found = await call(broker_of(request).list_transactions, topic, _limit(request))
    return reply({"transactions": found})


async def parked_transactions(request: web.Request) -> web.Response:
    return reply(
        {"transactions": await call(broker_of(request).parked_transactions, _limit(request))}
    )


async def decide_transaction(request: web.Request) -> web.Response:
    """An operator's commit or rollback; answered once the decision is durable."""
    transaction_id = request.match_info["transaction_id"]
    resolution = request.match_info["resolution"]
    state = await call(
        broker_of(request).end_transaction, "", "", transaction_id, resolution, "operator"
    )
    return reply({"transaction_id": transaction_id, "state": state})


async def resume_transaction(request: web.Request) -> web.Response:
    info = await call(broker_of(request).resume_transaction, request.match_info["transaction_id"])
    return reply(info)


async def decide_transaction_group(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    resolution = request.match_info["resolution"]
    members = await call(broker_of(request).end_transaction_group, group, resolution, "operator")
    state = "committed" if resolution == "commit" else "rolled_back"
    return reply({"transaction_group": group, "state": state, "members_decided": members})


async def get_metrics(request: web.Request) -> web.Response:
    text = await call(request.app[REGISTRY_KEY].render)
    response = web.Response(text=text)
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


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


def create_admin_app(
    broker: Broker,
    config: Config,
    registry: MetricsRegistry | None = None,
    clients: ClientRegistry | None = None,
    guard: Guard | None = None,
    cluster: ClusterMembers | None = None,
) -> web.Application:
    """The admin API over ``broker``; run it with aiohttp's ``AppRunner`` on
    ``config.server.admin_listen``. ``registry`` defaults to the process-wide one;
    ``clients`` is the gRPC server's ClientRegistry (connected consumers), if any."""
    app = web.Application(
        middlewares=[errors_and_metrics, admin_auth, namespaced_names],
        client_max_size=1024 * 1024,
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

    async def forget_broker(app: web.Application) -> None:
        registry.remove_collector(collector)

    app.on_cleanup.append(forget_broker)
    app.router.add_get("/v1/status", get_status)
    app.router.add_get("/v1/config", get_config)
    app.router.add_get("/v1/topics", list_topics)
    app.router.add_post("/v1/topics", create_topic)
    app.router.add_get("/v1/topics/{topic}", get_topic)
    app.router.add_patch("/v1/topics/{topic}", update_topic)
    app.router.add_delete("/v1/topics/{topic}", delete_topic)
    app.router.add_get("/v1/topics/{topic}/status", topic_status)
    app.router.add_get("/v1/groups", list_groups)
    app.router.add_post("/v1/groups", create_group)
    app.router.add_get("/v1/groups/{group}", get_group)
    app.router.add_patch("/v1/groups/{group}", update_group)
    app.router.add_delete("/v1/groups/{group}", delete_group)
    app.router.add_get("/v1/groups/{group}/progress", group_progress)
    app.router.add_get("/v1/transactions", list_transactions)
    app.router.add_get("/v1/transactions/parked", parked_transactions)
    app.router.add_post(
        "/v1/transactions/{transaction_id}/{resolution:commit|rollback}", decide_transaction
    )
    app.router.add_post("/v1/transactions/{transaction_id}/resume", resume_transaction)
    app.router.add_post(
        "/v1/transaction-groups/{group}/{resolution:commit|rollback}", decide_transaction_group
    )
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/openapi.json", get_openapi)
    app.router.add_get("/healthz", healthz)
    admin_lite.add_routes(app)
    admin_users.add_routes(app)
    admin_messages.add_routes(app)
    admin_operations.add_routes(app, clients)
    admin_dead_letters.add_routes(app)
    admin_dashboard.add_routes(app)
    return app
