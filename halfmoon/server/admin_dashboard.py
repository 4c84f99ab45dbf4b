"""The web dashboard: static pages on the admin listener, over the admin API only.

    GET /dashboard            redirect to /dashboard/
    GET /dashboard/           the single page (halfmoon/server/dashboard/index.html)
    GET /dashboard/{file}     its script and style sheet

The pages are plain HTML with one hand-written script (no framework, no build step,
no third-party front-end code): every figure they show and every button they offer
is one admin API call the script makes from the browser, so nothing the dashboard
does is impossible with curl. See docs/dashboard.md.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).with_name("dashboard")
FILES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
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


def add_routes(app: web.Application) -> None:
    app.router.add_get("/dashboard", redirect_to_index)
    app.router.add_get("/dashboard/", dashboard_file)
    app.router.add_get("/dashboard/{file}", dashboard_file)
