"""What the admin endpoint modules share: app keys, JSON answers, request bodies, errors.

``admin.py`` (topics, groups, transactions, metrics), ``admin_messages.py``
and ``admin_operations.py`` each add their routes; all of them read requests
and answer through these helpers, and reach the broker only through its
facade (:mod:`halfmoon.broker.facade`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from halfmoon.broker.errors import GroupNotFound, TopicNotFound
from halfmoon.broker.facade import Broker
from halfmoon.broker.groups import GroupConfig
from halfmoon.config import Config
from halfmoon.errors import HalfmoonError, InvalidArgument, NotFound
from halfmoon.metrics import MetricsRegistry
from halfmoon.server.client_commands import ClientAnswer
from halfmoon.server.telemetry import ClientRegistry

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker")
CONFIG_KEY: web.AppKey[Config] = web.AppKey("config", Config)
REGISTRY_KEY: web.AppKey[MetricsRegistry] = web.AppKey("metrics", MetricsRegistry)
# The gRPC server's registry of connected clients; absent for an admin app on its own.
CLIENTS_KEY: web.AppKey[ClientRegistry] = web.AppKey("clients", ClientRegistry)


class ClusterMembers(Protocol):
    """What a cluster proxy's admin API adds: every member of the cluster."""

    async def sessions(self) -> list[dict[str, Any]]:
        """Every proxy worker's connected clients (:meth:`ClientSession.listing`, each with
        the ``worker`` it is connected to): a client's session lives on one worker only."""
        ...

    async def consume_elsewhere(
        self, client_id: str, group: str, message_id: str, topic: str, timeout_s: float
    ) -> ClientAnswer:
        """consumeMessageDirectly by a client connected to another proxy worker: that worker
        sends the command on the client's stream and its answer comes back (or its error:
        ClientNotConnected when no worker holds the client, ClientDidNotAnswer, ...)."""
        ...

    def member(self, name: str) -> Broker:
        """One member broker by name (``?broker=NAME``)."""
        ...

    def members(self) -> dict[str, Any]:
        """The cluster's brokers and proxies as etcd lists them (``cluster list``)."""
        ...

    def switchover(self, group: str, to: str | None) -> dict[str, Any]:
        """Hand a broker group's master over to an in-sync replica (``cluster failover``);
        the outcome, or ``SwitchoverRefused`` with a stable code."""
        ...

    def unused_topics(self, delete: bool) -> dict[str, Any]:
        """Topics brokers hold that etcd does not route, per broker (``topic clean-unused``,
        mqadmin's cleanUnusedTopic); with ``delete``, deleted from those brokers."""
        ...


CLUSTER_KEY: web.AppKey[ClusterMembers] = web.AppKey("cluster")


class ApiError(InvalidArgument):
    """A malformed request (bad JSON, wrong field type), as opposed to a broker refusal."""


# -- JSON --------------------------------------------------------------------


# Values that are JSON already (exact types: an enum deriving from str or int is not).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def jsonable(value: Any) -> Any:
    """Broker objects as plain JSON: ``to_dict()`` when they have one, else their fields."""
    if type(value) in _PLAIN:  # most values: answered before the probes below
        return value
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(jsonable(data), status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


def error_reply(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def http_status(exc: HalfmoonError) -> int:
    return exc.http_status  # each error class says (see halfmoon.errors)


# -- request bodies ----------------------------------------------------------


# A body already read and rewritten (its names namespaced) by admin_namespace.
# (web.RequestKey exists from aiohttp 3.12; older ones take the plain string.)
BODY_KEY: Any = (
    web.RequestKey("halfmoon.body", dict) if hasattr(web, "RequestKey") else "halfmoon.body"
)


async def read_body(request: web.Request) -> dict[str, Any]:
    if BODY_KEY in request:
        return dict(request[BODY_KEY])
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    return body


def take(
    body: dict[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    *,
    required: bool = False,
    choices: list[str] | None = None,
    minimum: int | None = None,
) -> Any:
    """``body[name]`` checked against ``kind`` (and choices/minimum); None when absent."""
    if name not in body or body[name] is None:
        if required:
            raise ApiError(f"field {name!r} is required")
        return None
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python, never in a request.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(_JSON_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ApiError(f"field {name!r} must be {names}, not {json.dumps(value)}")
    if choices is not None and value not in choices:
        raise ApiError(f"field {name!r} must be one of {', '.join(choices)}, not {value!r}")
    if minimum is not None and isinstance(value, int | float) and value < minimum:
        raise ApiError(f"field {name!r} must be at least {minimum}, not {value}")
    return value


_JSON_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    dict: "an object",
    float: "a number",
    list: "an array",
}


def reject_unknown(body: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(
            f"unknown field(s) {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(sorted(known))}"
        )


# -- calling the broker ----------------------------------------------------


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a broker call off the event loop (it may wait for the disk)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


class UnknownBroker(NotFound):
    """``?broker=NAME`` names no broker this endpoint can reach."""

    code = "BROKER_NOT_FOUND"
    protocol_code = "NOT_FOUND"


def broker_of(request: web.Request) -> Broker:
    """The broker a request addresses: the endpoint's own, or in cluster mode the member
    named by ``?broker=NAME`` (mqadmin's ``-b``: ``status --broker B``, ``write-perm``)."""
    broker = request.app[BROKER_KEY]
    name = request.query.get("broker")
    if not name:
        return broker
    cluster = request.app.get(CLUSTER_KEY)
    if cluster is not None:
        return cluster.member(name)
    if name != broker.config.name:
        raise UnknownBroker(
            f"no broker {name!r} here: this server is broker {broker.config.name!r}"
        )
    return broker


def existing_group(broker: Broker, name: str) -> GroupConfig:
    # get_group may auto-create; an admin read must not create what it looks at.
    group = broker.find_group(name)
    if group is None:
        raise GroupNotFound(name)
    return group


def existing_topic(broker: Broker, name: str) -> None:
    # get_topic may auto-create; an admin read must not create what it looks at.
    if not any(topic.name == name for topic in broker.list_topics()):
        raise TopicNotFound(name)
