"""Resending a dead letter to the topic it was consumed from (rocketmq-dashboard's
"resend" on a ``%DLQ%`` message), and the number of dead letters per group.

The depth is counted on the server, one answer for every ``%DLQ%`` topic: the
dashboard's overview asks for it every few seconds, and a broker with a thousand
groups must not cost a thousand requests per refresh.

The record at that position of a dead-letter topic is read and sent again, as a new
message with the same body, tag, keys and user properties, to the topic named in the
dead letter (``dead_letter_topic``) or to ``topic`` when the body gives one. The dead
letter stays where it is: the dead-letter topic is an audit trail, and a resend that
fails again lands there a second time, as it would in RocketMQ.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from halfmoon.auth import topic as topic_resource
from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.message import MessageView, OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.broker.topics import DLQ_PREFIX
from halfmoon.server.admin_auth import authorize_also
from halfmoon.server.admin_http import ApiError, broker_of, call, read_body, reject_unknown, reply
from halfmoon.server.admin_http import take as take_field
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import INT, STR, name_in_path, path_int

SCHEMAS: dict[str, Any] = {
    "DeadLetterDepths": {
        "type": "object",
        "properties": {
            "total": {**INT, "description": "messages in every dead-letter topic"},
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"group": STR, "topic": STR, "messages": INT},
                },
            },
        },
    },
    "DeadLetterResend": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "topic": {**STR, "description": "send here instead of the dead letter's own topic"}
        },
    },
    "DeadLetterResent": {
        "type": "object",
        "properties": {
            "resent_from": {
                "type": "object",
                "properties": {
                    "topic": STR,
                    "queue_id": INT,
                    "queue_offset": INT,
                    "message_id": STR,
                },
            },
            "message_id": {**STR, "description": "the new message's id"},
            "topic": STR,
            "queue_id": INT,
            "queue_offset": INT,
        },
    },
}

routes = RouteTable(SCHEMAS)

POSITION = [
    name_in_path("topic", "Dead-letter topic (%DLQ%<group>, percent-encoded)"),
    path_int("queue_id"),
    path_int("offset"),
]


@routes.route(
    "GET",
    "/v1/dead-letters",
    "Dead letters per group",
    "getDeadLetterDepths",
    (200, "DeadLetterDepths", "depth of every %DLQ% topic"),
)
async def dead_letter_depths(request: web.Request) -> web.Response:
    broker = broker_of(request)

    def count() -> list[dict[str, Any]]:
        rows = []
        for topic in broker.list_topics():
            if topic.name.startswith(DLQ_PREFIX):
                queues = broker.topic_status(topic.name)
                rows.append(
                    {
                        "group": topic.name[len(DLQ_PREFIX) :],
                        "topic": topic.name,
                        "messages": sum(q.max_offset - q.min_offset for q in queues),
                    }
                )
        return sorted(rows, key=lambda row: row["group"])

    rows = await call(count)
    return reply({"total": sum(row["messages"] for row in rows), "groups": rows})


def _position(request: web.Request, name: str) -> int:
    raw = request.match_info[name]
    if not raw.isdigit():
        raise ApiError(f"{name.replace('_', ' ')} must be a non-negative integer, not {raw!r}")
    return int(raw)


@routes.route(
    "POST",
    "/v1/topics/{topic}/queues/{queue_id}/offsets/{offset}/resend",
    "Resend a dead letter to its topic",
    "resendDeadLetter",
    (201, "DeadLetterResent", "sent again; the dead letter stays"),
    400,
    404,
    body="DeadLetterResend",
    body_required=False,  # no body: back to the dead letter's own topic
    params=POSITION,
)
async def resend_dead_letter(request: web.Request) -> web.Response:
    body = await read_body(request) if request.can_read_body else {}
    reject_unknown(body, {"topic"})
    target = take_field(body, "topic", str)
    broker = broker_of(request)
    topic = request.match_info["topic"]
    queue_id = _position(request, "queue_id")
    offset = _position(request, "offset")

    def resend() -> tuple[MessageView, SendResult]:
        letter: MessageView = broker.message_at(topic, queue_id, offset)
        destination = target or letter.dead_letter_topic
        if letter.dead_letter_group is None or destination is None:
            raise ApiError(
                f"the message at {topic}/{queue_id}/{offset} is not a dead letter; "
                "give 'topic' to send a copy elsewhere"
                if target is None
                else f"the message at {topic}/{queue_id}/{offset} is not a dead letter"
            )
        # The copy is a send to the destination: the caller needs the right to write there,
        # checked before the answer can say whether that topic exists.
        authorize_also(request, topic_resource(destination), "Update")
        if broker.find_topic(destination) is None:
            raise TopicNotFound(destination)
        copy = OutgoingMessage(
            topic=destination,
            body=letter.body,
            tag=letter.tag,
            keys=list(letter.keys),
            properties=dict(letter.properties),
            born_host="admin",
            resent_from=letter.message_id,
        )
        copy.born_timestamp = int(time.time() * 1000)
        return letter, broker.send([copy])[0]

    letter, result = await call(resend)
    answer: dict[str, Any] = {
        "resent_from": {
            "topic": topic,
            "queue_id": queue_id,
            "queue_offset": offset,
            "message_id": letter.message_id,
        },
        "message_id": result.message_id,
        "topic": result.topic,
        "queue_id": result.queue_id,
        "queue_offset": result.queue_offset,
    }
    return reply(answer, status=201)
