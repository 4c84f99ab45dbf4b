"""The web dashboard: static pages on the admin listener, over the admin API only.

``/`` and ``/dashboard`` redirect to ``/dashboard/``, the single page
(halfmoon/server/dashboard/index.html), which loads its scripts and style sheet
from ``/dashboard/{file}``; ``GET /v1/whoami`` says who the request's credentials
are, and whether they may change things (the page shows mutating controls only then).

The pages are plain HTML with hand-written scripts (no framework, no build step,
no third-party front-end code): every figure they show and every button they offer
is one admin API call a script makes from the browser, so nothing the dashboard
does is impossible with curl. See docs/dashboard.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from halfmoon.auth import CLUSTER, Unauthenticated
from halfmoon.server.admin_auth import GUARD_KEY
from halfmoon.server.admin_http import reply
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import STR, path

STATIC_DIR = Path(__file__).with_name("dashboard")
FILES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "brokers.js": "text/javascript",
    "topics.js": "text/javascript",
    "messages.js": "text/javascript",
    "users.js": "text/javascript",
    "operate.js": "text/javascript",
    "charts.js": "text/javascript",
    "dashboard.css": "text/css",
}


SCHEMAS: dict[str, Any] = {
    "WhoAmI": {
        "type": "object",
        "properties": {
            "auth_enabled": {"type": "boolean"},
            "authenticated": {"type": "boolean", "description": "the credentials verified"},
            "access_key": {"type": "string", "nullable": True},
            "reason": {"type": "string", "description": "why not authenticated"},
            "super": {"type": "boolean"},
            "can_write": {
                "type": "boolean",
                "description": "may Update the Cluster: the dashboard shows mutating controls",
            },
        },
    },
}

routes = RouteTable(SCHEMAS)


def _redirect(summary: str, operation_id: str) -> dict[str, Any]:
    return {
        "security": [],
        "summary": summary,
        "operationId": operation_id,
        "responses": {"302": {"description": "to /dashboard/"}},
    }


@routes.operation("GET", "/", _redirect("Redirect to the dashboard", "redirectRoot"))
@routes.operation("GET", "/dashboard", _redirect("Redirect to /dashboard/", "redirectDashboard"))
async def redirect_to_index(request: web.Request) -> web.Response:
    raise web.HTTPFound("/dashboard/")


@routes.operation(
    "GET",
    "/dashboard/",
    {
        "security": [],
        "summary": "The web dashboard (docs/dashboard.md)",
        "operationId": "getDashboard",
        "responses": {
            "200": {"description": "the page", "content": {"text/html": {"schema": STR}}}
        },
    },
)
@routes.operation(
    "GET",
    "/dashboard/{file}",
    {
        "security": [],
        "summary": "The dashboard's scripts and style sheet",
        "operationId": "getDashboardFile",
        "parameters": [
            path("file", schema={"type": "string", "enum": sorted(set(FILES) - {"index.html"})})
        ],
        "responses": {"200": {"description": "the file"}, "404": {"description": "no such file"}},
    },
)
async def dashboard_file(request: web.Request) -> web.Response:
    name = request.match_info.get("file") or "index.html"
    content_type = FILES.get(name)
    if content_type is None:
        raise web.HTTPNotFound()
    response = web.Response(
        body=(STATIC_DIR / name).read_bytes(), content_type=content_type, charset="utf-8"
    )
    # The page is small and changes with the broker's version: always revalidate.
    response.headers["Cache-Control"] = "no-cache"
    return response


@routes.route(
    "GET",
    "/v1/whoami",
    "Who the credentials are, and whether they may change things",
    "whoAmI",
    (200, "WhoAmI", "the caller (authenticated or not)"),
    public=True,
)
async def whoami(request: web.Request) -> web.Response:
    """The caller as the admin API sees it; open to all, so the page can ask before it
    has credentials whether it needs a login (a failed login answers 200 with
    ``authenticated: false`` and the reason, never 401: the page shows the form).

    A *writer* may Update the Cluster (a super user, or ``Cluster: All`` / ``Update``);
    anyone else gets the read-only dashboard, and the API refuses their writes anyway
    (admin_auth)."""
    guard = request.app.get(GUARD_KEY)
    if guard is None or not guard.enabled:
        return reply(
            {
                "auth_enabled": False,
                "authenticated": False,
                "access_key": None,
                "super": False,
                "can_write": True,
            }
        )
    peer = request.remote or ""
    answer: dict[str, Any] = {"auth_enabled": True, "authenticated": False, "access_key": None}
    answer.update({"super": False, "can_write": False})
    header = request.headers.get("Authorization", "")
    if not header:
        answer["reason"] = "log in with an admin API user"
        return reply(answer)
    try:
        user = guard.authenticate_http(header, peer, "GET /v1/whoami")
    except Unauthenticated as exc:
        answer["reason"] = exc.message
        return reply(answer)
    answer.update(
        {
            "authenticated": True,
            "access_key": user.access_key,
            "super": user.is_super,
            "can_write": user.is_super or guard.may(user, CLUSTER, "Update", peer),
        }
    )
    return reply(answer)
