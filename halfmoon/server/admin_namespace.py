"""``?namespace=NS`` on the admin API: the names a request gives are taken in that namespace.

Every endpoint accepts the query parameter ``namespace``. When it is present
(and not empty) the topic and consumer-group names the request carries are
replaced by their stored names (``NS%name``, see
:mod:`halfmoon.server.namespace`) before the handler runs, wherever they are:

- path segments ``{topic}`` and ``{group}`` (``/v1/groups/...``; not the
  transaction group of ``/v1/transaction-groups/{group}``);
- query parameters ``topic`` and ``group``;
- body fields: ``name`` of ``POST /v1/topics`` and ``POST /v1/groups``,
  ``topic`` of ``POST /v1/groups/{group}/reset-offset``.

``GET /v1/topics`` and ``GET /v1/groups`` list only that namespace's topics
and groups (DLQ topics of its groups included). Answers always show stored
names: an operator sees exactly what the broker holds, and the same names
work without ``namespace``. A bad namespace is a 400 ``ILLEGAL_NAMESPACE``.

Doing this in one middleware keeps every handler namespace-unaware: a
handler reads its names as before and gets stored ones.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from halfmoon.server.admin_http import BODY_KEY, ApiError, read_body
from halfmoon.server.namespace import check_namespace, in_namespace, stored_name

PARAM = "namespace"

# Route templates whose JSON body names a topic or group: field -> kind.
_BODY_NAMES: dict[tuple[str, str], dict[str, str]] = {
    ("POST", "/v1/topics"): {"name": "topic"},
    ("POST", "/v1/groups"): {"name": "group"},
    ("POST", "/v1/groups/{group}/reset-offset"): {"topic": "topic"},
    ("POST", "/v1/groups/{group}/clone-offset"): {"topic": "topic", "to": "group"},
}
# List endpoints filtered to the namespace: route template -> key of the list in the answer.
_LISTS = {"/v1/topics": "topics", "/v1/groups": "groups"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _template(request: web.Request) -> str:
    route = request.match_info.route.resource
    return route.canonical if route is not None else ""


def stored_path_names(request: web.Request) -> dict[str, str]:
    """The request's path names as its handler will see them: stored, namespace applied.

    What admin_auth authorizes (it runs before this module's middleware, so that
    nothing is read or parsed for a caller without credentials).
    """
    names = dict(request.match_info)
    namespace = request.query.get(PARAM, "")
    if namespace:
        if "topic" in names:
            names["topic"] = stored_name(namespace, names["topic"], "topic")
        if "group" in names and _template(request).startswith("/v1/groups/"):
            names["group"] = stored_name(namespace, names["group"], "group")
    return names


async def created_name(request: web.Request) -> str | None:
    """The stored name a ``POST /v1/topics`` or ``/v1/groups`` creates; None when unreadable."""
    kind = _BODY_NAMES.get((request.method, _template(request)), {}).get("name")
    if kind is None:
        return None
    try:
        name = (await read_body(request)).get("name")  # the bytes stay for the handler
    except ApiError:
        return None
    if not isinstance(name, str) or not name:
        return None
    return stored_name(request.query.get(PARAM, ""), name, kind)


@web.middleware
async def namespaced_names(request: web.Request, handler: Handler) -> web.StreamResponse:
    namespace = request.query.get(PARAM, "")
    if not namespace:
        return await handler(request)
    check_namespace(namespace)
    template = _template(request)
    request.match_info.update(stored_path_names(request))
    renamed = {
        key: stored_name(namespace, request.query[key], key)
        for key in ("topic", "group")
        if request.query.get(key)
    }
    if renamed:
        request = request.clone(rel_url=request.rel_url.update_query(renamed))
    fields = _BODY_NAMES.get((request.method, template))
    if fields:
        body = await read_body(request)
        for field, kind in fields.items():
            if isinstance(body.get(field), str) and body[field]:
                body[field] = stored_name(namespace, body[field], kind)
        request[BODY_KEY] = body
    response = await handler(request)
    key = _LISTS.get(template)
    if key and request.method == "GET" and isinstance(response, web.Response):
        return _filtered(response, key, namespace)
    return response


def _filtered(response: web.Response, key: str, namespace: str) -> web.Response:
    if response.status != 200 or response.body is None:
        return response
    data: Any = json.loads(response.body)  # type: ignore[arg-type]
    entries = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return response
    data[key] = [
        e
        for e in entries
        if isinstance(e, dict) and in_namespace(str(e.get("name", "")), namespace)
    ]
    return web.json_response(data, dumps=lambda d: json.dumps(d, ensure_ascii=False))
