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
from typing import TypeVar

from aiohttp import web

from halfmoon.auth import Guard
from halfmoon.auth.policy import parse_resource
from halfmoon.errors import NotFound
from halfmoon.server.admin_auth import GUARD_KEY
from halfmoon.server.admin_http import read_body, reply, take

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


async def list_users(request: web.Request) -> web.Response:
    return reply({"users": [u.public() for u in _guard(request).store.users()]})


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


async def get_user(request: web.Request) -> web.Response:
    access_key = request.match_info["access_key"]
    user = _guard(request).store.user(access_key)
    if user is None:
        raise NotFound(f"user {access_key!r} does not exist")
    return reply(user.public())


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


async def delete_user(request: web.Request) -> web.Response:
    await _write(_guard(request).store.delete_user, request.match_info["access_key"])
    return reply({"deleted": request.match_info["access_key"]})


async def list_acls(request: web.Request) -> web.Response:
    store = _guard(request).store
    acls = store.acls(request.query.get("subject") or None, request.query.get("resource") or None)
    return reply({"acls": [{"subject": s, "policies": p} for s, p in acls.items()]})


async def create_acl(request: web.Request) -> web.Response:
    body = await read_body(request)
    subject = take(body, "subject", str, required=True)
    entries = await _write(
        _guard(request).store.create_acl, subject, take(body, "policies", list, required=True)
    )
    return reply({"subject": subject, "policies": [e.to_dict() for e in entries]}, status=201)


async def get_acl(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    acls = _guard(request).store.acls(subject)
    if not acls:
        raise NotFound(f"{subject} has no ACL")
    (name, policies), *_ = acls.items()
    return reply({"subject": name, "policies": policies})


async def update_acl(request: web.Request) -> web.Response:
    body = await read_body(request)
    subject = request.match_info["subject"]
    entries = await _write(
        _guard(request).store.update_acl, subject, take(body, "policies", list, required=True)
    )
    return reply({"subject": subject, "policies": [e.to_dict() for e in entries]})


async def delete_acl(request: web.Request) -> web.Response:
    subject = request.match_info["subject"]
    resource = request.query.get("resource")
    await _write(
        _guard(request).store.delete_acl, subject, parse_resource(resource) if resource else None
    )
    return reply({"deleted": subject, "resource": resource})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/users", list_users)
    app.router.add_post("/v1/users", create_user)
    app.router.add_get("/v1/users/{access_key}", get_user)
    app.router.add_patch("/v1/users/{access_key}", update_user)
    app.router.add_delete("/v1/users/{access_key}", delete_user)
    app.router.add_get("/v1/acls", list_acls)
    app.router.add_post("/v1/acls", create_acl)
    app.router.add_get("/v1/acls/{subject}", get_acl)
    app.router.add_patch("/v1/acls/{subject}", update_acl)
    app.router.add_delete("/v1/acls/{subject}", delete_acl)
