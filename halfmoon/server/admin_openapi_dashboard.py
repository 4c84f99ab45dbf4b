"""OpenAPI paths and schemas the dashboard added: resending a dead letter, a message's trace,
the page itself.

Merged into the document by :func:`halfmoon.server.admin_openapi.openapi_document`;
the search and paging parameters of the topic and group lists are here too, shared
by both list operations.
"""

from __future__ import annotations

from typing import Any

from halfmoon.broker.trace import EVENTS as TRACE_EVENTS
from halfmoon.server.admin_openapi_common import _op, _path_param, _ref

_INT = {"type": "integer"}
_STR = {"type": "string"}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


# ?search=, ?offset=, ?limit= on GET /v1/topics and GET /v1/groups (admin_paging).
PAGING_PARAMS = [
    _query("search", "only names containing this text (case-insensitive)", _STR),
    _query("offset", "skip this many matches (names in order)", {**_INT, "minimum": 0}),
    _query("limit", "at most this many (default 100, max 1000)", {**_INT, "minimum": 1}),
]

# Present when any of the paging parameters was given.
PAGING_FIELDS = {
    "total": {**_INT, "description": "matches before paging"},
    "offset": _INT,
    "limit": _INT,
}

SCHEMAS: dict[str, Any] = {
    "DeadLetterDepths": {
        "type": "object",
        "properties": {
            "total": {**_INT, "description": "messages in every dead-letter topic"},
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"group": _STR, "topic": _STR, "messages": _INT},
                },
            },
        },
    },
    "WhoAmI": {
        "type": "object",
        "properties": {
            "auth_enabled": {"type": "boolean"},
            "authenticated": {"type": "boolean", "description": "the credentials verified"},
            "access_key": {"type": "string", "nullable": True},
            "reason": {"type": "string", "description": "why not authenticated"},
            "super": {"type": "boolean"},
            "can_write": {
                "type": "boolean",
                "description": "may Update the Cluster: the dashboard shows mutating controls",
            },
        },
    },
    "MessageTrace": {
        "type": "object",
        "description": "what the broker recorded about a message (docs/dashboard.md)",
        "properties": {
            "message_id": _STR,
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
                        "time_ms": _INT,
                        "event": {
                            "type": "string",
                            "enum": ["stored", *TRACE_EVENTS],
                        },
                        "group": _STR,
                        "attempt": _INT,
                        "mode": {"type": "string", "enum": ["pop", "pull"]},
                        "client": _STR,
                        "source": {
                            "type": "string",
                            "description": "who decided: producer, check, operator or group",
                        },
                        "resolution": _STR,
                        "transaction_id": _STR,
                        "broker": {**_STR, "description": "cluster mode: the broker it is on"},
                    },
                },
            },
        },
    },
    "DeadLetterResend": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "topic": {**_STR, "description": "send here instead of the dead letter's own topic"}
        },
    },
    "DeadLetterResent": {
        "type": "object",
        "properties": {
            "resent_from": {
                "type": "object",
                "properties": {
                    "topic": _STR,
                    "queue_id": _INT,
                    "queue_offset": _INT,
                    "message_id": _STR,
                },
            },
            "message_id": {**_STR, "description": "the new message's id"},
            "topic": _STR,
            "queue_id": _INT,
            "queue_offset": _INT,
        },
    },
}


def paths() -> dict[str, Any]:
    position = [
        _path_param("topic", "Dead-letter topic (%DLQ%<group>, percent-encoded)"),
        {
            "name": "queue_id",
            "in": "path",
            "required": True,
            "schema": {"type": "integer", "minimum": 0},
        },
        {
            "name": "offset",
            "in": "path",
            "required": True,
            "schema": {"type": "integer", "minimum": 0},
        },
    ]
    html = {"description": "the page", "content": {"text/html": {"schema": _STR}}}
    resend = _op(
        "Resend a dead letter to its topic",
        "resendDeadLetter",
        (201, _ref("DeadLetterResent"), "sent again; the dead letter stays"),
        400,
        404,
        body="DeadLetterResend",
        params=position,
    )
    resend["requestBody"]["required"] = False  # no body: back to the dead letter's own topic
    return {
        "/v1/whoami": {
            "get": {
                **_op(
                    "Who the credentials are, and whether they may change things",
                    "whoAmI",
                    (200, _ref("WhoAmI"), "the caller (authenticated or not)"),
                ),
                "security": [],
            },
        },
        "/v1/messages/{message_id}/trace": {
            "get": _op(
                "A message's trace: stored, delivered, acked, retried, dead-lettered, resent; "
                "a transactional message's half, checks, answers and decision",
                "getMessageTrace",
                (200, _ref("MessageTrace"), "its copies and events"),
                404,
                params=[{"name": "message_id", "in": "path", "required": True, "schema": _STR}],
            ),
        },
        "/v1/dead-letters": {
            "get": _op(
                "Dead letters per group",
                "getDeadLetterDepths",
                (200, _ref("DeadLetterDepths"), "depth of every %DLQ% topic"),
            ),
        },
        "/v1/topics/{topic}/queues/{queue_id}/offsets/{offset}/resend": {
            "post": resend,
        },
        "/dashboard": {
            "get": {
                "security": [],
                "summary": "Redirect to /dashboard/",
                "operationId": "redirectDashboard",
                "responses": {"302": {"description": "to /dashboard/"}},
            }
        },
        "/dashboard/": {
            "get": {
                "security": [],
                "summary": "The web dashboard (docs/dashboard.md)",
                "operationId": "getDashboard",
                "responses": {"200": html},
            }
        },
        "/dashboard/{file}": {
            "get": {
                "security": [],
                "summary": "The dashboard's scripts and style sheet",
                "operationId": "getDashboardFile",
                "parameters": [
                    {
                        "name": "file",
                        "in": "path",
                        "required": True,
                        "schema": {
                            "type": "string",
                            "enum": ["dashboard.js", "users.js", "dashboard.css"],
                        },
                    }
                ],
                "responses": {
                    "200": {"description": "the file"},
                    "404": {"description": "no such file"},
                },
            }
        },
    }
