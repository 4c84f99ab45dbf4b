"""Admin API routes for users and ACLs (mqadmin's createUser … listAcl), super users only.

Users are shown without their secret keys, always. The guard's store is the
one the gRPC edge authenticates against, so a change applies to the next
request. Changes run off the event loop: the store writes a file (fsync) in
local mode and etcd in cluster mode, and the loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from halfmoon.auth import Guard
from halfmoon.auth.policy import parse_resource
from halfmoon.errors import NotFound
from halfmoon.server.admin_auth import GUARD_KEY
from halfmoon.server.admin_http import read_body, reply, take
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import STR, STRS, path, query, ref

SCHEMAS: dict[str, Any] = {
    "User": {
        "type": "object",
        "properties": {
            "access_key": STR,
            "user_type": {"type": "string", "enum": ["Super", "Normal"]},
            "enabled": {"type": "boolean"},
        },
    },
    "UserCreate": {
        "type": "object",
        "required": ["access_key", "secret_key"],
        "properties": {
            "access_key": STR,
            "secret_key": {**STR, "minLength": 8, "writeOnly": True},
            "user_type": {"type": "string", "enum": ["Super", "Normal"]},
            "enabled": {"type": "boolean"},
        },
    },
    "UserUpdate": {
        "type": "object",
        "properties": {
            "secret_key": {**STR, "minLength": 8, "writeOnly": True},
            "user_type": {"type": "string", "enum": ["Super", "Normal"]},
            "enabled": {"type": "boolean"},
        },
    },
    "UserList": {
        "type": "object",
        "properties": {"users": {"type": "array", "items": ref("User")}},
    },
    "PolicyEntry": {
        "type": "object",
        "required": ["resource", "actions"],
        "properties": {
            "resource": {**STR, "description": "Cluster, Namespace:NS, Topic:NAME, Group:NAME"},
            "actions": {
                "type": "array",
                "items": {
                    "type": "string",
                    "enum": ["Pub", "Sub", "Create", "Update", "Delete", "Get", "List", "All"],
                },
            },
            "source_ips": STRS,
            "decision": {"type": "string", "enum": ["Allow", "Deny"]},
        },
    },
    "Acl": {
        "type": "object",
        "properties": {
            "subject": {**STR, "description": "User:ACCESS_KEY"},
            "policies": {"type": "array", "items": ref("PolicyEntry")},
        },
    },
    "AclList": {"type": "object", "properties": {"acls": {"type": "array", "items": ref("Acl")}}},
    "AclPolicies": {
        "type": "object",
        "required": ["policies"],
        "properties": {"policies": {"type": "array", "items": ref("PolicyEntry")}},
    },
}

routes = RouteTable(SCHEMAS)

ACCESS_KEY = path("access_key", "the user's access key")
SUBJECT = path("subject", "User:ACCESS_KEY")


T = TypeVar("T")


async def _write(change: Callable[..., T], *args: object, **kwargs: object) -> T:
    """Run one store change in a worker thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(change, *args, **kwargs))


def _guard(request: web.Request) -> Guard:
    guard = request.app.get(GUARD_KEY)
    if guard is None:
        raise NotFound("this server keeps no users (authentication is not configured)")
    return guard


@routes.route(
    "GET", "/v1/users", "Users (never their secret keys)", "listUsers", (200, "UserList", "")
)
async def list_users(request: web.Request) -> web.Response:
    return reply({"users": [u.public() for u in _guard(request).store.users()]})


@routes.route(
    "POST",
    "/v1/users",
    "Create a user",
    "createUser",
    (201, "User", "created"),
    400,
    409,
    body="UserCreate",
)
async def create_user(request: web.Request) -> web.Response:
    body = await read_body(request)
    user = await _write(
        _guard(request).store.create_user,
        take(body, "access_key", str, required=True),
        take(body, "secret_key", str, required=True),
        take(body, "user_type", str) or "Normal",
        take(body, "enabled", bool) is not False,
    )
    return reply(user.public(), status=201)


@routes.route(
    "GET",
    "/v1/users/{access_key}",
    "A user",
    "getUser",
    (200, "User", ""),
    404,
    params=[ACCESS_KEY],
)
async def get_user(request: web.Request) -> web.Response:
    access_key = request.match_info["access_key"]
    user = _guard(request).store.user(access_key)
    if user is None:
        raise NotFound(f"user {access_key!r} does not exist")
    return reply(user.public())


@routes.route(
    "PATCH",
    "/v1/users/{access_key}",
    "Change a user's secret key, type or enabled flag",
    "updateUser",
    (200, "User", "updated"),
    400,
    404,
    body="UserUpdate",
    params=[ACCESS_KEY],
)
async def update_user(request: web.Request) -> web.Response:
    body = await read_body(request)
    user = await _write(
        _guard(request).store.update_user,
        request.match_info["access_key"],
        secret_key=take(body, "secret_key", str),
        user_type=take(body, "user_type", str),
        enabled=take(body, "enabled", bool),
    )
    return reply(user.public())


@routes.route(
    "DELETE",
    "/v1/users/{access_key}",
    "Delete a user and its ACL",
    "deleteUser",
    (200, "Deleted", "deleted"),
    404,
    params=[ACCESS_KEY],
)
async def delete_user(request: web.Request) -> web.Response:
    await _write(_guard(request).store.delete_user, request.match_info["access_key"])
    return reply({"deleted": request.match_info["access_key"]})


@routes.route(
    "GET",
    "/v1/acls",
    "ACLs, optionally of one subject or resource",
    "listAcls",
    (200, "AclList", ""),
    params=[
        query("subject", "only User:ACCESS_KEY's"),
        query("resource", "only entries of this resource"),
    ],
)
async def list_acls(request: web.Request) -> web.Response:
    store = _guard(request).store
    acls = store.acls(request.query.get("subject") or None, request.query.get("resource") or None)
    return reply({"acls": [{"subject": s, "policies": p} for s, p in acls.items()]})


@routes.route(
    "POST",
    "/v1/acls",
    "Add policy entries for resources a subject has none for yet",
    "createAcl",
    (201, "Acl", "created"),
    400,
    404,
    409,
    body="Acl",
)
async def create_acl(request: web.Request) -> web.Response:
    body = await read_body(request)
    subject = take(body, "subject", str, required=True)
    entries = await _write(
        _guard(request).store.create_acl, subject, take(body, "policies", list, required=True)
    )
    return reply({"subject": subject, "policies": [e.to_dict() for e in entries]}, status=201)


@routes.route(
    "GET",
    "/v1/acls/{subject}",
    "A subject's ACL",
    "getAcl",
    (200, "Acl", ""),
    404,
    params=[SUBJECT],
)
async def get_acl(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    acls = _guard(request).store.acls(subject)
    if not acls:
        raise NotFound(f"{subject} has no ACL")
    (name, policies), *_ = acls.items()
    return reply({"subject": name, "policies": policies})


@routes.route(
    "PATCH",
    "/v1/acls/{subject}",
    "Replace (or add) the entries of the resources named",
    "updateAcl",
    (200, "Acl", "updated"),
    400,
    404,
    body="AclPolicies",
    params=[SUBJECT],
)
async def update_acl(request: web.Request) -> web.Response:
    body = await read_body(request)
    subject = request.match_info["subject"]
    entries = await _write(
        _guard(request).store.update_acl, subject, take(body, "policies", list, required=True)
    )
    return reply({"subject": subject, "policies": [e.to_dict() for e in entries]})


@routes.route(
    "DELETE",
    "/v1/acls/{subject}",
    "Delete a subject's ACL, or its entry for ?resource=",
    "deleteAcl",
    (200, "Deleted", "deleted"),
    400,
    404,
    params=[SUBJECT, query("resource", "only this resource's entry")],
)
async def delete_acl(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    resource = request.query.get("resource")
    await _write(
        _guard(request).store.delete_acl, subject, parse_resource(resource) if resource else None
    )
    return reply({"deleted": subject, "resource": resource})
