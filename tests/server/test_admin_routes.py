"""The admin route tables: one declaration per route feeds both the app and /openapi.json."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from halfmoon.server.admin_openapi import ROUTE_TABLES, openapi_document
from halfmoon.server.admin_routes import RouteTable, openapi_paths, openapi_schemas
from halfmoon.server.admin_schemas import path

READY = web.AppKey("ready", bool)


def refs_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs_in(value)


def test_every_reference_names_a_declared_schema_and_every_schema_is_used():
    document = openapi_document()
    declared = set(document["components"]["schemas"])
    named = {ref.rsplit("/", 1)[1] for ref in refs_in(document)}
    assert named - declared == set(), "operations name schemas no module declares"
    assert declared - named == set(), "schemas declared but never used"


def test_operation_ids_are_unique():
    ids = [
        operation["operationId"]
        for item in openapi_document()["paths"].values()
        for operation in item.values()
    ]
    duplicated = {i for i in ids if ids.count(i) > 1}
    assert duplicated == set()


def test_every_json_operation_takes_a_namespace_and_documents_500():
    for template, item in openapi_document()["paths"].items():
        for method, operation in item.items():
            answers = operation["responses"]
            if not any("application/json" in a.get("content", {}) for a in answers.values()):
                continue  # metrics, the dashboard's pages and redirects
            if template in ("/openapi.json", "/healthz"):
                continue
            names = {p["name"] for p in operation["parameters"]}
            assert "namespace" in names, f"{method} {template}"
            assert "500" in answers, f"{method} {template}"


def test_a_route_declared_twice_is_refused():
    first, second = RouteTable(), RouteTable()

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({})

    for table in (first, second):
        table.route("GET", "/v1/twice", "twice", "twice", (200, {"type": "object"}, ""))(handler)
    with pytest.raises(ValueError, match="GET /v1/twice is declared twice"):
        openapi_paths([first, second])


def test_a_schema_declared_twice_differently_is_refused_and_identically_is_one():
    same = {"type": "object"}
    assert openapi_schemas([RouteTable({"A": same}), RouteTable({"A": dict(same)})]) == {"A": same}
    with pytest.raises(ValueError, match="'A' is declared twice, differently"):
        openapi_schemas([RouteTable({"A": same}), RouteTable({"A": {"type": "string"}})])


def test_a_table_serves_what_it_documents_and_a_regex_is_documented_as_its_name():
    table = RouteTable({"Echo": {"type": "object"}}, setup=lambda app: app.__setitem__(READY, True))

    @table.route(
        "POST",
        "/v1/things/{name}/{verb:start|stop}",
        "Start or stop a thing",
        "decideThing",
        (200, "Echo", "what was asked"),
        400,
        params=[path("name"), path("verb")],
    )
    async def decide(request: web.Request) -> web.Response:
        return web.json_response(dict(request.match_info))

    @table.route("GET", "/v1/things", "Things", "listThings", (200, "Echo", "none"))
    async def things(request: web.Request) -> web.Response:
        return web.json_response({"things": []})

    app = web.Application()
    table.add_to(app)
    assert app[READY] is True
    paths = openapi_paths([table])
    assert set(paths) == {"/v1/things/{name}/{verb}", "/v1/things"}
    operation = paths["/v1/things/{name}/{verb}"]["post"]
    assert set(operation["responses"]) == {"200", "400", "500"}

    async def ask() -> None:
        async with TestClient(TestServer(app)) as client:
            answer = await client.post("/v1/things/a/stop")
            assert answer.status == 200
            assert await answer.json() == {"name": "a", "verb": "stop"}
            assert (await client.post("/v1/things/a/explode")).status == 404
            assert (await client.head("/v1/things")).status == 200  # a GET answers HEAD too

    asyncio.run(ask())


def test_the_document_is_json_and_built_from_every_table():
    document = openapi_document()
    json.dumps(document)  # served as is
    declared = {(r.template, r.method.lower()) for t in ROUTE_TABLES for r in t.routes}
    documented = {(p, m) for p, item in document["paths"].items() for m in item}
    assert declared == documented
