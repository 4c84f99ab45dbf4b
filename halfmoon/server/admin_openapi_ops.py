"""OpenAPI paths and schemas of the operator endpoints (``admin_messages``, ``admin_operations``).

Merged into the document by :func:`halfmoon.server.admin_openapi.openapi_document`.
"""

from __future__ import annotations

from typing import Any

from halfmoon.server.admin_openapi_common import _op, _path_param, _ref

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NULL_INT = {"type": "integer", "nullable": True}
_NULL_STR = {"type": "string", "nullable": True}


def _query(
    name: str, description: str, schema: dict[str, Any] = _STR, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


def _path_int(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "integer", "minimum": 0},
    }


SCHEMAS: dict[str, Any] = {
    "StoredMessage": {
        "type": "object",
        "properties": {
            "message_id": _STR,
            "topic": _STR,
            "queue_id": _INT,
            "queue_offset": _INT,
            "commit_log_offset": _INT,
            "tag": _NULL_STR,
            "keys": {"type": "array", "items": _STR},
            "message_type": _STR,
            "message_group": _NULL_STR,
            "delivery_timestamp": _NULL_INT,
            "priority": _NULL_INT,
            "lite_topic": _NULL_STR,
            "born_timestamp": _INT,
            "store_timestamp": _INT,
            "born_host": _STR,
            "store_host": _STR,
            "properties": {"type": "object", "additionalProperties": _STR},
            "body_size": _INT,
            "origin_message_id": {
                **_NULL_STR,
                "description": "the message a dead letter (or a retried copy) was made from",
            },
            "dead_letter_group": {**_NULL_STR, "description": "the group that gave up on it"},
            "dead_letter_attempts": {**_NULL_INT, "description": "deliveries before it did"},
            "dead_letter_topic": {**_NULL_STR, "description": "the topic it was consumed from"},
            "body": {**_STR, "description": "absent when bodies=false"},
            "body_encoding": {"type": "string", "enum": ["utf-8", "base64"]},
        },
    },
    "MessageList": {
        "type": "object",
        "properties": {"messages": {"type": "array", "items": _ref("StoredMessage")}},
        "additionalProperties": True,
    },
    "MessageSend": {
        "type": "object",
        "required": ["body"],
        "additionalProperties": False,
        "properties": {
            "body": _STR,
            "body_encoding": {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"},
            "tag": _STR,
            "keys": {"type": "array", "items": _STR},
            "queue_id": {**_INT, "minimum": 0},
            "properties": {"type": "object", "additionalProperties": _STR},
            "message_group": _STR,
            "delivery_timestamp": _INT,
            "priority": {**_INT, "minimum": 0, "description": "a priority message (RIP-80)"},
            "lite_topic": {**_STR, "description": "a lite message (RIP-83)"},
        },
    },
    "SendResult": {
        "type": "object",
        "properties": {
            "message_id": _STR,
            "topic": _STR,
            "queue_id": _INT,
            "queue_offset": _INT,
            "commit_log_offset": _INT,
        },
    },
    "Scan": {
        "type": "object",
        "properties": {
            "topic": _STR,
            "filter_type": _STR,
            "filter": _STR,
            "messages": {"type": "array", "items": _ref("StoredMessage")},
            "matched": _INT,
            "examined": _INT,
            "tag_counts": {"type": "object", "additionalProperties": _INT},
            "next_offsets": {
                "type": "object",
                "additionalProperties": _INT,
                "description": "queue id -> where to continue",
            },
            "complete": {
                **_BOOL,
                "description": "false when the limit or the scan budget stopped it",
            },
        },
    },
    "Cluster": {
        "type": "object",
        "properties": {
            "cluster": _STR,
            "brokers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "broker": _STR,
                        "role": _STR,
                        "grpc": _STR,
                        "admin": _STR,
                        "version": _STR,
                        "uptime_ms": _INT,
                        "tps_in": _NUM,
                        "tps_out": _NUM,
                    },
                },
            },
            "broker_groups": {
                "type": "array",
                "description": "cluster mode: each broker group (docs/replication.md)",
                "items": {
                    "type": "object",
                    "properties": {
                        "group": _STR,
                        "master": _NULL_STR,
                        "epoch": _INT,
                        "mode": _NULL_STR,
                        "isr": {"type": "array", "items": _STR},
                        "members": {"type": "array", "items": _STR},
                        "failovers": _INT,
                        "switchovers": _INT,
                        "replicas": {
                            "type": "object",
                            "description": "per replica, as its master sees it",
                            "additionalProperties": {
                                "type": "object",
                                "properties": {
                                    "lag_bytes": _INT,
                                    "lag_ms": _INT,
                                    "acked": _INT,
                                    "in_sync": _BOOL,
                                    "connected": _BOOL,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "BrokerDetail": {
        "type": "object",
        "additionalProperties": True,
        "description": "broker status plus store, disk, transactions and clients",
    },
    "RuntimeConfig": {
        "type": "object",
        "properties": {
            "changed": {"type": "array", "items": _STR},
            "keys": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"key": _STR, "value": {}, "description": _STR},
                },
            },
        },
    },
    "RuntimeConfigChange": {
        "type": "object",
        "required": ["changes"],
        "additionalProperties": False,
        "properties": {
            "changes": {
                "type": "object",
                "description": "key -> value (text forms as in the config file)",
            }
        },
    },
    "Statistics": {
        "type": "object",
        "properties": {
            "topic": _NULL_STR,
            "group": _NULL_STR,
            "now_ms": _INT,
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "topic": _STR,
                        "group": _NULL_STR,
                        "direction": {"type": "string", "enum": ["in", "out"]},
                        "per_second": _NUM,
                        "last_minute": _INT,
                        "total_1h": _INT,
                        "total_24h": _INT,
                        "last_hour": {
                            "type": "array",
                            "items": _INT,
                            "description": "per-minute counts, last 60 minutes, oldest first",
                        },
                        "lag": {**_INT, "description": "out rows: messages not yet consumed"},
                        "retrying": {
                            **_INT,
                            "description": "out rows: in flight and delivered more than once",
                        },
                    },
                },
            },
        },
    },
    "Route": {
        "type": "object",
        "properties": {
            "topic": _STR,
            "brokers": {
                "type": "array",
                "items": {"type": "object", "properties": {"broker": _STR, "address": _STR}},
            },
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "topic": _STR,
                        "queue_id": _INT,
                        "perm": _STR,
                        "broker": _STR,
                        "address": _STR,
                        "accepted_types": {"type": "array", "items": _STR},
                    },
                },
            },
        },
    },
    "GroupClients": {
        "type": "object",
        "properties": {
            "group": _STR,
            "broadcast": _BOOL,
            "registry": {**_BOOL, "description": "false when the app runs without the gRPC server"},
            "clients": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        },
    },
    "TopicProducers": {
        "type": "object",
        "properties": {
            "topic": _STR,
            "group": _NULL_STR,
            "registry": {**_BOOL, "description": "false when the app runs without the gRPC server"},
            "clients": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        },
    },
    "Switchover": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "to": {
                **_STR,
                "description": "the in-sync replica to appoint (default: the most caught-up)",
            },
        },
    },
    "UnusedTopics": {
        "type": "object",
        "properties": {
            "deleted": _BOOL,
            "topics": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"broker": _STR, "topic": _STR},
                },
            },
        },
    },
    "SwitchoverResult": {
        "type": "object",
        "properties": {
            "state": _STR,
            "master": _STR,
            "previous": _STR,
            "epoch": _INT,
            "end_offset": _INT,
            "fenced_ms": _INT,
            "took_ms": _INT,
        },
    },
    "OffsetClone": {
        "type": "object",
        "required": ["to"],
        "additionalProperties": False,
        "properties": {
            "to": {**_STR, "description": "the group that gets the offsets"},
            "topic": {**_STR, "description": "only this topic (default: every topic)"},
        },
    },
    "OffsetCloneResult": {
        "type": "object",
        "properties": {
            "group": _STR,
            "to": _STR,
            "topic": _NULL_STR,
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"topic": _STR, "queue_id": _INT, "offset": _INT},
                },
            },
        },
    },
    "ConsumeDirectly": {
        "type": "object",
        "required": ["group", "client_id"],
        "additionalProperties": False,
        "properties": {
            "group": _STR,
            "client_id": {**_STR, "description": "a connected consumer of the group"},
            "topic": {**_STR, "description": "the message's topic (default: any)"},
            "timeout_ms": {**_INT, "minimum": 1, "description": "wait this long (default 5000)"},
        },
    },
    "ConsumeDirectlyResult": {
        "type": "object",
        "properties": {
            "message_id": _STR,
            "topic": _STR,
            "group": _STR,
            "client_id": _STR,
            "consumed": _BOOL,
            "code": {**_STR, "description": "the client's status: OK, NOT_IMPLEMENTED, ..."},
            "message": _STR,
        },
    },
    "OffsetReset": {
        "type": "object",
        "required": ["topic", "timestamp_ms"],
        "additionalProperties": False,
        "properties": {"topic": _STR, "timestamp_ms": {**_INT, "minimum": 0}},
    },
    "OffsetResetResult": {
        "type": "object",
        "properties": {
            "group": _STR,
            "topic": _STR,
            "timestamp_ms": _INT,
            "queues": {
                "type": "array",
                "items": {"type": "object", "properties": {"queue_id": _INT, "offset": _INT}},
            },
        },
    },
}


def paths() -> dict[str, Any]:
    topic = _path_param("topic", "Topic")
    group = _path_param("group", "Consumer group")
    time_range = [
        _query("begin_ms", "earliest store time, ms since the epoch", _INT),
        _query("end_ms", "latest store time, ms since the epoch", _INT),
    ]
    return {
        "/v1/messages/{message_id}": {
            "get": _op(
                "Messages by id (every topic unless topic is given)",
                "getMessageById",
                (200, _ref("MessageList"), "every copy found"),
                400,
                404,
                params=[
                    {"name": "message_id", "in": "path", "required": True, "schema": _STR},
                    _query("topic", "search only this topic"),
                ],
            ),
        },
        "/v1/topics/{topic}/messages": {
            "get": _op(
                "Messages by key within a store-time range",
                "queryMessagesByKey",
                (200, _ref("MessageList"), "matches, oldest first"),
                400,
                404,
                params=[
                    topic,
                    _query("key", "the message key", required=True),
                    *time_range,
                    _query("limit", "at most this many (default 64)", _INT),
                ],
            ),
            "post": _op(
                "Send one message",
                "sendMessage",
                (201, _ref("SendResult"), "stored"),
                400,
                403,
                404,
                body="MessageSend",
                params=[topic],
            ),
        },
        "/v1/topics/{topic}/queues/{queue_id}/offsets/{offset}": {
            "get": _op(
                "The message at a queue offset",
                "getMessageAt",
                (200, _ref("StoredMessage"), "the message"),
                400,
                404,
                params=[
                    topic,
                    _path_int("queue_id", "queue id"),
                    _path_int("offset", "queue offset"),
                ],
            ),
        },
        "/v1/topics/{topic}/scan": {
            "get": _op(
                "Read a range of messages without a consumer group",
                "scanMessages",
                (200, _ref("Scan"), "messages, tag counts and where to continue"),
                400,
                404,
                params=[
                    topic,
                    _query("queue", "one queue (default: all)", _INT),
                    _query("offset", "start offset (needs queue)", _INT),
                    *time_range,
                    _query("limit", "at most this many messages (default 32, max 10000)", _INT),
                    _query("filter_type", "tag (default) or sql92"),
                    _query("filter", "filter expression (default *)"),
                    _query("bodies", "include bodies (default true)", _BOOL),
                    _query("messages", "false: counts only (default true)", _BOOL),
                ],
            ),
        },
        "/v1/cluster": {
            "get": _op("Brokers of the cluster", "getCluster", (200, _ref("Cluster"), "brokers"))
        },
        "/v1/cluster/groups/{group}/failover": {
            "post": _op(
                "Hand a broker group's master over to an in-sync replica (cluster mode)",
                "failoverBrokerGroup",
                (200, _ref("SwitchoverResult"), "the new master, appointed"),
                400,
                404,
                409,
                body="Switchover",
                params=[_path_param("group", "Broker group")],
            ),
        },
        "/v1/cluster/unused-topics": {
            "get": _op(
                "Topics brokers hold that etcd does not route (cluster mode)",
                "listUnusedTopics",
                (200, _ref("UnusedTopics"), "per broker"),
                404,
            ),
            "delete": _op(
                "Delete the topics brokers hold that etcd does not route (cleanUnusedTopic)",
                "deleteUnusedTopics",
                (200, _ref("UnusedTopics"), "what was deleted, per broker"),
                404,
            ),
        },
        "/v1/broker/status": {
            "get": _op(
                "Broker status for operators",
                "getBrokerStatus",
                (200, _ref("BrokerDetail"), "numbers"),
            )
        },
        "/v1/runtime-config": {
            "get": _op(
                "Keys changeable at runtime",
                "getRuntimeConfig",
                (200, _ref("RuntimeConfig"), "keys"),
            ),
            "patch": _op(
                "Change keys at runtime (until restart)",
                "setRuntimeConfig",
                (200, _ref("RuntimeConfig"), "changed"),
                400,
                body="RuntimeConfigChange",
            ),
        },
        "/v1/statistics": {
            "get": _op(
                "Messages in/out per second and over 24 h",
                "getStatistics",
                (200, _ref("Statistics"), "rows"),
                404,
                params=[
                    _query("topic", "only this topic"),
                    _query("group", "only this group"),
                    _query(
                        "last_hour",
                        "false: rows without their per-minute counts (a list needs only rates)",
                    ),
                ],
            ),
        },
        "/v1/topics/{topic}/route": {
            "get": _op(
                "Route of a topic",
                "getTopicRoute",
                (200, _ref("Route"), "queues and addresses"),
                404,
                params=[topic],
            ),
        },
        "/v1/groups/{group}/clients": {
            "get": _op(
                "Connected consumers of a group",
                "getGroupClients",
                (200, _ref("GroupClients"), "clients"),
                404,
                params=[group],
            ),
        },
        "/v1/topics/{topic}/producers": {
            "get": _op(
                "Connected producers that sent to a topic",
                "getTopicProducers",
                (200, _ref("TopicProducers"), "clients"),
                404,
                params=[topic, _query("group", "only this producer group")],
            ),
        },
        "/v1/groups/{group}/clone-offset": {
            "post": _op(
                "Give another group this group's offsets",
                "cloneGroupOffset",
                (200, _ref("OffsetCloneResult"), "offsets applied per queue"),
                400,
                404,
                body="OffsetClone",
                params=[group],
            ),
        },
        "/v1/messages/{message_id}/consume": {
            "post": _op(
                "Have a connected consumer consume a message now",
                "consumeMessageDirectly",
                (200, _ref("ConsumeDirectlyResult"), "the client's answer"),
                400,
                404,
                body="ConsumeDirectly",
                params=[_path_param("message_id", "Message id")],
            ),
        },
        "/v1/groups/{group}/reset-offset": {
            "post": _op(
                "Move a group to a time in a topic",
                "resetGroupOffset",
                (200, _ref("OffsetResetResult"), "new offset per queue"),
                400,
                404,
                body="OffsetReset",
                params=[group],
            ),
        },
    }


__all__ = ["SCHEMAS", "paths"]
