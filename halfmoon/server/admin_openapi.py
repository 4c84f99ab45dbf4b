"""The OpenAPI 3 document of the admin API, served at ``/openapi.json``, and the API's
own routes: that document, ``/metrics`` and ``/healthz``.

The document is built from :data:`ROUTE_TABLES`, the same tables the app registers
its handlers from (:func:`halfmoon.server.admin.create_admin_app`), so every route
served is documented, once, beside its handler.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aiohttp import web

from halfmoon.metrics import CONTENT_TYPE
from halfmoon.server import (
    admin_backlog,
    admin_clients,
    admin_dashboard,
    admin_dead_letters,
    admin_definitions,
    admin_history,
    admin_lite,
    admin_messages,
    admin_operations,
    admin_topics,
    admin_transactions,
    admin_users,
)
from halfmoon.server.admin_http import REGISTRY_KEY, call
from halfmoon.server.admin_routes import RouteTable, openapi_paths, openapi_schemas
from halfmoon.server.admin_schemas import (
    SECURITY,
    SECURITY_SCHEMES,
    SHARED_SCHEMAS,
    STR,
    json_content,
)

routes = RouteTable(SHARED_SCHEMAS)


@routes.operation(
    "GET",
    "/metrics",
    {
        "summary": "Prometheus metrics",
        "operationId": "getMetrics",
        "responses": {
            "200": {
                "description": "Prometheus text exposition 0.0.4",
                "content": {"text/plain": {"schema": STR}},
            }
        },
    },
)
async def get_metrics(request: web.Request) -> web.Response:
    text = await call(request.app[REGISTRY_KEY].render)
    response = web.Response(text=text)
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


@routes.operation(
    "GET",
    "/openapi.json",
    {
        "summary": "This document",
        "operationId": "getOpenApi",
        "responses": {"200": json_content({"type": "object"}, "OpenAPI 3")},
    },
)
async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


@routes.operation(
    "GET",
    "/healthz",
    {
        "summary": "Liveness",
        "operationId": "getHealth",
        "security": [],
        "responses": {"200": json_content({"type": "object"}, "ok")},
    },
)
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


# Every admin route, in the order the app registers them (aiohttp tries them in order).
ROUTE_TABLES: tuple[RouteTable, ...] = (
    admin_topics.routes,
    admin_transactions.routes,
    routes,
    admin_lite.routes,
    admin_users.routes,
    admin_messages.routes,
    admin_operations.routes,
    admin_clients.routes,
    admin_dead_letters.routes,
    admin_backlog.routes,
    admin_definitions.routes,
    admin_history.routes,
    admin_dashboard.routes,
)


@cache
def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "halfmoon admin API",
            "version": "1",
            "description": "Topics, consumer groups, offsets and status of one halfmoon broker. "
            'Errors are {"error": {"code", "message"}}.',
        },
        "paths": openapi_paths(ROUTE_TABLES),
        "components": {
            "schemas": openapi_schemas(ROUTE_TABLES),
            "securitySchemes": SECURITY_SCHEMES,
        },
        # With auth.enabled (docs/security.md); public operations say "security": [].
        "security": SECURITY,
    }
