"""A consumer group's backlog in one topic: look at it (peek) or drop it (purge: skip it
all, the group's offsets to the queues' ends).

In halfmoon, as in RocketMQ, a message stays in its topic's queues; what a
consumer group has left to consume is the part of each queue past the group's
committed offset. That is what RabbitMQ calls a queue's messages, so *peek*
reads them from there without consuming (no delivery, no invisibility, no
offset moves: a read of the store, like the time-range scan), and *purge*
moves the group's committed offset of every queue of the topic to the queue's
end, as ``queue.purge`` does on the AMQP endpoint (halfmoon/amqp/queues.py).
Other groups of the topic keep their messages: a purge drops one group's
backlog, never the topic's data (``topic delete`` or retention does that).

Where the group has no progress yet in a queue, its backlog is counted from the
queue's first retained message (``consume_from`` decides where a first receive
starts; a purge makes that question moot).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from halfmoon.auth import topic as topic_resource
from halfmoon.broker.facade import Broker
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.server.admin_auth import OFFSETS_IN_TOPIC, authorize_also
from halfmoon.server.admin_http import (
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
from halfmoon.server.admin_messages import message_json, query_int
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import GROUP, INT, STR, query, ref

SCHEMAS: dict[str, Any] = {
    "Peek": {
        "type": "object",
        "properties": {
            "group": STR,
            "topic": STR,
            "backlog": {**INT, "description": "messages past the group's committed offsets"},
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "queue_id": INT,
                        "from_offset": {**INT, "description": "where the backlog starts"},
                        "backlog": INT,
                    },
                },
            },
            "messages": {
                "type": "array",
                "description": "the first of the backlog, queue by queue (nothing consumed)",
                "items": ref("StoredMessage"),
            },
        },
    },
    "Purge": {
        "type": "object",
        "required": ["topic"],
        "properties": {"topic": {**STR, "description": "the topic whose backlog goes"}},
        "additionalProperties": False,
    },
    "PurgeResult": {
        "type": "object",
        "properties": {
            "group": STR,
            "topic": STR,
            "purged": {**INT, "description": "messages the group will no longer get"},
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"queue_id": INT, "offset": INT, "purged": INT},
                },
            },
        },
    },
}

routes = RouteTable(SCHEMAS)


MAX_PEEK = 100  # messages per peek: a look, not an export
DEFAULT_PEEK = 20
_END_OF_TIME_MS = 2**62


def _backlog_start(broker: Broker, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """Per readable queue: (where the group's backlog starts, the queue's end)."""
    committed = {q.queue_id: q.committed_offset for q in broker.group_progress(group, topic)}
    return {
        s.queue_id: (max(committed.get(s.queue_id, s.min_offset), s.min_offset), s.max_offset)
        for s in broker.topic_status(topic)
    }


@routes.route(
    "GET",
    "/v1/groups/{group}/peek",
    "The next messages a group would get in a topic, without consuming them",
    "peekGroupBacklog",
    (200, "Peek", "the backlog and its first messages"),
    400,
    404,
    params=[
        GROUP,
        query("topic", "the topic", required=True),
        query("limit", "at most this many (default 20, max 100)", {**INT, "minimum": 1}),
    ],
)
async def peek(request: web.Request) -> web.Response:
    broker = broker_of(request)
    group = request.match_info["group"]
    topic = request.query.get("topic") or ""
    if not topic:
        raise ApiError("query parameter 'topic' is required: a group's backlog is per topic")
    limit = query_int(request, "limit", minimum=1, default=DEFAULT_PEEK)
    assert limit is not None
    if limit > MAX_PEEK:
        raise ApiError(f"query parameter 'limit' is at most {MAX_PEEK}")
    authorize_also(request, topic_resource(topic), "Get")  # it shows the topic's bodies

    def look() -> dict[str, Any]:
        existing_group(broker, group)
        existing_topic(broker, topic)
        queues: list[dict[str, Any]] = []
        messages: list[dict[str, Any]] = []
        every = FilterSpec("TAG", "*")
        for queue_id, (start, end) in sorted(_backlog_start(broker, group, topic).items()):
            queues.append({"queue_id": queue_id, "from_offset": start, "backlog": end - start})
            room = limit - len(messages)
            if room <= 0 or start >= end:
                continue
            found = broker.scan(topic, queue_id, start, 0, _END_OF_TIME_MS, room, every)
            messages += [message_json(m) for m in found.messages]
        backlog = sum(q["backlog"] for q in queues)
        return {
            "group": group,
            "topic": topic,
            "backlog": backlog,
            "queues": queues,
            "messages": messages,
        }

    return reply(await call(look))


@routes.route(
    "POST",
    "/v1/groups/{group}/purge",
    "Drop a group's backlog in a topic (its offsets move to the queues' ends)",
    "purgeGroupBacklog",
    (200, "PurgeResult", "what was skipped per queue"),
    400,
    404,
    body="Purge",
    params=[GROUP],
)
async def purge(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"topic"})
    topic = take(body, "topic", str, required=True)
    authorize_also(
        request, topic_resource(topic), *OFFSETS_IN_TOPIC
    )  # the answer counts its backlog
    broker = broker_of(request)
    group = request.match_info["group"]

    def drop() -> dict[str, Any]:
        existing_group(broker, group)
        existing_topic(broker, topic)
        spans = _backlog_start(broker, group, topic)
        broker.seek_group(group, topic, {q: end for q, (_, end) in spans.items()})
        queues = [
            {"queue_id": q, "offset": end, "purged": end - start}
            for q, (start, end) in sorted(spans.items())
        ]
        return {
            "group": group,
            "topic": topic,
            "purged": sum(q["purged"] for q in queues),
            "queues": queues,
        }

    return reply(await call(drop))
