"""Admin endpoints for operators: cluster and broker status, runtime configuration,
statistics, routes, connected clients, offset moves and re-consumption (RocketMQ's clusterList,
brokerStatus, getBrokerConfig / updateBrokerConfig, statsAll, topicRoute,
consumerStatus / consumerConnection, producerConnection, resetOffsetByTime,
cloneGroupOffset, cleanUnusedTopic, and queryMsgByUniqueKey -g -d: consumeMessageDirectly).

    GET   /v1/cluster                       the brokers (one: this process) and their addresses
    POST  /v1/cluster/groups/{group}/failover  {"to"?}: a planned switchover of the broker
                                            group's master (a proxy of a cluster only)
    GET   /v1/cluster/unused-topics         topics brokers hold that etcd does not route
    DELETE /v1/cluster/unused-topics        deletes them from those brokers (cleanUnusedTopic;
                                            both a proxy of a cluster only)
    GET   /v1/broker/status                 TPS, disk, store, pending transactions, clients
    GET   /v1/runtime-config                keys that may change while running, with values
    PATCH /v1/runtime-config                {"changes": {"broker.max_body_size": "8MiB", ...}}
    GET   /v1/statistics?topic=&group=      in/out per second and over 24 h, and lag
    GET   /v1/topics/{topic}/route          queues, permissions, accepted types, address
    GET   /v1/groups/{group}/clients        connected consumers and what they subscribe
    GET   /v1/topics/{topic}/producers      connected producers that published to the topic
    POST  /v1/groups/{group}/reset-offset   {"topic", "timestamp_ms"}: new offset per queue
    POST  /v1/groups/{group}/clone-offset   {"to", "topic"?}: the group's offsets onto another
    POST  /v1/messages/{id}/consume         {"group", "client_id"}: a connected consumer
                                            consumes the message again, now (its answer;
                                            in cluster mode relayed to the proxy worker
                                            holding the client: cluster/command_relay.py)

Runtime changes last until the process stops (put them in the configuration
file to keep them); all keys of one request are checked before any applies.
Connected clients come from the gRPC server's client registry, which
``halfmoon serve`` hands to the admin app; without it (an admin app on its
own) the list is empty and ``registry`` is false.
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
from halfmoon.server.admin_http import (
    CLIENTS_KEY,
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
from halfmoon.server.direct_consume import holds, stored_message, verify_here
from halfmoon.server.telemetry import LISTING_FIELDS, ClientRegistry, consumers_of, producers_of

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


async def list_unused_topics(request: web.Request) -> web.Response:
    return reply(await call(_cluster_of(request, "unused topics").unused_topics, False))


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
    sessions = await _listed_sessions(request)
    if sessions is not None:
        data["clients"] = len(sessions)
        data["producers"] = sum(1 for s in sessions if s["is_producer"])
    return reply(data)


async def _listed_sessions(request: web.Request) -> list[dict[str, Any]] | None:
    """The connected clients, listed: every proxy worker's in cluster mode, this server's
    otherwise; None for an admin app without a gRPC server."""
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is not None:
        return await cluster.sessions()
    clients = request.app.get(CLIENTS_KEY)
    return None if clients is None else [s.listing() for s in clients.sessions()]


def _shown(session: dict[str, Any], *, subscriptions: bool) -> dict[str, Any]:
    shown = {k: v for k, v in session.items() if k not in LISTING_FIELDS}
    if not subscriptions:
        shown.pop("subscriptions", None)
    return shown


def _runtime_values(broker: Broker) -> list[dict[str, Any]]:
    out = []
    for key, description in RUNTIME_KEYS.items():
        section, name = key.split(".", 1)
        out.append({"key": key, "value": getattr(broker.config, name), "description": description})
    return out


async def get_runtime_config(request: web.Request) -> web.Response:
    return reply({"keys": _runtime_values(broker_of(request))})


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


async def get_route(request: web.Request) -> web.Response:
    broker = broker_of(request)
    name = request.match_info["topic"]

    def collect() -> Any:
        existing_topic(broker, name)
        return broker.route(name)

    routes = jsonable(await call(collect))
    grpc, _admin = _addresses(request)
    broker_name = broker.config.name
    # In cluster mode each queue names its broker; every broker is reached through a proxy.
    queues = [{**q, "broker": q["broker"] or broker_name, "address": grpc} for q in routes]
    names = dict.fromkeys(q["broker"] for q in queues) or {broker_name: None}
    brokers = [{"broker": b, "address": grpc} for b in names]
    return reply({"topic": name, "brokers": brokers, "queues": queues})


async def get_group_clients(request: web.Request) -> web.Response:
    broker = broker_of(request)
    name = request.match_info["group"]
    group = jsonable(await call(existing_group, broker, name))
    sessions = await _listed_sessions(request)
    described = [_shown(s, subscriptions=True) for s in consumers_of(sessions or [], name)]
    described.sort(key=lambda c: c["client_id"])
    return reply(
        {
            "group": name,
            "broadcast": group.get("broadcast"),
            "registry": sessions is not None,
            "clients": described,
        }
    )


async def get_topic_producers(request: web.Request) -> web.Response:
    """Producers with a live telemetry stream that have sent to the topic (RocketMQ's
    producerConnection). A RocketMQ 5 producer names no group unless it is transactional,
    so the topic is the subject and ``?group=`` narrows to one producer group."""
    broker = broker_of(request)
    name = request.match_info["topic"]
    group = request.query.get("group") or None
    await call(existing_topic, broker, name)
    sessions = await _listed_sessions(request)
    described = [_shown(s, subscriptions=False) for s in producers_of(sessions or [], name, group)]
    described.sort(key=lambda c: c["client_id"])
    return reply(
        {"topic": name, "group": group, "registry": sessions is not None, "clients": described}
    )


async def reset_offset(request: web.Request) -> web.Response:
    body = await read_body(request)
    reject_unknown(body, {"topic", "timestamp_ms"})
    topic = take(body, "topic", str, required=True)
    timestamp = take(body, "timestamp_ms", int, required=True, minimum=0)
    broker = broker_of(request)
    name = request.match_info["group"]

    def reset() -> dict[int, int]:
        existing_group(broker, name)
        existing_topic(broker, topic)
        return broker.reset_offset(name, topic, timestamp)

    offsets = await call(reset)
    queues = [{"queue_id": q, "offset": o} for q, o in sorted(offsets.items())]
    return reply({"group": name, "topic": topic, "timestamp_ms": timestamp, "queues": queues})


async def clone_offset(request: web.Request) -> web.Response:
    """Give group ``to`` the committed offsets of this group (RocketMQ's cloneGroupOffset), in
    ``topic`` or in every topic this group has progress in; queues it has none in stay."""
    body = await read_body(request)
    reject_unknown(body, {"to", "topic"})
    target = take(body, "to", str, required=True)
    topic = take(body, "topic", str)
    broker = broker_of(request)
    source = request.match_info["group"]
    if target == source:
        raise ApiError("'to' names the group itself: clone into another group")

    def clone() -> list[dict[str, Any]]:
        existing_group(broker, source)
        existing_group(broker, target)
        if topic is not None:
            existing_topic(broker, topic)
        per_topic: dict[str, dict[int, int]] = {}
        for q in broker.group_progress(source, topic):
            per_topic.setdefault(q.topic, {})[q.queue_id] = q.committed_offset
        moved = []
        for name, offsets in sorted(per_topic.items()):
            applied = broker.seek_group(target, name, offsets)
            moved += [
                {"topic": name, "queue_id": q, "offset": o} for q, o in sorted(applied.items())
            ]
        return moved

    queues = await call(clone)
    return reply({"group": source, "to": target, "topic": topic, "queues": queues})


DEFAULT_CONSUME_TIMEOUT_MS = 5_000


async def consume_directly(request: web.Request) -> web.Response:
    """Ask one connected consumer of a group to consume a stored message now, in its listener,
    and report its answer (RocketMQ's consumeMessageDirectly; it moves no offset and acks
    nothing: a test of the consumer's code on a real message, e.g. a dead letter)."""
    body = await read_body(request)
    reject_unknown(body, {"group", "client_id", "topic", "timeout_ms"})
    group = take(body, "group", str, required=True)
    client_id = take(body, "client_id", str, required=True)
    topic = take(body, "topic", str)
    timeout_ms = take(body, "timeout_ms", int, minimum=1) or DEFAULT_CONSUME_TIMEOUT_MS
    message_id = request.match_info["message_id"]
    broker = broker_of(request)
    await call(existing_group, broker, group)
    view = await stored_message(broker, message_id, topic)
    clients = request.app.get(CLIENTS_KEY)
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is None or holds(clients, client_id, group):
        answer = await verify_here(clients, client_id, group, view, timeout_ms / 1000)
    else:  # the client's stream is on another proxy worker, if anywhere
        answer = await cluster.consume_elsewhere(
            client_id, group, message_id, view.topic, timeout_ms / 1000
        )
    return reply(
        {
            "message_id": message_id,
            "topic": view.topic,
            "group": group,
            "client_id": client_id,
            "consumed": answer.consumed,
            "code": answer.code,
            "message": answer.message,
        }
    )


def add_routes(app: web.Application, clients: ClientRegistry | None = None) -> None:
    if clients is not None:
        app[CLIENTS_KEY] = clients
    app.router.add_get("/v1/cluster", get_cluster)
    app.router.add_post("/v1/cluster/groups/{group}/failover", failover_group)
    app.router.add_get("/v1/cluster/unused-topics", list_unused_topics)
    app.router.add_delete("/v1/cluster/unused-topics", delete_unused_topics)
    app.router.add_get("/v1/broker/status", get_broker_status)
    app.router.add_get("/v1/runtime-config", get_runtime_config)
    app.router.add_patch("/v1/runtime-config", set_runtime_config)
    app.router.add_get("/v1/statistics", get_statistics)
    app.router.add_get("/v1/topics/{topic}/route", get_route)
    app.router.add_get("/v1/groups/{group}/clients", get_group_clients)
    app.router.add_get("/v1/topics/{topic}/producers", get_topic_producers)
    app.router.add_post("/v1/groups/{group}/reset-offset", reset_offset)
    app.router.add_post("/v1/groups/{group}/clone-offset", clone_offset)
    app.router.add_post("/v1/messages/{message_id}/consume", consume_directly)
