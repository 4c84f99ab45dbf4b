"""Admin endpoints over connected clients and the offsets consumers stand at: a group's
consumers, a topic's producers, every producer, offset resets and clones, and a
re-consumption by one connected consumer (RocketMQ's consumerConnection,
producerConnection, resetOffsetByTime, cloneGroupOffset, consumeMessageDirectly).

Connected clients come from the gRPC server's client registry, which
``halfmoon serve`` hands to the admin app (every proxy worker's in cluster mode);
without it (an admin app on its own) the lists are empty and ``registry`` is false.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from halfmoon.auth import group as group_resource
from halfmoon.auth import topic as topic_resource
from halfmoon.server.admin_auth import OFFSETS_IN_TOPIC, authorize_also, may_also
from halfmoon.server.admin_http import (
    CLIENTS_KEY,
    CLUSTER_KEY,
    ApiError,
    broker_of,
    call,
    existing_group,
    existing_topic,
    jsonable,
    read_body,
    reject_unknown,
    reply,
    take,
)
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import (
    BOOL,
    GROUP,
    INT,
    NULL_STR,
    STR,
    TOPIC,
    name_in_path,
    query,
)
from halfmoon.server.direct_consume import holds, stored_message, verify_here
from halfmoon.server.telemetry import LISTING_FIELDS, consumers_of, producers_of

SCHEMAS: dict[str, Any] = {
    "GroupClients": {
        "type": "object",
        "properties": {
            "group": STR,
            "broadcast": BOOL,
            "registry": {**BOOL, "description": "false when the app runs without the gRPC server"},
            "clients": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        },
    },
    "TopicProducers": {
        "type": "object",
        "properties": {
            "topic": STR,
            "group": NULL_STR,
            "registry": {**BOOL, "description": "false when the app runs without the gRPC server"},
            "clients": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        },
    },
    "OffsetClone": {
        "type": "object",
        "required": ["to"],
        "additionalProperties": False,
        "properties": {
            "to": {**STR, "description": "the group that gets the offsets"},
            "topic": {**STR, "description": "only this topic (default: every topic)"},
        },
    },
    "OffsetCloneResult": {
        "type": "object",
        "properties": {
            "group": STR,
            "to": STR,
            "topic": NULL_STR,
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"topic": STR, "queue_id": INT, "offset": INT},
                },
            },
        },
    },
    "ConsumeDirectly": {
        "type": "object",
        "required": ["group", "client_id"],
        "additionalProperties": False,
        "properties": {
            "group": STR,
            "client_id": {**STR, "description": "a connected consumer of the group"},
            "topic": {**STR, "description": "the message's topic (default: any)"},
            "timeout_ms": {**INT, "minimum": 1, "description": "wait this long (default 5000)"},
        },
    },
    "ConsumeDirectlyResult": {
        "type": "object",
        "properties": {
            "message_id": STR,
            "topic": STR,
            "group": STR,
            "client_id": STR,
            "consumed": BOOL,
            "code": {**STR, "description": "the client's status: OK, NOT_IMPLEMENTED, ..."},
            "message": STR,
        },
    },
    "OffsetReset": {
        "type": "object",
        "required": ["topic", "timestamp_ms"],
        "additionalProperties": False,
        "properties": {"topic": STR, "timestamp_ms": {**INT, "minimum": 0}},
    },
    "OffsetResetResult": {
        "type": "object",
        "properties": {
            "group": STR,
            "topic": STR,
            "timestamp_ms": INT,
            "queues": {
                "type": "array",
                "items": {"type": "object", "properties": {"queue_id": INT, "offset": INT}},
            },
        },
    },
    "Producers": {
        "type": "object",
        "properties": {
            "registry": {"type": "boolean", "description": "false: no gRPC server here"},
            "clients": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "client_id": STR,
                        "group": {**STR, "nullable": True},
                        "peer": {**STR, "description": "the client's address"},
                        "language": STR,
                        "version": STR,
                        "publishes": {"type": "array", "items": STR},
                        "messages_sent": {**INT, "description": "since it connected"},
                        "send_rate": {"type": "number", "description": "messages/s, 1-min mean"},
                        "stream": {"type": "boolean"},
                        "idle_seconds": {"type": "number"},
                    },
                },
            },
        },
    },
}

routes = RouteTable(SCHEMAS)


async def listed_sessions(request: web.Request) -> list[dict[str, Any]] | None:
    """The connected clients, listed: every proxy worker's in cluster mode, this server's
    otherwise; None for an admin app without a gRPC server."""
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is not None:
        return await cluster.sessions()
    clients = request.app.get(CLIENTS_KEY)
    return None if clients is None else [s.listing() for s in clients.sessions()]


def _shown(session: dict[str, Any], *, subscriptions: bool) -> dict[str, Any]:
    shown = {k: v for k, v in session.items() if k not in LISTING_FIELDS}
    if not subscriptions:
        shown.pop("subscriptions", None)
    return shown


@routes.route(
    "GET",
    "/v1/groups/{group}/clients",
    "Connected consumers of a group",
    "getGroupClients",
    (200, "GroupClients", "clients"),
    404,
    params=[GROUP],
)
async def get_group_clients(request: web.Request) -> web.Response:
    broker = broker_of(request)
    name = request.match_info["group"]
    group = jsonable(await call(existing_group, broker, name))
    sessions = await listed_sessions(request)
    described = [_shown(s, subscriptions=True) for s in consumers_of(sessions or [], name)]
    described.sort(key=lambda c: c["client_id"])
    return reply(
        {
            "group": name,
            "broadcast": group.get("broadcast"),
            "registry": sessions is not None,
            "clients": described,
        }
    )


@routes.route(
    "GET",
    "/v1/topics/{topic}/producers",
    "Connected producers that sent to a topic",
    "getTopicProducers",
    (200, "TopicProducers", "clients"),
    404,
    params=[TOPIC, query("group", "only this producer group")],
)
async def get_topic_producers(request: web.Request) -> web.Response:
    """Producers with a live telemetry stream that have sent to the topic (RocketMQ's
    producerConnection). A RocketMQ 5 producer names no group unless it is transactional,
    so the topic is the subject and ``?group=`` narrows to one producer group."""
    broker = broker_of(request)
    name = request.match_info["topic"]
    group = request.query.get("group") or None
    await call(existing_topic, broker, name)
    sessions = await listed_sessions(request)
    described = [_shown(s, subscriptions=False) for s in producers_of(sessions or [], name, group)]
    described.sort(key=lambda c: c["client_id"])
    return reply(
        {"topic": name, "group": group, "registry": sessions is not None, "clients": described}
    )


@routes.route(
    "GET",
    "/v1/producers",
    "Every connected producer, with its language, version, address and send rate",
    "listProducers",
    (200, "Producers", "producers"),
)
async def list_producers(request: web.Request) -> web.Response:
    """Every connected producer (the ones ``GET /v1/broker/status`` counts as producers),
    with what it sent and its send rate: the dashboard's Producers page."""
    sessions = await listed_sessions(request)
    described = [
        {**_shown(s, subscriptions=False), "publishes": s.get("publishes", [])}
        for s in sessions or []
        if s.get("is_producer")
    ]
    described.sort(key=lambda c: c["client_id"])
    return reply({"registry": sessions is not None, "clients": described})


@routes.route(
    "POST",
    "/v1/groups/{group}/reset-offset",
    "Move a group to a time in a topic",
    "resetGroupOffset",
    (200, "OffsetResetResult", "new offset per queue"),
    400,
    404,
    body="OffsetReset",
    params=[GROUP],
)
async def reset_offset(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"topic", "timestamp_ms"})
    topic = take(body, "topic", str, required=True)
    timestamp = take(body, "timestamp_ms", int, required=True, minimum=0)
    authorize_also(request, topic_resource(topic), *OFFSETS_IN_TOPIC)
    broker = broker_of(request)
    name = request.match_info["group"]

    def reset() -> dict[int, int]:
        existing_group(broker, name)
        existing_topic(broker, topic)
        return broker.reset_offset(name, topic, timestamp)

    offsets = await call(reset)
    queues = [{"queue_id": q, "offset": o} for q, o in sorted(offsets.items())]
    return reply({"group": name, "topic": topic, "timestamp_ms": timestamp, "queues": queues})


@routes.route(
    "POST",
    "/v1/groups/{group}/clone-offset",
    "Give another group this group's offsets",
    "cloneGroupOffset",
    (200, "OffsetCloneResult", "offsets applied per queue"),
    400,
    404,
    body="OffsetClone",
    params=[GROUP],
)
async def clone_offset(request: web.Request) -> web.Response:
    """Give group ``to`` the committed offsets of this group (RocketMQ's cloneGroupOffset), in
    ``topic`` or in every topic this group has progress in that the user may read (Sub or
    Get); queues it has none in stay."""
    body = await read_body(request)
    reject_unknown(body, {"to", "topic"})
    target = take(body, "to", str, required=True)
    topic = take(body, "topic", str)
    broker = broker_of(request)
    source = request.match_info["group"]
    if target == source:
        raise ApiError("'to' names the group itself: clone into another group")
    authorize_also(request, group_resource(target), "Update")  # the group whose offsets change
    if topic is not None:
        authorize_also(request, topic_resource(topic), *OFFSETS_IN_TOPIC)

    def clone() -> list[dict[str, Any]]:
        existing_group(broker, source)
        existing_group(broker, target)
        if topic is not None:
            existing_topic(broker, topic)
        per_topic: dict[str, dict[int, int]] = {}
        for q in broker.group_progress(source, topic):
            if topic is None and not may_also(request, topic_resource(q.topic), *OFFSETS_IN_TOPIC):
                continue  # another user's topic: moving offsets there needs a right on it
            per_topic.setdefault(q.topic, {})[q.queue_id] = q.committed_offset
        moved = []
        for name, offsets in sorted(per_topic.items()):
            applied = broker.seek_group(target, name, offsets)
            moved += [
                {"topic": name, "queue_id": q, "offset": o} for q, o in sorted(applied.items())
            ]
        return moved

    queues = await call(clone)
    return reply({"group": source, "to": target, "topic": topic, "queues": queues})


DEFAULT_CONSUME_TIMEOUT_MS = 5_000


@routes.route(
    "POST",
    "/v1/messages/{message_id}/consume",
    "Have a connected consumer consume a message now",
    "consumeMessageDirectly",
    (200, "ConsumeDirectlyResult", "the client's answer"),
    400,
    404,
    body="ConsumeDirectly",
    params=[name_in_path("message_id", "Message id")],
)
async def consume_directly(request: web.Request) -> web.Response:
    """Ask one connected consumer of a group to consume a stored message now, in its listener,
    and report its answer (RocketMQ's consumeMessageDirectly; it moves no offset and acks
    nothing: a test of the consumer's code on a real message, e.g. a dead letter)."""
    body = await read_body(request)
    reject_unknown(body, {"group", "client_id", "topic", "timeout_ms"})
    group = take(body, "group", str, required=True)
    client_id = take(body, "client_id", str, required=True)
    topic = take(body, "topic", str)
    timeout_ms = take(body, "timeout_ms", int, minimum=1) or DEFAULT_CONSUME_TIMEOUT_MS
    message_id = request.match_info["message_id"]
    broker = broker_of(request)
    await call(existing_group, broker, group)
    view = await stored_message(broker, message_id, topic)
    clients = request.app.get(CLIENTS_KEY)
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is None or holds(clients, client_id, group):
        answer = await verify_here(clients, client_id, group, view, timeout_ms / 1000)
    else:  # the client's stream is on another proxy worker, if anywhere
        answer = await cluster.consume_elsewhere(
            client_id, group, message_id, view.topic, timeout_ms / 1000
        )
    return reply(
        {
            "message_id": message_id,
            "topic": view.topic,
            "group": group,
            "client_id": client_id,
            "consumed": answer.consumed,
            "code": answer.code,
            "message": answer.message,
        }
    )
