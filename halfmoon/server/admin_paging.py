"""Server-side search and pagination of the topic and group lists.

``?search=TEXT`` keeps the names that contain TEXT (case-insensitive), ``?offset=N``
skips N of them and ``?limit=N`` keeps at most N; the answer adds ``total`` (the
matches before paging), ``offset`` and ``limit``. Without any of the three the answer
is the whole list, as it always was. The dashboard asks for one page at a time, so a
broker with thousands of topics sends a page, not thousands of rows, per refresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from halfmoon.server.admin_http import ApiError

MAX_PAGE = 1000


def _query_int(request: web.Request, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(f"query parameter {name!r} must be an integer, not {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ApiError(f"query parameter {name!r} must be between {minimum} and {maximum}")
    return value


def page_of(request: web.Request, field: str, items: Sequence[Any]) -> dict[str, Any]:
    """``{field: items}``, searched and paged when the request asks for it."""
    paged = any(name in request.query for name in ("search", "offset", "limit"))
    if not paged:
        return {field: list(items)}
    search = request.query.get("search", "").strip().lower()
    matches = sorted(
        (item for item in items if search in item.name.lower()), key=lambda item: item.name
    )
    offset = _query_int(request, "offset", 0, 0, 1 << 62)
    limit = _query_int(request, "limit", 100, 1, MAX_PAGE)
    return {
        field: matches[offset : offset + limit],
        "total": len(matches),
        "offset": offset,
        "limit": limit,
    }
