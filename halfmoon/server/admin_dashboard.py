"""The web dashboard: static pages on the admin listener, over the admin API only.

    GET /dashboard            redirect to /dashboard/
    GET /dashboard/           the single page (halfmoon/server/dashboard/index.html)
    GET /dashboard/{file}     its scripts and style sheet
    GET /v1/whoami            who the request's credentials are, and whether they may change
                              things (the page shows mutating controls only then)

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

STATIC_DIR = Path(__file__).with_name("dashboard")
FILES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "users.js": "text/javascript",
    "dashboard.css": "text/css",
}


async def redirect_to_index(request: web.Request) -> web.Response:
    raise web.HTTPFound("/dashboard/")


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


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/dashboard", redirect_to_index)
    app.router.add_get("/dashboard/", dashboard_file)
    app.router.add_get("/dashboard/{file}", dashboard_file)
