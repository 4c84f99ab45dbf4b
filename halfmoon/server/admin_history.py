"""``GET /v1/statistics/history``: a topic's or a group's traffic over the last hours.

The dashboard's rate charts: messages in, out (delivered), acked and redelivered,
per step of whole minutes, from the broker's per-minute rings
(:meth:`halfmoon.broker.statistics.TrafficStatistics.history`). The rings hold 24
hours per series at a fixed size, so the history costs no memory per request and
none that grows with traffic; at most 120 steps come back whatever the range.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from halfmoon.broker.statistics import WINDOW_MINUTES
from halfmoon.server.admin_http import (
    ApiError,
    broker_of,
    call,
    existing_group,
    existing_topic,
    reply,
)
from halfmoon.server.admin_messages import query_int
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import INT, STR, query

SCHEMAS: dict[str, Any] = {
    "TrafficHistory": {
        "type": "object",
        "properties": {
            "topic": {**STR, "nullable": True},
            "group": {**STR, "nullable": True},
            "minutes": {**INT, "description": "the range covered (a whole number of steps)"},
            "step_ms": {**INT, "description": "each value counts the messages of one step"},
            "start_ms": {**INT, "description": "when the first step starts"},
            "series": {
                "type": "object",
                "description": "per kind (in, out, acked, redelivered), counts per step, "
                "oldest first",
                "additionalProperties": {"type": "array", "items": INT},
            },
        },
    },
}

routes = RouteTable(SCHEMAS)


@routes.route(
    "GET",
    "/v1/statistics/history",
    "A topic's or group's messages in, out, acked and redelivered over time",
    "getTrafficHistory",
    (200, "TrafficHistory", "counts per step"),
    400,
    404,
    params=[
        query("topic", "this topic (and every group's consumption of it)"),
        query("group", "this group (of every topic, or of 'topic')"),
        query("minutes", "the range: 1 to 1440 (default 60)", {**INT, "minimum": 1}),
    ],
)
async def get_history(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.query.get("topic") or None
    group = request.query.get("group") or None
    if topic is None and group is None:
        raise ApiError("give 'topic', 'group' or both: a history is of a topic or a group")
    minutes = query_int(request, "minutes", minimum=1, default=60)
    assert minutes is not None
    if minutes > WINDOW_MINUTES:
        raise ApiError(f"query parameter 'minutes' is at most {WINDOW_MINUTES} (24 hours kept)")

    def collect() -> dict[str, Any]:
        if topic is not None:
            existing_topic(broker, topic)
        if group is not None:
            existing_group(broker, group)
        return broker.traffic_history(topic, group, minutes)

    history = await call(collect)
    return reply({"topic": topic, "group": group, **history})
