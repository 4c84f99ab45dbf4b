"""OpenAPI paths and schemas of the lite topic endpoints (``admin_lite``).

Merged into the document by :func:`halfmoon.server.admin_openapi.openapi_document`.
"""

from __future__ import annotations

from typing import Any

from halfmoon.server.admin_openapi_common import _op, _path_param, _ref

_INT = {"type": "integer"}
_STR = {"type": "string"}

SCHEMAS: dict[str, Any] = {
    "LiteTopics": {
        "type": "object",
        "properties": {
            "topic": _STR,
            "lite_topics": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "lite_topic": _STR,
                        "min_offset": _INT,
                        "max_offset": _INT,
                        "subscribers": {**_INT, "description": "clients subscribed to it"},
                    },
                },
            },
            "subscriptions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "client_id": _STR,
                        "group": _STR,
                        "topic": _STR,
                        "lite_topics": {"type": "array", "items": _STR},
                        "updated_ms": {**_INT, "description": "last SyncLiteSubscription"},
                    },
                },
            },
        },
    },
    "LiteTopicDeleted": {
        "type": "object",
        "properties": {
            "topic": _STR,
            "lite_topic": _STR,
            "deleted": {"type": "boolean"},
            "notified": {
                **_INT,
                "description": "subscribed clients sent NotifyUnsubscribeLiteCommand",
            },
        },
    },
}


def paths() -> dict[str, Any]:
    topic = _path_param("topic", "Lite parent topic")
    lite_topic = {
        "name": "lite_topic",
        "in": "path",
        "required": True,
        "description": "lite topic name: letters, digits, '-' and '_'",
        "schema": _STR,
    }
    return {
        "/v1/topics/{topic}/lite-topics": {
            "get": _op(
                "Lite topics of a lite parent topic, and consumers' lite subscriptions",
                "listLiteTopics",
                (200, _ref("LiteTopics"), "each lite topic and subscription"),
                400,
                404,
                params=[topic],
            ),
        },
        "/v1/topics/{topic}/lite-topics/{lite_topic}": {
            "delete": _op(
                "Delete a lite topic (its subscribers are told to unsubscribe)",
                "deleteLiteTopic",
                (200, _ref("LiteTopicDeleted"), "deleted"),
                400,
                404,
                params=[topic, lite_topic],
            ),
        },
    }
