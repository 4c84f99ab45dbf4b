"""Admin endpoints for operators: cluster and broker status, runtime configuration,
statistics and routes (RocketMQ's clusterList, brokerStatus, getBrokerConfig /
updateBrokerConfig, statsAll, topicRoute, cleanUnusedTopic); a planned switchover of a
broker group's master and the unused topics answer on a proxy of a cluster only.

Runtime changes last until the process stops (put them in the configuration
file to keep them); all keys of one request are checked before any applies.
"""

from __future__ import annotations

import shutil
import time
from importlib import metadata
from typing import Any

from aiohttp import web

from halfmoon.broker.facade import Broker
from halfmoon.config import iter_keys
from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.server.admin_clients import listed_sessions
from halfmoon.server.admin_http import (
    CLUSTER_KEY,
    CONFIG_KEY,
    ApiError,
    ClusterMembers,
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
    INT,
    NULL_STR,
    NUM,
    STR,
    TOPIC,
    name_in_path,
    query,
)

SCHEMAS: dict[str, Any] = {
    "Cluster": {
        "type": "object",
        "properties": {
            "cluster": STR,
            "brokers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "broker": STR,
                        "role": STR,
                        "grpc": STR,
                        "admin": STR,
                        "version": STR,
                        "uptime_ms": INT,
                        "tps_in": NUM,
                        "tps_out": NUM,
                    },
                },
            },
            "broker_groups": {
                "type": "array",
                "description": "cluster mode: each broker group (docs/replication.md)",
                "items": {
                    "type": "object",
                    "properties": {
                        "group": STR,
                        "master": NULL_STR,
                        "epoch": INT,
                        "mode": NULL_STR,
                        "isr": {"type": "array", "items": STR},
                        "members": {"type": "array", "items": STR},
                        "failovers": INT,
                        "switchovers": INT,
                        "replicas": {
                            "type": "object",
                            "description": "per replica, as its master sees it",
                            "additionalProperties": {
                                "type": "object",
                                "properties": {
                                    "lag_bytes": INT,
                                    "lag_ms": INT,
                                    "acked": INT,
                                    "in_sync": BOOL,
                                    "connected": BOOL,
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
            "changed": {"type": "array", "items": STR},
            "keys": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"key": STR, "value": {}, "description": STR},
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
            "topic": NULL_STR,
            "group": NULL_STR,
            "now_ms": INT,
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "topic": STR,
                        "group": NULL_STR,
                        "direction": {"type": "string", "enum": ["in", "out"]},
                        "per_second": NUM,
                        "last_minute": INT,
                        "total_1h": INT,
                        "total_24h": INT,
                        "last_hour": {
                            "type": "array",
                            "items": INT,
                            "description": "per-minute counts, last 60 minutes, oldest first",
                        },
                        "lag": {**INT, "description": "out rows: messages not yet consumed"},
                        "retrying": {
                            **INT,
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
            "topic": STR,
            "brokers": {
                "type": "array",
                "items": {"type": "object", "properties": {"broker": STR, "address": STR}},
            },
            "queues": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "topic": STR,
                        "queue_id": INT,
                        "perm": STR,
                        "broker": STR,
                        "address": STR,
                        "accepted_types": {"type": "array", "items": STR},
                    },
                },
            },
        },
    },
    "Switchover": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "to": {
                **STR,
                "description": "the in-sync replica to appoint (default: the most caught-up)",
            },
        },
    },
    "UnusedTopics": {
        "type": "object",
        "properties": {
            "deleted": BOOL,
            "topics": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"broker": STR, "topic": STR},
                },
            },
        },
    },
    "SwitchoverResult": {
        "type": "object",
        "properties": {
            "state": STR,
            "master": STR,
            "previous": STR,
            "epoch": INT,
            "end_offset": INT,
            "fenced_ms": INT,
            "took_ms": INT,
        },
    },
}

routes = RouteTable(SCHEMAS)


# Keys the broker reads each time it uses them, so a change takes effect at once.
# (Others are copied into long-lived objects at startup and need a restart.)
RUNTIME_KEYS: dict[str, str] = {
    "broker.writable": "accept new messages (false: drain the broker, mqadmin's wipeWritePerm)",
    "broker.auto_create_topics": "create a mixed topic on first use",
    "broker.auto_create_groups": "create a consumer group on first use",
    "broker.default_queue_count": "queues of a topic created without a count",
    "broker.max_body_size": "largest message body accepted",
    "broker.default_invisible_ms": "invisibility of received messages when the client names none",
    "broker.max_delay_ms": "how far ahead a delivery time may be",
    "broker.max_message_group_length": "longest FIFO message group name",
}


class UnknownRuntimeKey(InvalidArgument):
    code = "ILLEGAL_CONFIG"
    protocol_code = "BAD_REQUEST"


def _version() -> str:
    try:
        return metadata.version("halfmoon")
    except metadata.PackageNotFoundError:
        return "unknown"


def _addresses(request: web.Request) -> tuple[str, str]:
    server = request.app[CONFIG_KEY].server
    listen = server.listen
    advertise = server.advertise_host
    if advertise and ":" in listen:
        listen = f"{advertise}:{listen.rsplit(':', 1)[1]}"
    return listen, f"http://{request.host}"


@routes.route(
    "POST",
    "/v1/cluster/groups/{group}/failover",
    "Hand a broker group's master over to an in-sync replica (cluster mode)",
    "failoverBrokerGroup",
    (200, "SwitchoverResult", "the new master, appointed"),
    400,
    404,
    409,
    body="Switchover",
    params=[name_in_path("group", "Broker group")],
)
async def failover_group(request: web.Request) -> web.Response:
    """A planned switchover (docs/replication.md): the master hands over to ``to`` (an
    in-sync replica) or to the most caught-up one; answers once the new master is appointed."""
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is None:
        raise NotInCluster("broker groups exist in cluster mode only: ask a proxy of the cluster")
    body = await read_body(request)
    reject_unknown(body, {"to"})
    to = take(body, "to", str)
    return reply(await call(cluster.switchover, request.match_info["group"], to))


@routes.route(
    "GET",
    "/v1/cluster/unused-topics",
    "Topics brokers hold that etcd does not route (cluster mode)",
    "listUnusedTopics",
    (200, "UnusedTopics", "per broker"),
    404,
)
async def list_unused_topics(request: web.Request) -> web.Response:
    return reply(await call(_cluster_of(request, "unused topics").unused_topics, False))


@routes.route(
    "DELETE",
    "/v1/cluster/unused-topics",
    "Delete the topics brokers hold that etcd does not route (cleanUnusedTopic)",
    "deleteUnusedTopics",
    (200, "UnusedTopics", "what was deleted, per broker"),
    404,
)
async def delete_unused_topics(request: web.Request) -> web.Response:
    return reply(await call(_cluster_of(request, "unused topics").unused_topics, True))


def _cluster_of(request: web.Request, what: str) -> ClusterMembers:
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is None:
        raise NotInCluster(
            f"{what} exist in cluster mode only (a broker holding a topic etcd does not "
            "route): ask a proxy of the cluster"
        )
    return cluster


class NotInCluster(NotFound):
    """A cluster-mode operation asked of a standalone server."""

    code = "NOT_IN_CLUSTER"
    protocol_code = "NOT_FOUND"


@routes.route(
    "GET", "/v1/cluster", "Brokers of the cluster", "getCluster", (200, "Cluster", "brokers")
)
async def get_cluster(request: web.Request) -> web.Response:
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is not None:  # a proxy of a cluster: every member, from etcd
        return reply(await call(cluster.members))
    broker = broker_of(request)
    status = jsonable(await call(broker.status))
    grpc, admin = _addresses(request)
    entry = {
        "broker": status.get("name"),
        "role": "master",
        "grpc": grpc,
        "admin": admin,
        "version": _version(),
        "uptime_ms": status.get("uptime_ms"),
        "tps_in": status.get("tps_in"),
        "tps_out": status.get("tps_out"),
    }
    return reply({"cluster": status.get("name"), "brokers": [entry]})


@routes.route(
    "GET",
    "/v1/broker/status",
    "Broker status for operators",
    "getBrokerStatus",
    (200, "BrokerDetail", "numbers"),
)
async def get_broker_status(request: web.Request) -> web.Response:
    broker = broker_of(request)

    def collect() -> dict[str, Any]:
        status = jsonable(broker.status())
        extra = status.pop("extra", {}) or {}
        stats = jsonable(broker.store_stats())
        data: dict[str, Any] = {**status, **extra}
        data["segments"] = stats.get("segments")
        data["unflushed_bytes"] = (
            stats["commit_log_max_offset"] - stats["commit_log_flushed_offset"]
        )
        try:
            usage = shutil.disk_usage(request.app[CONFIG_KEY].store.data_dir)
            data["disk_free_bytes"] = usage.free
            data["disk_used_ratio"] = (
                round(1 - usage.free / usage.total, 4) if usage.total else None
            )
        except OSError:
            pass
        txn = jsonable(broker.transaction_stats())
        data["pending_transactions"] = txn.get("pending")
        data["parked_transactions"] = txn.get("parked")
        return data

    data = await call(collect)
    sessions = await listed_sessions(request)
    if sessions is not None:
        data["clients"] = len(sessions)
        data["producers"] = sum(1 for s in sessions if s["is_producer"])
    return reply(data)


def _runtime_values(broker: Broker) -> list[dict[str, Any]]:
    out = []
    for key, description in RUNTIME_KEYS.items():
        section, name = key.split(".", 1)
        out.append({"key": key, "value": getattr(broker.config, name), "description": description})
    return out


@routes.route(
    "GET",
    "/v1/runtime-config",
    "Keys changeable at runtime",
    "getRuntimeConfig",
    (200, "RuntimeConfig", "keys"),
)
async def get_runtime_config(request: web.Request) -> web.Response:
    return reply({"keys": _runtime_values(broker_of(request))})


@routes.route(
    "PATCH",
    "/v1/runtime-config",
    "Change keys at runtime (until restart)",
    "setRuntimeConfig",
    (200, "RuntimeConfig", "changed"),
    400,
    body="RuntimeConfigChange",
)
async def set_runtime_config(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"changes"})
    changes = take(body, "changes", dict, required=True)
    if not changes:
        raise ApiError("field 'changes' is empty: give at least one key and value")
    known = {info.key: info for info in iter_keys()}
    converted: dict[str, Any] = {}
    for key, raw in changes.items():
        if key not in RUNTIME_KEYS:
            hint = "it needs a restart" if key in known else "no such key"
            raise UnknownRuntimeKey(
                f"{key!r} cannot be changed while running ({hint}); runtime keys: "
                f"{', '.join(RUNTIME_KEYS)}"
            )
        info = known[key]
        try:
            value = info.convert(raw if isinstance(raw, str) else raw)
        except (ValueError, TypeError) as exc:
            raise UnknownRuntimeKey(f"bad value {raw!r} for {key}: {exc}") from None
        if info.type is int and value < 1:
            raise UnknownRuntimeKey(f"bad value {raw!r} for {key}: must be at least 1")
        converted[key] = value
    broker = broker_of(request)
    broker.update_config({key.split(".", 1)[1]: value for key, value in converted.items()})
    return reply({"changed": sorted(converted), "keys": _runtime_values(broker)})


@routes.route(
    "GET",
    "/v1/statistics",
    "Messages in/out per second and over 24 h",
    "getStatistics",
    (200, "Statistics", "rows"),
    404,
    params=[
        query("topic", "only this topic"),
        query("group", "only this group"),
        query(
            "last_hour",
            "false: rows without their per-minute counts (a list needs only rates)",
        ),
    ],
)
async def get_statistics(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.query.get("topic") or None
    group = request.query.get("group") or None
    per_minute = request.query.get("last_hour", "true").lower() != "false"

    def collect() -> list[dict[str, Any]]:
        if topic is not None:
            existing_topic(broker, topic)
        if group is not None:
            existing_group(broker, group)
        rows = [jsonable(r) for r in broker.traffic(topic=topic, group=group)]
        # One progress question per (topic, group) row, for that topic only: asking for all
        # of a group's topics would walk every topic of the broker once per group.
        lags: dict[tuple[str, str], tuple[int, int]] = {}
        for row in rows:
            pair = (row["topic"], row["group"])
            if row["group"] is not None and pair not in lags:
                progress = broker.group_progress(row["group"], row["topic"])
                lags[pair] = (sum(q.lag for q in progress), sum(q.retrying for q in progress))
        for row in rows:
            if not per_minute:
                del row["last_hour"]
            row["direction"] = "in" if row["group"] is None else "out"
            if row["group"] is not None:
                row["lag"], row["retrying"] = lags.get((row["topic"], row["group"]), (0, 0))
        return rows

    rows = await call(collect)
    return reply({"topic": topic, "group": group, "now_ms": int(time.time() * 1000), "rows": rows})


@routes.route(
    "GET",
    "/v1/topics/{topic}/route",
    "Route of a topic",
    "getTopicRoute",
    (200, "Route", "queues and addresses"),
    404,
    params=[TOPIC],
)
async def get_route(request: web.Request) -> web.Response:
    broker = broker_of(request)
    name = request.match_info["topic"]

    def collect() -> Any:
        existing_topic(broker, name)
        return broker.route(name)

    routed = jsonable(await call(collect))
    grpc, _admin = _addresses(request)
    broker_name = broker.config.name
    # In cluster mode each queue names its broker; every broker is reached through a proxy.
    queues = [{**q, "broker": q["broker"] or broker_name, "address": grpc} for q in routed]
    names = dict.fromkeys(q["broker"] for q in queues) or {broker_name: None}
    brokers = [{"broker": b, "address": grpc} for b in names]
    return reply({"topic": name, "brokers": brokers, "queues": queues})
