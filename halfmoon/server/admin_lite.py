"""Admin API of lite topics (RIP-83): list a parent's lite topics and subscriptions, delete one.

``GET /v1/topics/{topic}/lite-topics``: each lite topic of a ``lite`` parent
(offsets, subscriber count) and every consumer client's lite subscriptions.
``DELETE /v1/topics/{topic}/lite-topics/{lite_topic}``: drop one lite topic's
messages and subscriptions; subscribed clients get NotifyUnsubscribeLiteCommand.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from halfmoon.server.admin_http import broker_of, call, reply
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import INT, STR, name_in_path, path

SCHEMAS: dict[str, Any] = {
    "LiteTopics": {
        "type": "object",
        "properties": {
            "topic": STR,
            "lite_topics": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "lite_topic": STR,
                        "min_offset": INT,
                        "max_offset": INT,
                        "subscribers": {**INT, "description": "clients subscribed to it"},
                    },
                },
            },
            "subscriptions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "client_id": STR,
                        "group": STR,
                        "topic": STR,
                        "lite_topics": {"type": "array", "items": STR},
                        "updated_ms": {**INT, "description": "last SyncLiteSubscription"},
                    },
                },
            },
        },
    },
    "LiteTopicDeleted": {
        "type": "object",
        "properties": {
            "topic": STR,
            "lite_topic": STR,
            "deleted": {"type": "boolean"},
            "notified": {
                **INT,
                "description": "subscribed clients sent NotifyUnsubscribeLiteCommand",
            },
        },
    },
}

routes = RouteTable(SCHEMAS)

PARENT = name_in_path("topic", "Lite parent topic")
LITE_TOPIC = path("lite_topic", "lite topic name: letters, digits, '-' and '_'")


@routes.route(
    "GET",
    "/v1/topics/{topic}/lite-topics",
    "Lite topics of a lite parent topic, and consumers' lite subscriptions",
    "listLiteTopics",
    (200, "LiteTopics", "each lite topic and subscription"),
    400,
    404,
    params=[PARENT],
)
async def list_lite_topics(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.match_info["topic"]
    lite_topics = await call(broker.list_lite_topics, topic)
    subscriptions = await call(broker.lite_subscriptions, topic)
    return reply({"topic": topic, "lite_topics": lite_topics, "subscriptions": subscriptions})


@routes.route(
    "DELETE",
    "/v1/topics/{topic}/lite-topics/{lite_topic}",
    "Delete a lite topic (its subscribers are told to unsubscribe)",
    "deleteLiteTopic",
    (200, "LiteTopicDeleted", "deleted"),
    400,
    404,
    params=[PARENT, LITE_TOPIC],
)
async def delete_lite_topic(request: web.Request) -> web.Response:
    topic, lite_topic = request.match_info["topic"], request.match_info["lite_topic"]
    notified = await call(broker_of(request).delete_lite_topic, topic, lite_topic)
    return reply({"topic": topic, "lite_topic": lite_topic, "deleted": True, "notified": notified})
