"""Admin API of lite topics (RIP-83): list a parent's lite topics and subscriptions, delete one.

``GET /v1/topics/{topic}/lite-topics``: each lite topic of a ``lite`` parent
(offsets, subscriber count) and every consumer client's lite subscriptions.
``DELETE /v1/topics/{topic}/lite-topics/{lite_topic}``: drop one lite topic's
messages and subscriptions; subscribed clients get NotifyUnsubscribeLiteCommand.
"""

from __future__ import annotations

from aiohttp import web

from halfmoon.server.admin_http import broker_of, call, reply


async def list_lite_topics(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.match_info["topic"]
    lite_topics = await call(broker.list_lite_topics, topic)
    subscriptions = await call(broker.lite_subscriptions, topic)
    return reply({"topic": topic, "lite_topics": lite_topics, "subscriptions": subscriptions})


async def delete_lite_topic(request: web.Request) -> web.Response:
    topic, lite_topic = request.match_info["topic"], request.match_info["lite_topic"]
    notified = await call(broker_of(request).delete_lite_topic, topic, lite_topic)
    return reply({"topic": topic, "lite_topic": lite_topic, "deleted": True, "notified": notified})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/topics/{topic}/lite-topics", list_lite_topics)
    app.router.add_delete("/v1/topics/{topic}/lite-topics/{lite_topic}", delete_lite_topic)
