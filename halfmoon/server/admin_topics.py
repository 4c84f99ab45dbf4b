"""Admin endpoints over topics and consumer groups (and the broker's status and
configuration): create, read, change, delete, offsets per queue, a group's progress.

Every endpoint ends in one call of the :class:`~halfmoon.broker.facade.Broker`
facade and translates its result to JSON; no rule about topics or groups lives here.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from halfmoon.auth import topic as topic_resource
from halfmoon.broker.groups import DEFAULT_MAX_DELIVERY_ATTEMPTS, RetryPolicy
from halfmoon.broker.message import MessageType
from halfmoon.config import config_to_dict
from halfmoon.server.admin_auth import OFFSETS_IN_TOPIC, authorize_also, may_also
from halfmoon.server.admin_http import (
    CONFIG_KEY,
    ApiError,
    broker_of,
    call,
    existing_group,
    existing_topic,
    read_body,
    reject_unknown,
    reply,
    take,
)
from halfmoon.server.admin_paging import page_of
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import (
    BOOL,
    GROUP,
    INT,
    PAGING_FIELDS,
    PAGING_PARAMS,
    STR,
    TOPIC,
    query,
    ref,
)

TOPIC_TYPES = [t.value for t in MessageType]
PERMS = ["rw", "r", "w"]
CONSUME_FROM = ["latest", "earliest", "auto"]

SCHEMAS: dict[str, Any] = {
    "Topic": {
        "type": "object",
        "required": ["name", "message_type", "queue_count", "perm"],
        "properties": {
            "name": STR,
            "message_type": {"type": "string", "enum": TOPIC_TYPES},
            "queue_count": {**INT, "description": "writable queues"},
            "perm": {"type": "string", "enum": ["rw", "r", "w", "-"]},
            "read_queue_count": {**INT, "description": "readable queues (more after a shrink)"},
            "created_ms": INT,
            "trace": {"type": "boolean", "description": "its messages' trace is recorded"},
        },
    },
    "TopicCreate": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": STR,
            "message_type": {"type": "string", "enum": TOPIC_TYPES, "default": "normal"},
            "queue_count": {
                **INT,
                "minimum": 1,
                "description": "default: broker.default_queue_count",
            },
            "perm": {"type": "string", "enum": ["rw", "r", "w"], "default": "rw"},
        },
    },
    "TopicUpdate": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            "message_type": {"type": "string", "enum": TOPIC_TYPES},
            "queue_count": {**INT, "minimum": 1},
            "perm": {"type": "string", "enum": ["rw", "r", "w"]},
            "trace": {"type": "boolean", "description": "record its messages' trace"},
        },
    },
    "TopicList": {
        "type": "object",
        "properties": {"topics": {"type": "array", "items": ref("Topic")}, **PAGING_FIELDS},
    },
    "QueueStatus": {
        "type": "object",
        "properties": {
            "topic": STR,
            "queue_id": INT,
            "min_offset": {**INT, "description": "first retained offset"},
            "max_offset": {**INT, "description": "one past the last offset"},
            "last_store_timestamp": {
                **INT,
                "nullable": True,
                "description": "ms since the epoch; null for an empty queue",
            },
            "perm": {"type": "string", "enum": ["rw", "r", "w", "-"]},
        },
    },
    "TopicStatus": {
        "type": "object",
        "properties": {"topic": STR, "queues": {"type": "array", "items": ref("QueueStatus")}},
    },
    "RetryPolicy": {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["customized", "exponential"]},
            "levels_ms": {
                "type": "array",
                "items": INT,
                "description": "customized: wait per attempt",
            },
            "initial_ms": INT,
            "max_ms": INT,
            "multiplier": {"type": "number"},
        },
    },
    "Group": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": STR,
            "fifo": BOOL,
            "max_delivery_attempts": INT,
            "retry_policy": ref("RetryPolicy"),
            "consume_from": {"type": "string", "enum": ["latest", "earliest", "auto"]},
            "consume_enabled": BOOL,
            "broadcast": BOOL,
            "created_ms": INT,
        },
    },
    "GroupSettings": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "fifo": {**BOOL, "default": False},
            "max_delivery_attempts": {
                **INT,
                "minimum": 1,
                "default": DEFAULT_MAX_DELIVERY_ATTEMPTS,
            },
            "retry_policy": ref("RetryPolicy"),
            "consume_from": {
                "type": "string",
                "enum": ["latest", "earliest", "auto"],
                "default": "auto",
            },
            "consume_enabled": {**BOOL, "default": True},
            "broadcast": {**BOOL, "default": False},
        },
    },
    "GroupCreate": {
        "allOf": [
            ref("GroupSettings"),
            {"type": "object", "required": ["name"], "properties": {"name": STR}},
        ]
    },
    "GroupList": {
        "type": "object",
        "properties": {"groups": {"type": "array", "items": ref("Group")}, **PAGING_FIELDS},
    },
    "QueueProgress": {
        "type": "object",
        "properties": {
            "group": STR,
            "topic": STR,
            "queue_id": INT,
            "committed_offset": {**INT, "description": "every offset below is consumed"},
            "max_offset": INT,
            "lag": {**INT, "description": "max_offset - committed_offset"},
            "inflight": {**INT, "description": "delivered, not yet acknowledged"},
            "retrying": {
                **INT,
                "description": "of those in flight, delivered more than once (being retried)",
            },
            "ready": {
                **INT,
                "description": "what a receive would hand out now: never delivered, or in "
                "flight and visible again (requeued, timed out)",
            },
        },
    },
    "GroupProgress": {
        "type": "object",
        "properties": {
            "group": STR,
            "topic": {"type": "string", "nullable": True},
            "queues": {"type": "array", "items": ref("QueueProgress")},
        },
    },
    "BrokerStatus": {
        "type": "object",
        "properties": {
            "name": STR,
            "uptime_ms": INT,
            "topics": INT,
            "groups": INT,
            "queues": INT,
            "messages_in_total": INT,
            "messages_out_total": INT,
            "tps_in": {"type": "number", "description": "messages/s, 1-minute average"},
            "tps_out": {"type": "number"},
            "disk_bytes": INT,
            "pending_delay_messages": INT,
        },
        "additionalProperties": True,
    },
}

routes = RouteTable(SCHEMAS)


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


@routes.route("GET", "/v1/status", "Broker status", "getStatus", (200, "BrokerStatus", "status"))
async def get_status(request: web.Request) -> web.Response:
    return reply(await call(broker_of(request).status))


@routes.route(
    "GET",
    "/v1/config",
    "Running configuration",
    "getConfig",
    (200, {"type": "object"}, "every section and key"),
)
async def get_config(request: web.Request) -> web.Response:
    return reply(config_to_dict(request.app[CONFIG_KEY]))


@routes.route(
    "GET",
    "/v1/topics",
    "List topics",
    "listTopics",
    (200, "TopicList", "all topics, or one page of the matches"),
    400,
    params=PAGING_PARAMS,
)
async def list_topics(request: web.Request) -> web.Response:
    topics = await call(broker_of(request).list_topics)
    return reply(page_of(request, "topics", topics))


@routes.route(
    "POST",
    "/v1/topics",
    "Create a topic",
    "createTopic",
    (201, "Topic", "created"),
    400,
    409,
    body="TopicCreate",
)
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


@routes.route(
    "GET",
    "/v1/topics/{topic}",
    "One topic",
    "getTopic",
    (200, "Topic", "the topic"),
    404,
    params=[TOPIC],
)
async def get_topic(request: web.Request) -> web.Response:
    return reply(await call(broker_of(request).get_topic, request.match_info["topic"]))


@routes.route(
    "PATCH",
    "/v1/topics/{topic}",
    "Change a topic",
    "updateTopic",
    (200, "Topic", "updated"),
    400,
    404,
    body="TopicUpdate",
    params=[TOPIC],
)
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


@routes.route(
    "DELETE",
    "/v1/topics/{topic}",
    "Delete a topic",
    "deleteTopic",
    (200, "Deleted", "deleted"),
    404,
    params=[TOPIC],
)
async def delete_topic(request: web.Request) -> web.Response:
    name = request.match_info["topic"]
    await call(broker_of(request).delete_topic, name)
    return reply({"deleted": name})


@routes.route(
    "GET",
    "/v1/topics/{topic}/status",
    "Offsets per queue",
    "getTopicStatus",
    (200, "TopicStatus", "min/max offsets"),
    404,
    params=[TOPIC],
)
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


@routes.route(
    "GET",
    "/v1/groups",
    "List consumer groups",
    "listGroups",
    (200, "GroupList", "all groups, or one page of the matches"),
    400,
    params=PAGING_PARAMS,
)
async def list_groups(request: web.Request) -> web.Response:
    groups = await call(broker_of(request).list_groups)
    return reply(page_of(request, "groups", groups))


@routes.route(
    "POST",
    "/v1/groups",
    "Create a consumer group",
    "createGroup",
    (201, "Group", "created"),
    400,
    409,
    body="GroupCreate",
)
async def create_group(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"name", "retry_policy", *GROUP_FIELDS})
    name = take(body, "name", str, required=True)
    group = await call(broker_of(request).create_group, name, **group_settings(body))
    return reply(group, status=201)


@routes.route(
    "GET",
    "/v1/groups/{group}",
    "One group",
    "getGroup",
    (200, "Group", "the group"),
    404,
    params=[GROUP],
)
async def get_group(request: web.Request) -> web.Response:
    group = await call(existing_group, broker_of(request), request.match_info["group"])
    return reply(group)


@routes.route(
    "PATCH",
    "/v1/groups/{group}",
    "Change a group",
    "updateGroup",
    (200, "Group", "updated"),
    400,
    404,
    body="GroupSettings",
    params=[GROUP],
)
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


@routes.route(
    "DELETE",
    "/v1/groups/{group}",
    "Delete a group",
    "deleteGroup",
    (200, "Deleted", "deleted"),
    404,
    params=[GROUP],
)
async def delete_group(request: web.Request) -> web.Response:
    name = request.match_info["group"]
    await call(broker_of(request).delete_group, name)
    return reply({"deleted": name})


@routes.route(
    "GET",
    "/v1/groups/{group}/progress",
    "Consumer progress (lag per queue)",
    "getGroupProgress",
    (200, "GroupProgress", "per queue"),
    404,
    params=[GROUP, query("topic", "only this topic's queues")],
)
async def group_progress(request: web.Request) -> web.Response:
    broker = broker_of(request)
    name = request.match_info["group"]
    topic = request.query.get("topic") or None
    if topic is not None:  # the answer shows its queues' offsets
        authorize_also(request, topic_resource(topic), *OFFSETS_IN_TOPIC)
    await call(existing_group, broker, name)
    if topic is not None:
        await call(existing_topic, broker, topic)
    queues = await call(broker.group_progress, name, topic)
    if topic is None:  # only the topics whose offsets the user may see
        queues = [
            q for q in queues if may_also(request, topic_resource(q.topic), *OFFSETS_IN_TOPIC)
        ]
    return reply({"group": name, "topic": topic, "queues": queues})
