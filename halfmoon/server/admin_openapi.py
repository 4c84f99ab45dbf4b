"""The OpenAPI 3 document of the admin API (served at ``/openapi.json``).

Kept beside ``admin.py`` and tested against it: every route the app serves
must appear here, and the document must validate as OpenAPI 3.0.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from halfmoon.broker.message import MessageType
from halfmoon.server.admin_openapi_auth import SCHEMAS as AUTH_SCHEMAS
from halfmoon.server.admin_openapi_auth import SECURITY_SCHEMES
from halfmoon.server.admin_openapi_auth import paths as auth_paths
from halfmoon.server.admin_openapi_common import _json, _op, _path_param, _ref
from halfmoon.server.admin_openapi_dashboard import PAGING_FIELDS, PAGING_PARAMS
from halfmoon.server.admin_openapi_dashboard import SCHEMAS as DASHBOARD_SCHEMAS
from halfmoon.server.admin_openapi_dashboard import paths as dashboard_paths
from halfmoon.server.admin_openapi_lite import SCHEMAS as LITE_SCHEMAS
from halfmoon.server.admin_openapi_lite import paths as lite_paths
from halfmoon.server.admin_openapi_ops import SCHEMAS as OPERATOR_SCHEMAS
from halfmoon.server.admin_openapi_ops import paths as operator_paths

TOPIC_TYPES = [t.value for t in MessageType]


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {**_STR, "description": "stable code, e.g. TOPIC_NOT_FOUND"},
                    "message": {**_STR, "description": "what went wrong and what to do"},
                },
            }
        },
    },
    "Topic": {
        "type": "object",
        "required": ["name", "message_type", "queue_count", "perm"],
        "properties": {
            "name": _STR,
            "message_type": {"type": "string", "enum": TOPIC_TYPES},
            "queue_count": {**_INT, "description": "writable queues"},
            "perm": {"type": "string", "enum": ["rw", "r", "w", "-"]},
            "read_queue_count": {**_INT, "description": "readable queues (more after a shrink)"},
            "created_ms": _INT,
            "trace": {"type": "boolean", "description": "its messages' trace is recorded"},
        },
    },
    "TopicCreate": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {
            "name": _STR,
            "message_type": {"type": "string", "enum": TOPIC_TYPES, "default": "normal"},
            "queue_count": {
                **_INT,
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
            "queue_count": {**_INT, "minimum": 1},
            "perm": {"type": "string", "enum": ["rw", "r", "w"]},
            "trace": {"type": "boolean", "description": "record its messages' trace"},
        },
    },
    "TopicList": {
        "type": "object",
        "properties": {"topics": {"type": "array", "items": _ref("Topic")}, **PAGING_FIELDS},
    },
    "QueueStatus": {
        "type": "object",
        "properties": {
            "topic": _STR,
            "queue_id": _INT,
            "min_offset": {**_INT, "description": "first retained offset"},
            "max_offset": {**_INT, "description": "one past the last offset"},
            "last_store_timestamp": {
                **_INT,
                "nullable": True,
                "description": "ms since the epoch; null for an empty queue",
            },
            "perm": {"type": "string", "enum": ["rw", "r", "w", "-"]},
        },
    },
    "TopicStatus": {
        "type": "object",
        "properties": {"topic": _STR, "queues": {"type": "array", "items": _ref("QueueStatus")}},
    },
    "RetryPolicy": {
        "type": "object",
        "properties": {
            "kind": {"type": "string", "enum": ["customized", "exponential"]},
            "levels_ms": {
                "type": "array",
                "items": _INT,
                "description": "customized: wait per attempt",
            },
            "initial_ms": _INT,
            "max_ms": _INT,
            "multiplier": {"type": "number"},
        },
    },
    "Group": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": _STR,
            "fifo": _BOOL,
            "max_delivery_attempts": _INT,
            "retry_policy": _ref("RetryPolicy"),
            "consume_from": {"type": "string", "enum": ["latest", "earliest", "auto"]},
            "consume_enabled": _BOOL,
            "broadcast": _BOOL,
            "created_ms": _INT,
        },
    },
    "GroupSettings": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "fifo": {**_BOOL, "default": False},
            "max_delivery_attempts": {**_INT, "minimum": 1, "default": 17},
            "retry_policy": _ref("RetryPolicy"),
            "consume_from": {
                "type": "string",
                "enum": ["latest", "earliest", "auto"],
                "default": "auto",
            },
            "consume_enabled": {**_BOOL, "default": True},
            "broadcast": {**_BOOL, "default": False},
        },
    },
    "GroupCreate": {
        "allOf": [
            _ref("GroupSettings"),
            {"type": "object", "required": ["name"], "properties": {"name": _STR}},
        ]
    },
    "GroupList": {
        "type": "object",
        "properties": {"groups": {"type": "array", "items": _ref("Group")}, **PAGING_FIELDS},
    },
    "QueueProgress": {
        "type": "object",
        "properties": {
            "group": _STR,
            "topic": _STR,
            "queue_id": _INT,
            "committed_offset": {**_INT, "description": "every offset below is consumed"},
            "max_offset": _INT,
            "lag": {**_INT, "description": "max_offset - committed_offset"},
            "inflight": {**_INT, "description": "delivered, not yet acknowledged"},
            "retrying": {
                **_INT,
                "description": "of those in flight, delivered more than once (being retried)",
            },
        },
    },
    "GroupProgress": {
        "type": "object",
        "properties": {
            "group": _STR,
            "topic": {"type": "string", "nullable": True},
            "queues": {"type": "array", "items": _ref("QueueProgress")},
        },
    },
    "BrokerStatus": {
        "type": "object",
        "properties": {
            "name": _STR,
            "uptime_ms": _INT,
            "topics": _INT,
            "groups": _INT,
            "queues": _INT,
            "messages_in_total": _INT,
            "messages_out_total": _INT,
            "tps_in": {"type": "number", "description": "messages/s, 1-minute average"},
            "tps_out": {"type": "number"},
            "disk_bytes": _INT,
            "pending_delay_messages": _INT,
        },
        "additionalProperties": True,
    },
    "Deleted": {"type": "object", "properties": {"deleted": _STR}},
    "Transaction": {
        "type": "object",
        "properties": {
            "transaction_id": {**_STR, "description": "as SendMessage returned it"},
            "topic": {**_STR, "description": "the real topic it is committed to"},
            "queue_id": _INT,
            "message_id": _STR,
            "keys": {"type": "array", "items": _STR},
            "producer_group": {"type": "string", "nullable": True},
            "transaction_group": {
                "type": "string",
                "nullable": True,
                "description": "decided with its group, not alone",
            },
            "state": {"type": "string", "enum": ["prepared", "parked"]},
            "checks_sent": {**_INT, "description": "checks a live producer received"},
            "age_ms": {**_INT, "description": "since the half message was stored"},
            "stored_ms": _INT,
            "next_check_ms": {
                **_INT,
                "nullable": True,
                "description": "the check service's next scan that takes it (parks it at the "
                "check limit); null when none will: parked, or a transaction group's member",
            },
        },
    },
    "TransactionList": {
        "type": "object",
        "properties": {"transactions": {"type": "array", "items": _ref("Transaction")}},
    },
    "TransactionDecision": {
        "type": "object",
        "properties": {
            "transaction_id": _STR,
            "state": {"type": "string", "enum": ["committed", "rolled_back"]},
        },
    },
    "TransactionGroupDecision": {
        "type": "object",
        "properties": {
            "transaction_group": _STR,
            "state": {"type": "string", "enum": ["committed", "rolled_back"]},
            "members_decided": {
                **_INT,
                "description": "members decided by this call (0 when repeated)",
            },
        },
    },
}


@cache
def openapi_document() -> dict[str, Any]:
    topic = [_path_param("topic", "Topic")]
    group = [_path_param("group", "Consumer group")]
    progress_params = [
        *group,
        {
            "name": "topic",
            "in": "query",
            "required": False,
            "description": "only this topic's queues",
            "schema": _STR,
        },
    ]
    txn = {
        "name": "transaction_id",
        "in": "path",
        "required": True,
        "description": "the transaction id SendMessage returned",
        "schema": _STR,
    }
    resolution = {
        "name": "resolution",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": ["commit", "rollback"]},
    }
    limit = _query("limit", "at most this many (default 1000)", {**_INT, "minimum": 1})
    text = {
        "description": "Prometheus text exposition 0.0.4",
        "content": {"text/plain": {"schema": _STR}},
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "halfmoon admin API",
            "version": "1",
            "description": "Topics, consumer groups, offsets and status of one halfmoon broker. "
            'Errors are {"error": {"code", "message"}}.',
        },
        "paths": {
            "/v1/status": {
                "get": _op("Broker status", "getStatus", (200, _ref("BrokerStatus"), "status"))
            },
            "/v1/config": {
                "get": _op(
                    "Running configuration",
                    "getConfig",
                    (200, {"type": "object"}, "every section and key"),
                )
            },
            "/v1/topics": {
                "get": _op(
                    "List topics",
                    "listTopics",
                    (200, _ref("TopicList"), "all topics, or one page of the matches"),
                    400,
                    params=PAGING_PARAMS,
                ),
                "post": _op(
                    "Create a topic",
                    "createTopic",
                    (201, _ref("Topic"), "created"),
                    400,
                    409,
                    body="TopicCreate",
                ),
            },
            "/v1/topics/{topic}": {
                "get": _op(
                    "One topic", "getTopic", (200, _ref("Topic"), "the topic"), 404, params=topic
                ),
                "patch": _op(
                    "Change a topic",
                    "updateTopic",
                    (200, _ref("Topic"), "updated"),
                    400,
                    404,
                    body="TopicUpdate",
                    params=topic,
                ),
                "delete": _op(
                    "Delete a topic",
                    "deleteTopic",
                    (200, _ref("Deleted"), "deleted"),
                    404,
                    params=topic,
                ),
            },
            "/v1/topics/{topic}/status": {
                "get": _op(
                    "Offsets per queue",
                    "getTopicStatus",
                    (200, _ref("TopicStatus"), "min/max offsets"),
                    404,
                    params=topic,
                ),
            },
            "/v1/groups": {
                "get": _op(
                    "List consumer groups",
                    "listGroups",
                    (200, _ref("GroupList"), "all groups, or one page of the matches"),
                    400,
                    params=PAGING_PARAMS,
                ),
                "post": _op(
                    "Create a consumer group",
                    "createGroup",
                    (201, _ref("Group"), "created"),
                    400,
                    409,
                    body="GroupCreate",
                ),
            },
            "/v1/groups/{group}": {
                "get": _op(
                    "One group", "getGroup", (200, _ref("Group"), "the group"), 404, params=group
                ),
                "patch": _op(
                    "Change a group",
                    "updateGroup",
                    (200, _ref("Group"), "updated"),
                    400,
                    404,
                    body="GroupSettings",
                    params=group,
                ),
                "delete": _op(
                    "Delete a group",
                    "deleteGroup",
                    (200, _ref("Deleted"), "deleted"),
                    404,
                    params=group,
                ),
            },
            "/v1/groups/{group}/progress": {
                "get": _op(
                    "Consumer progress (lag per queue)",
                    "getGroupProgress",
                    (200, _ref("GroupProgress"), "per queue"),
                    404,
                    params=progress_params,
                ),
            },
            "/v1/transactions": {
                "get": _op(
                    "Undecided transactions, oldest first",
                    "listTransactions",
                    (200, _ref("TransactionList"), "prepared and parked"),
                    400,
                    params=[_query("topic", "only this topic's", _STR), limit],
                ),
            },
            "/v1/transactions/parked": {
                "get": _op(
                    "Transactions parked after the check limit",
                    "listParkedTransactions",
                    (200, _ref("TransactionList"), "parked"),
                    400,
                    params=[limit],
                ),
            },
            "/v1/transactions/{transaction_id}/{resolution}": {
                "post": _op(
                    "Commit or roll back a transaction as an operator (durable when answered)",
                    "decideTransaction",
                    (200, _ref("TransactionDecision"), "decided"),
                    400,
                    409,
                    params=[txn, resolution],
                ),
            },
            "/v1/transactions/{transaction_id}/resume": {
                "post": _op(
                    "Put a parked transaction back under checks (count reset)",
                    "resumeTransaction",
                    (200, _ref("Transaction"), "prepared again"),
                    400,
                    409,
                    params=[txn],
                ),
            },
            "/v1/transaction-groups/{group}/{resolution}": {
                "post": _op(
                    "Commit or roll back every member of a transaction group",
                    "decideTransactionGroup",
                    (200, _ref("TransactionGroupDecision"), "decided"),
                    400,
                    409,
                    params=[_path_param("group", "Transaction group"), resolution],
                ),
            },
            **operator_paths(),
            **lite_paths(),
            **auth_paths(),
            **dashboard_paths(),
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "operationId": "getMetrics",
                    "responses": {"200": text},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "operationId": "getOpenApi",
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3")},
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Liveness",
                    "operationId": "getHealth",
                    "security": [],
                    "responses": {"200": _json({"type": "object"}, "ok")},
                }
            },
        },
        "components": {
            "schemas": {
                **SCHEMAS,
                **OPERATOR_SCHEMAS,
                **LITE_SCHEMAS,
                **AUTH_SCHEMAS,
                **DASHBOARD_SCHEMAS,
            },
            "securitySchemes": SECURITY_SCHEMES,
        },
        # With auth.enabled (docs/security.md); /healthz is open (overridden there).
        "security": [{"basic": []}, {"bearer": []}],
    }
