"""Definitions: the topics, consumer groups, users, ACL policies and the AMQP topology
(vhosts, exchanges, queues, bindings) as one JSON document.

    GET   /v1/definitions   export (super users only: the document holds secret keys)
    POST  /v1/definitions   import the document an export gave (super users only)

Like RabbitMQ's definitions export, the document is the broker's *shape*, not its
data: no message, offset or transaction goes in it, and system topics (``%DLQ%…``,
the broker's internal topics) are left out, since the broker makes them itself.
Users carry their secret keys (an HMAC signature needs the key itself, so there
is no hash to export instead): keep an export as carefully as ``auth/users.json``.

Import is **validated whole before anything is applied**: every entry is checked
with the same rules as the API's create calls, and against what exists (a topic
cannot change its message type; a policy's subject must be a user that exists or
is imported; the import must leave an enabled super user). A document with any
error changes nothing and the answer names the first error. Then it is applied in
order — topics, groups, users, policies — creating what is missing and updating
what differs, so importing the same document again changes nothing (``unchanged``).
An import never deletes: what exists and is not in the document stays.

The AMQP topology is in RabbitMQ's shape (``vhosts``, ``exchanges``, ``queues``,
``bindings``, as ``rabbitmqctl export_definitions`` writes them); it is checked and
declared by :mod:`halfmoon.amqp.definitions` with the rules an AMQP channel's declares
follow, after the rest is planned and before anything is applied. An AMQP queue is a topic
and a group underneath: those are left out of ``topics`` and ``groups``, the queue's entry
stands for them. The admin API starts before the AMQP endpoint, so the application holds
an :class:`AmqpHandle` the server fills in once the endpoint serves.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from halfmoon.amqp import AmqpServer
from halfmoon.amqp import definitions as amqp_definitions
from halfmoon.amqp.reply_codes import AmqpError
from halfmoon.auth import Guard
from halfmoon.auth.policy import (
    PolicyEntry,
    check_access_key,
    check_secret_key,
    check_user_type,
    entry_from_dict,
)
from halfmoon.auth.store import subject_user
from halfmoon.broker.facade import Broker
from halfmoon.broker.groups import check_group_name
from halfmoon.broker.message import MessageType
from halfmoon.broker.topics import check_perm, check_queue_count, check_topic_name, is_reserved
from halfmoon.errors import InvalidArgument
from halfmoon.server.admin_auth import GUARD_KEY
from halfmoon.server.admin_http import ApiError, broker_of, call, read_body, reply
from halfmoon.server.admin_messages import query_bool
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import INT, STR, query
from halfmoon.server.admin_topics import group_settings

SCHEMAS: dict[str, Any] = {
    "Definitions": {
        "type": "object",
        "description": "topics, consumer groups, users (with their secret keys) and ACL "
        "policies; system topics are left out",
        "required": ["halfmoon_definitions"],
        "properties": {
            "halfmoon_definitions": {**INT, "description": "the format's version: 1"},
            "exported_ms": INT,
            "broker": STR,
            "topics": {"type": "array", "items": {"type": "object"}},
            "groups": {"type": "array", "items": {"type": "object"}},
            "users": {"type": "array", "items": {"type": "object"}},
            "acls": {"type": "array", "items": {"type": "object"}},
            **{
                kind: {"type": "array", "items": {"type": "object"}}
                for kind in amqp_definitions.KINDS
            },
        },
    },
    "DefinitionsImport": {
        "type": "object",
        "description": "names per kind (topics, groups, users, acls, vhosts, exchanges, "
        "queues, bindings) by what the import did",
        "properties": {
            "applied": {"type": "boolean", "description": "false for ?dry_run=true"},
            "created": {"type": "object"},
            "updated": {"type": "object"},
            "unchanged": {"type": "object"},
        },
    },
}

# One import at a time: two interleaved would each validate against a state the other
# is changing.
_IMPORTING: web.AppKey[asyncio.Lock] = web.AppKey("definitions_import", asyncio.Lock)


class AmqpHandle:
    """The AMQP endpoint of this process, once it serves (None before, and without one)."""

    def __init__(self) -> None:
        self.server: AmqpServer | None = None


AMQP_KEY: web.AppKey[AmqpHandle] = web.AppKey("amqp", AmqpHandle)


def _importing_lock(app: web.Application) -> None:
    app[_IMPORTING] = asyncio.Lock()


routes = RouteTable(SCHEMAS, setup=_importing_lock)


FORMAT = 1  # the document's "halfmoon_definitions" version
KINDS = ("topics", "groups", "users", "acls", *amqp_definitions.KINDS)
_TOPIC_FIELDS = {"name", "message_type", "queue_count", "perm", "trace"}
_GROUP_FIELDS = {
    "name", "fifo", "max_delivery_attempts", "retry_policy", "consume_from", "consume_enabled",
    "broadcast",
}  # fmt: skip
_USER_FIELDS = {"access_key", "secret_key", "user_type", "enabled"}


class InvalidDefinitions(InvalidArgument):
    """The document is malformed or conflicts with what exists: nothing was applied."""

    code = "INVALID_DEFINITIONS"
    protocol_code = "BAD_REQUEST"


# -- export --------------------------------------------------------------------------


def export(
    broker: Broker, guard: Guard | None, queues: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The document but its AMQP part; ``queues``: the AMQP queues' topics and groups."""
    topics = [
        {
            "name": t.name,
            "message_type": t.message_type.value,
            "queue_count": t.queue_count,
            "perm": t.perm,
            "trace": t.trace,
        }
        for t in sorted(broker.list_topics(), key=lambda t: t.name)
        if not is_reserved(t.name) and t.name not in queues
    ]
    groups = []
    for g in sorted(broker.list_groups(), key=lambda g: g.name):
        if g.name in queues:
            continue
        shown = g.to_dict()
        shown.pop("created_ms", None)
        groups.append(shown)
    users: list[dict[str, Any]] = []
    acls: list[dict[str, Any]] = []
    if guard is not None:
        users = [
            {
                "access_key": u.access_key,
                "secret_key": u.secret_key,
                "user_type": u.user_type,
                "enabled": u.enabled,
            }
            for u in guard.store.users()
        ]
        acls = [{"subject": s, "policies": p} for s, p in guard.store.acls().items()]
    return {
        "halfmoon_definitions": FORMAT,
        "exported_ms": int(time.time() * 1000),
        "broker": broker.config.name,
        "topics": topics,
        "groups": groups,
        "users": users,
        "acls": acls,
    }


# -- validation: the whole plan before the first change ---------------------------------


@dataclass
class Plan:
    """What an import will do, entry by entry: (kind, name, action, arguments)."""

    steps: list[tuple[str, str, str, dict[str, Any]]] = field(default_factory=list)

    def add(self, kind: str, name: str, action: str, arguments: dict[str, Any]) -> None:
        self.steps.append((kind, name, action, arguments))

    def summary(self) -> dict[str, dict[str, list[str]]]:
        out: dict[str, dict[str, list[str]]] = {
            a: {k: [] for k in KINDS} for a in ("created", "updated", "unchanged")
        }
        for kind, name, action, _ in self.steps:
            out[action][kind].append(name)
        return out


def _entries(document: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    entries = document.get(kind, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidDefinitions(f"'{kind}' must be an array of objects")
    return entries


def _unknown(entry: dict[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(entry) - known)
    if extra:
        raise InvalidDefinitions(f"{where}: unknown field {extra[0]!r}")


def _named(entry: dict[str, Any], key: str, kind: str, index: int, seen: set[str]) -> str:
    name = entry.get(key)
    if not isinstance(name, str) or not name:
        raise InvalidDefinitions(f"{kind}[{index}]: '{key}' must be a non-empty string")
    if name in seen:
        raise InvalidDefinitions(f"{kind}[{index}]: {name!r} is listed twice")
    seen.add(name)
    return name


def _plan_topics(broker: Broker, entries: list[dict[str, Any]], plan: Plan) -> None:
    existing = {t.name: t for t in broker.list_topics()}
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        name = _named(entry, "name", "topics", i, seen)
        where = f"topic {name!r}"
        _unknown(entry, _TOPIC_FIELDS, where)
        check_topic_name(name)
        raw_type = entry.get("message_type", "normal")
        if raw_type not in [t.value for t in MessageType]:
            raise InvalidDefinitions(f"{where}: illegal message_type {raw_type!r}")
        wanted: dict[str, Any] = {"message_type": MessageType(raw_type)}
        if "queue_count" in entry:
            count = entry["queue_count"]
            if not isinstance(count, int) or isinstance(count, bool):
                raise InvalidDefinitions(f"{where}: 'queue_count' must be an integer")
            wanted["queue_count"] = check_queue_count(count)
        if "perm" in entry:
            wanted["perm"] = check_perm(entry["perm"]) if isinstance(entry["perm"], str) else None
            if wanted["perm"] is None:
                raise InvalidDefinitions(f"{where}: 'perm' must be rw, r, w or -")
        if "trace" in entry:
            if not isinstance(entry["trace"], bool):
                raise InvalidDefinitions(f"{where}: 'trace' must be true or false")
            wanted["trace"] = entry["trace"]
        current = existing.get(name)
        if current is None:
            plan.add("topics", name, "created", wanted)
            continue
        if current.message_type is not wanted["message_type"]:
            raise InvalidDefinitions(
                f"{where} exists as a {current.message_type.value} topic; a topic's message "
                f"type does not change by import (the document says {raw_type})"
            )
        changes = {
            k: v for k, v in wanted.items() if k != "message_type" and getattr(current, k) != v
        }
        plan.add("topics", name, "updated" if changes else "unchanged", changes)


def _plan_groups(broker: Broker, entries: list[dict[str, Any]], plan: Plan) -> None:

    existing = {g.name: g for g in broker.list_groups()}
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        name = _named(entry, "name", "groups", i, seen)
        where = f"group {name!r}"
        _unknown(entry, _GROUP_FIELDS, where)
        check_group_name(name)
        try:
            settings = group_settings(dict(entry))
        except ApiError as exc:
            raise InvalidDefinitions(f"{where}: {exc.message}") from None
        attempts = settings.get("max_delivery_attempts")
        if attempts is not None and not 1 <= attempts <= 1000:
            raise InvalidDefinitions(f"{where}: 'max_delivery_attempts' must be 1 to 1000")
        current = existing.get(name)
        if current is None:
            plan.add("groups", name, "created", settings)
            continue
        changes = {k: v for k, v in settings.items() if getattr(current, k) != v}
        plan.add("groups", name, "updated" if changes else "unchanged", changes)


def _plan_users(guard: Guard | None, entries: list[dict[str, Any]], plan: Plan) -> set[str]:
    """Plan the users; the access keys that exist once the import is done."""
    if entries and guard is None:
        raise InvalidDefinitions("this server keeps no users (authentication is not configured)")
    existing = {u.access_key: u for u in guard.store.users()} if guard is not None else {}
    final = {ak: (u.user_type, u.enabled) for ak, u in existing.items()}
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        access_key = _named(entry, "access_key", "users", i, seen)
        where = f"user {access_key!r}"
        _unknown(entry, _USER_FIELDS, where)
        check_access_key(access_key)
        current = existing.get(access_key)
        wanted: dict[str, Any] = {}
        if "secret_key" in entry:
            wanted["secret_key"] = check_secret_key(entry["secret_key"])
        elif current is None:
            raise InvalidDefinitions(f"{where} does not exist here and has no 'secret_key'")
        if "user_type" in entry:
            wanted["user_type"] = check_user_type(entry["user_type"])
        if "enabled" in entry:
            if not isinstance(entry["enabled"], bool):
                raise InvalidDefinitions(f"{where}: 'enabled' must be true or false")
            wanted["enabled"] = entry["enabled"]
        if current is None:
            plan.add("users", access_key, "created", wanted)
            final[access_key] = (wanted.get("user_type", "Normal"), wanted.get("enabled", True))
            continue
        changes = {k: v for k, v in wanted.items() if getattr(current, k) != v}
        plan.add("users", access_key, "updated" if changes else "unchanged", changes)
        final[access_key] = (
            changes.get("user_type", current.user_type),
            changes.get("enabled", current.enabled),
        )
    had_manager = any(u.enabled and u.is_super for u in existing.values())
    if had_manager and not any(kind == "Super" and on for kind, on in final.values()):
        raise InvalidDefinitions(
            "the import would leave no enabled super user (LAST_SUPER_USER): nobody could "
            "manage users and ACLs afterwards"
        )
    return set(final)


def _plan_acls(
    guard: Guard | None, entries: list[dict[str, Any]], users: set[str], plan: Plan
) -> None:
    if entries and guard is None:
        raise InvalidDefinitions("this server keeps no ACLs (authentication is not configured)")
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        subject = _named(entry, "subject", "acls", i, seen)
        _unknown(entry, {"subject", "policies"}, f"acl {subject!r}")
        access_key = subject_user(subject)
        if access_key not in users:
            raise InvalidDefinitions(
                f"acl {subject!r}: user {access_key!r} neither exists nor is imported"
            )
        documents = entry.get("policies")
        if not isinstance(documents, list) or not documents:
            raise InvalidDefinitions(f"acl {subject!r}: 'policies' must be a non-empty array")
        policies: list[PolicyEntry] = [entry_from_dict(d) for d in documents]
        assert guard is not None
        current = {str(e.resource): e for e in guard.store.entries(access_key)}
        differs = [p for p in policies if current.get(str(p.resource)) != p]
        action = "created" if not current else "updated" if differs else "unchanged"
        plan.add("acls", f"User:{access_key}", action, {"policies": documents})


def plan_import(broker: Broker, guard: Guard | None, document: dict[str, Any]) -> Plan:
    """Every change the document asks for, or InvalidDefinitions (nothing applied)."""
    version = document.get("halfmoon_definitions")
    if version != FORMAT:
        raise InvalidDefinitions(
            f"not a halfmoon definitions document (version {FORMAT}): "
            f"'halfmoon_definitions' is {version!r}"
        )
    plan = Plan()
    try:
        _plan_topics(broker, _entries(document, "topics"), plan)
        _plan_groups(broker, _entries(document, "groups"), plan)
        users = _plan_users(guard, _entries(document, "users"), plan)
        _plan_acls(guard, _entries(document, "acls"), users, plan)
    except InvalidDefinitions:
        raise
    except InvalidArgument as exc:  # a name, count or policy the create calls would refuse
        raise InvalidDefinitions(exc.message) from None
    return plan


def apply(broker: Broker, guard: Guard | None, plan: Plan) -> None:
    for kind, name, action, args in plan.steps:
        if action == "unchanged":
            continue
        if kind == "topics" and action == "created":
            count = args.get("queue_count", broker.config.default_queue_count)
            broker.create_topic(name, args["message_type"], count, args.get("perm", "rw"), [])
            if args.get("trace") is False:
                broker.update_topic(name, trace=False)
        elif kind == "topics":
            broker.update_topic(name, **args)
        elif kind == "groups" and action == "created":
            broker.create_group(name, **args)
        elif kind == "groups":
            broker.update_group(name, **args)
        elif kind == "users" and guard is not None and action == "created":
            guard.store.create_user(
                name, args["secret_key"], args.get("user_type", "Normal"), args.get("enabled", True)
            )
        elif kind == "users" and guard is not None:
            guard.store.update_user(name, **args)
        elif kind == "acls" and guard is not None:
            guard.store.update_acl(name, args["policies"])


# -- routes --------------------------------------------------------------------------


@routes.route(
    "GET",
    "/v1/definitions",
    "Export the definitions (topics, groups, users, policies) as one document",
    "exportDefinitions",
    (200, "Definitions", "the document"),
    403,
)
async def get_definitions(request: web.Request) -> web.Response:
    broker, guard = broker_of(request), request.app.get(GUARD_KEY)
    amqp = _amqp(request)
    if amqp is None:
        return reply(await call(export, broker, guard))
    queues = frozenset(amqp_definitions.stored_names(amqp.topology))
    document = await call(export, broker, guard, queues)
    return reply({**document, **amqp_definitions.export(amqp.topology)})


def _amqp(request: web.Request) -> AmqpServer | None:
    handle = request.app.get(AMQP_KEY)
    return handle.server if handle is not None else None


async def _plan_amqp(request: web.Request, document: dict[str, Any], plan: Plan) -> None:
    if not amqp_definitions.has_entries(document):
        return
    amqp = _amqp(request)
    if amqp is None:
        raise InvalidDefinitions(
            "the document holds AMQP definitions and this server serves no AMQP "
            "(server.amqp_listen is empty, or it is still starting)"
        )
    try:
        steps = await amqp_definitions.plan(amqp.topology, document)
    except InvalidArgument as exc:
        raise InvalidDefinitions(exc.message) from None
    for step in steps:
        plan.add(step.kind, step.shown, "created" if step.created else "unchanged", {"step": step})


@routes.route(
    "POST",
    "/v1/definitions",
    "Import a definitions document: validated whole, then created or updated",
    "importDefinitions",
    (200, "DefinitionsImport", "what was created, updated, left unchanged"),
    400,
    403,
    body="Definitions",
    params=[query("dry_run", "true: validate and plan only", {"type": "boolean"})],
)
async def import_definitions(request: web.Request) -> web.Response:
    document = await read_body(request)
    dry_run = query_bool(request, "dry_run", False)
    broker, guard = broker_of(request), request.app.get(GUARD_KEY)
    async with request.app[_IMPORTING]:
        plan = await call(plan_import, broker, guard, document)
        await _plan_amqp(request, document, plan)
        if not dry_run:
            await call(apply, broker, guard, plan)
            amqp = _amqp(request)
            steps = [args["step"] for kind, _, _, args in plan.steps if "step" in args]
            if steps and amqp is not None:
                try:
                    await amqp_definitions.apply(amqp, steps)
                except AmqpError as exc:  # declared otherwise meanwhile, through a channel
                    raise InvalidDefinitions(
                        f"{exc.reply_text}; the rest of the document was applied"
                    ) from None
    return reply({"applied": not dry_run, **plan.summary()})
