"""Admin endpoints over stored messages: find, read, send, and scan (RocketMQ's
queryMsgById / queryMsgByKey / queryMsgByOffset / sendMessage / consumeMessage / printMsg).

Reads never touch consumer state: no offsets move, nothing becomes invisible.
The message id is the unique id (``UNIQ_KEY``) the store indexes beside the
keys, so a lookup by id is a key-index query; without ``topic`` every topic is
searched (dead-letter copies keep their id, so one id may answer several
messages). Bodies travel as UTF-8 text when they are, else base64
(``body_encoding`` says which).

A scan walks one queue (``queue``) or every readable queue in order, from
``offset`` (one queue only), else from the first message stored at or after
``begin_ms``, else from the queue's start; it stops at ``end_ms``, after
``limit`` messages, or after examining ``MAX_SCAN_ENTRIES`` entries (see
:mod:`halfmoon.broker.browse`, which does the reading). Its answer
carries ``next_offsets`` per queue and ``complete`` so a caller can continue
where it stopped, and ``tag_counts`` over every matching message it saw.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from aiohttp import web

from halfmoon.broker.browse import ScanResult
from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.broker.trace import EVENTS as TRACE_EVENTS
from halfmoon.errors import NotFound
from halfmoon.server.admin_http import (
    ApiError,
    broker_of,
    call,
    read_body,
    reject_unknown,
    reply,
    take,
)
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import (
    BOOL,
    INT,
    NULL_INT,
    NULL_STR,
    STR,
    TOPIC,
    path,
    path_int,
    query,
    ref,
)

SCHEMAS: dict[str, Any] = {
    "StoredMessage": {
        "type": "object",
        "properties": {
            "message_id": STR,
            "topic": STR,
            "queue_id": INT,
            "queue_offset": INT,
            "commit_log_offset": INT,
            "tag": NULL_STR,
            "keys": {"type": "array", "items": STR},
            "message_type": STR,
            "message_group": NULL_STR,
            "delivery_timestamp": NULL_INT,
            "priority": NULL_INT,
            "lite_topic": NULL_STR,
            "born_timestamp": INT,
            "store_timestamp": INT,
            "born_host": STR,
            "store_host": STR,
            "properties": {"type": "object", "additionalProperties": STR},
            "body_size": INT,
            "origin_message_id": {
                **NULL_STR,
                "description": "the message a dead letter (or a retried copy) was made from",
            },
            "dead_letter_group": {**NULL_STR, "description": "the group that gave up on it"},
            "dead_letter_attempts": {**NULL_INT, "description": "deliveries before it did"},
            "dead_letter_topic": {**NULL_STR, "description": "the topic it was consumed from"},
            "body": {**STR, "description": "absent when bodies=false"},
            "body_encoding": {"type": "string", "enum": ["utf-8", "base64"]},
        },
    },
    "MessageList": {
        "type": "object",
        "properties": {"messages": {"type": "array", "items": ref("StoredMessage")}},
        "additionalProperties": True,
    },
    "MessageSend": {
        "type": "object",
        "required": ["body"],
        "additionalProperties": False,
        "properties": {
            "body": STR,
            "body_encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
            "tag": STR,
            "keys": {"type": "array", "items": STR},
            "queue_id": {**INT, "minimum": 0},
            "properties": {"type": "object", "additionalProperties": STR},
            "message_group": STR,
            "delivery_timestamp": INT,
            "priority": {**INT, "minimum": 0, "description": "a priority message (RIP-80)"},
            "lite_topic": {**STR, "description": "a lite message (RIP-83)"},
        },
    },
    "SendResult": {
        "type": "object",
        "properties": {
            "message_id": STR,
            "topic": STR,
            "queue_id": INT,
            "queue_offset": INT,
            "commit_log_offset": INT,
        },
    },
    "Scan": {
        "type": "object",
        "properties": {
            "topic": STR,
            "filter_type": STR,
            "filter": STR,
            "messages": {"type": "array", "items": ref("StoredMessage")},
            "matched": INT,
            "examined": INT,
            "tag_counts": {"type": "object", "additionalProperties": INT},
            "next_offsets": {
                "type": "object",
                "additionalProperties": INT,
                "description": "queue id -> where to continue",
            },
            "complete": {
                **BOOL,
                "description": "false when the limit or the scan budget stopped it",
            },
        },
    },
    "MessageTrace": {
        "type": "object",
        "description": "what the broker recorded about a message (docs/dashboard.md)",
        "properties": {
            "message_id": STR,
            "messages": {
                "type": "array",
                "description": "every stored copy (bodies left out)",
                "items": {"type": "object"},
            },
            "events": {
                "type": "array",
                "description": "oldest first",
                "items": {
                    "type": "object",
                    "required": ["time_ms", "event"],
                    "properties": {
                        "time_ms": INT,
                        "event": {
                            "type": "string",
                            "enum": ["stored", *TRACE_EVENTS],
                        },
                        "group": STR,
                        "attempt": INT,
                        "mode": {"type": "string", "enum": ["pop", "pull"]},
                        "client": STR,
                        "source": {
                            "type": "string",
                            "description": "who decided: producer, check, operator or group",
                        },
                        "resolution": STR,
                        "transaction_id": STR,
                        "broker": {**STR, "description": "cluster mode: the broker it is on"},
                    },
                },
            },
        },
    },
}

routes = RouteTable(SCHEMAS)

MESSAGE_ID = path("message_id")
TIME_RANGE = [
    query("begin_ms", "earliest store time, ms since the epoch", INT),
    query("end_ms", "latest store time, ms since the epoch", INT),
]


# Trace events that come before a stored copy of the message exists.
BEFORE_STORED = frozenset({"half_stored", "check_sent", "check_answered", "parked", "resumed"})


class NoTrace(NotFound):
    """Neither a stored message nor a recorded trace has this id."""

    code = "MESSAGE_NOT_FOUND"  # the same code as a missing message


MAX_SCAN_LIMIT = 10_000  # messages per answer
MAX_KEY_RESULTS = 1_000


# -- JSON of a message ----------------------------------------------------------------


def message_json(view: MessageView, *, body: bool = True) -> dict[str, Any]:
    data: dict[str, Any] = {
        "message_id": view.message_id,
        "topic": view.topic,
        "queue_id": view.queue_id,
        "queue_offset": view.queue_offset,
        "commit_log_offset": view.commit_log_offset,
        "tag": view.tag,
        "keys": view.keys,
        "message_type": view.message_type.value,
        "message_group": view.message_group,
        "delivery_timestamp": view.delivery_timestamp,
        "priority": view.priority,
        "lite_topic": view.lite_topic,
        "born_timestamp": view.born_timestamp,
        "store_timestamp": view.store_timestamp,
        "born_host": view.born_host,
        "store_host": view.store_host,
        "properties": view.properties,
        "body_size": len(view.body),
        "origin_message_id": view.origin_message_id,
        "dead_letter_group": view.dead_letter_group,
        "dead_letter_attempts": view.dead_letter_attempts,
        "dead_letter_topic": view.dead_letter_topic,
    }
    if body:
        try:
            data["body"], data["body_encoding"] = view.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            data["body"], data["body_encoding"] = base64.b64encode(view.body).decode(), "base64"
    return data


# -- query parameters ------------------------------------------------------------------


def query_int(
    request: web.Request, name: str, *, minimum: int = 0, default: int | None = None
) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(f"query parameter {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ApiError(f"query parameter {name!r} must be at least {minimum}, not {value}")
    return value


def query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ApiError(f"query parameter {name!r} must be true or false, not {raw!r}")


def _time_range(request: web.Request) -> tuple[int, int]:
    begin = query_int(request, "begin_ms", default=0) or 0
    end = query_int(request, "end_ms", default=2**63 - 1)
    assert end is not None
    if end < begin:
        raise ApiError(f"end_ms ({end}) is before begin_ms ({begin})")
    return begin, end


# -- handlers ---------------------------------------------------------------------------


@routes.route(
    "GET",
    "/v1/messages/{message_id}",
    "Messages by id (every topic unless topic is given)",
    "getMessageById",
    (200, "MessageList", "every copy found"),
    400,
    404,
    params=[MESSAGE_ID, query("topic", "search only this topic")],
)
async def get_message_by_id(request: web.Request) -> web.Response:
    broker = broker_of(request)
    message_id = request.match_info["message_id"]
    topic = request.query.get("topic") or None
    found = await call(broker.messages_by_id, message_id, topic)
    return reply({"message_id": message_id, "messages": [message_json(m) for m in found]})


@routes.route(
    "GET",
    "/v1/messages/{message_id}/trace",
    "A message's trace: stored, delivered, acked, retried, dead-lettered, resent; "
    "a transactional message's half, checks, answers and decision",
    "getMessageTrace",
    (200, "MessageTrace", "its copies and events"),
    404,
    params=[MESSAGE_ID],
)
async def get_message_trace(request: web.Request) -> web.Response:
    """The message's trace: where each copy is stored, then what the broker recorded."""
    broker = broker_of(request)
    message_id = request.match_info["message_id"]

    def read() -> tuple[list[MessageView], list[dict[str, Any]]]:
        try:
            copies = broker.messages_by_id(message_id, None)
        except NotFound:
            copies = []
        return copies, broker.message_trace(message_id)

    copies, recorded = await call(read)
    if not copies and not recorded:
        raise NoTrace(
            f"no message with id {message_id!r} and no trace of one (it may be older than the "
            "retention, or the id may be mistyped)"
        )
    stored = [
        {
            "time_ms": view.store_timestamp,
            "event": "stored",
            "topic": view.topic,
            "queue_id": view.queue_id,
            "queue_offset": view.queue_offset,
            "store_host": view.store_host,
        }
        for view in copies
    ]
    # Within one millisecond: what leads to storing the message, then its storing, then the
    # rest (a check answer commits, and the committed message is stored, in the same ms).
    events = sorted(
        stored + recorded,
        key=lambda e: (e["time_ms"], _tie_rank(e["event"])),
    )
    return reply(
        {
            "message_id": message_id,
            "messages": [message_json(view, body=False) for view in copies],
            "events": events,
        }
    )


def _tie_rank(event: str) -> int:
    return 0 if event in BEFORE_STORED else 1 if event == "stored" else 2


@routes.route(
    "GET",
    "/v1/topics/{topic}/messages",
    "Messages by key within a store-time range",
    "queryMessagesByKey",
    (200, "MessageList", "matches, oldest first"),
    400,
    404,
    params=[
        TOPIC,
        query("key", "the message key", required=True),
        *TIME_RANGE,
        query("limit", "at most this many (default 64)", INT),
    ],
)
async def query_by_key(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.match_info["topic"]
    key = request.query.get("key")
    if not key:
        raise ApiError("query parameter 'key' is required")
    begin, end = _time_range(request)
    limit = query_int(request, "limit", minimum=1, default=64)
    assert limit is not None
    limit = min(limit, MAX_KEY_RESULTS)

    found = await call(broker.messages_by_key, topic, key, begin, end, limit)
    messages = [message_json(m) for m in found]
    return reply(
        {"topic": topic, "key": key, "begin_ms": begin, "end_ms": end, "messages": messages}
    )


@routes.route(
    "GET",
    "/v1/topics/{topic}/queues/{queue_id}/offsets/{offset}",
    "The message at a queue offset",
    "getMessageAt",
    (200, "StoredMessage", "the message"),
    400,
    404,
    params=[TOPIC, path_int("queue_id", "queue id"), path_int("offset", "queue offset")],
)
async def get_message_at(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.match_info["topic"]
    queue_id = _path_int(request, "queue_id")
    offset = _path_int(request, "offset")

    return reply(message_json(await call(broker.message_at, topic, queue_id, offset)))


def _path_int(request: web.Request, name: str) -> int:
    raw = request.match_info[name]
    if not raw.isdigit():
        raise ApiError(f"{name.replace('_', ' ')} must be a non-negative integer, not {raw!r}")
    return int(raw)


SEND_FIELDS = {
    "body",
    "body_encoding",
    "tag",
    "keys",
    "queue_id",
    "properties",
    "message_group",
    "delivery_timestamp",
    "priority",
    "lite_topic",
}


@routes.route(
    "POST",
    "/v1/topics/{topic}/messages",
    "Send one message",
    "sendMessage",
    (201, "SendResult", "stored"),
    400,
    403,
    404,
    body="MessageSend",
    params=[TOPIC],
)
async def send_message(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, SEND_FIELDS)
    text = take(body, "body", str, required=True)
    encoding = take(body, "body_encoding", str, choices=["utf-8", "base64"]) or "utf-8"
    if encoding == "base64":
        try:
            payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("field 'body' is not valid base64") from None
    else:
        payload = text.encode("utf-8")
    keys = take(body, "keys", list) or []
    properties = take(body, "properties", dict) or {}
    if not all(isinstance(k, str) for k in keys):
        raise ApiError("field 'keys' must be an array of strings")
    if not all(isinstance(v, str) for v in properties.values()):
        raise ApiError("field 'properties' must map names to strings")
    message = OutgoingMessage(
        topic=request.match_info["topic"],
        body=payload,
        tag=take(body, "tag", str),
        keys=keys,
        properties=properties,
        queue_id=take(body, "queue_id", int, minimum=0),
        message_group=take(body, "message_group", str),
        delivery_timestamp=take(body, "delivery_timestamp", int, minimum=0),
        priority=take(body, "priority", int),
        lite_topic=take(body, "lite_topic", str),
        born_host="admin",
    )
    if message.priority is not None:
        message.message_type = MessageType.PRIORITY
    elif message.lite_topic is not None:
        message.message_type = MessageType.LITE
    broker = broker_of(request)

    def send() -> SendResult:
        if broker.find_topic(message.topic) is None:  # never auto-create from the admin API
            raise TopicNotFound(message.topic)
        message.born_timestamp = int(time.time() * 1000)
        return broker.send([message])[0]

    result = await call(send)
    return reply(
        {
            "message_id": result.message_id,
            "topic": result.topic,
            "queue_id": result.queue_id,
            "queue_offset": result.queue_offset,
            "commit_log_offset": result.commit_log_offset,
        },
        status=201,
    )


@routes.route(
    "GET",
    "/v1/topics/{topic}/scan",
    "Read a range of messages without a consumer group",
    "scanMessages",
    (200, "Scan", "messages, tag counts and where to continue"),
    400,
    404,
    params=[
        TOPIC,
        query("queue", "one queue (default: all)", INT),
        query("offset", "start offset (needs queue)", INT),
        *TIME_RANGE,
        query("limit", "at most this many messages (default 32, max 10000)", INT),
        query("filter_type", "tag (default) or sql92"),
        query("filter", "filter expression (default *)"),
        query("bodies", "include bodies (default true)", BOOL),
        query("messages", "false: counts only (default true)", BOOL),
    ],
)
async def scan_messages(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.match_info["topic"]
    queue = query_int(request, "queue")
    offset = query_int(request, "offset")
    if offset is not None and queue is None:
        raise ApiError("'offset' needs 'queue': offsets belong to one queue")
    begin, end = _time_range(request)
    limit = query_int(request, "limit", minimum=1, default=32)
    assert limit is not None
    if limit > MAX_SCAN_LIMIT:
        raise ApiError(f"'limit' is at most {MAX_SCAN_LIMIT}; page with next_offsets")
    filter_type = (request.query.get("filter_type") or "tag").upper()
    if filter_type not in ("TAG", "SQL92"):
        raise ApiError(f"'filter_type' must be tag or sql92, not {filter_type.lower()!r}")
    spec = FilterSpec(filter_type, request.query.get("filter") or "*")
    bodies = query_bool(request, "bodies", True)
    with_messages = query_bool(request, "messages", True)

    found = await call(broker.scan, topic, queue, offset, begin, end, limit, spec, with_messages)
    return reply(
        {
            "topic": topic,
            "filter_type": filter_type.lower(),
            "filter": spec.expression,
            **_scan_json(found, bodies),
        }
    )


def _scan_json(found: ScanResult, bodies: bool) -> dict[str, Any]:
    return {
        "messages": [message_json(m, body=bodies) for m in found.messages],
        "matched": found.matched,
        "examined": found.examined,
        "tag_counts": found.tag_counts,
        "next_offsets": {str(q): o for q, o in found.next_offsets.items()},
        "complete": found.complete,
    }
