"""One declaration per admin route: the handler, where aiohttp serves it, and its OpenAPI
operation, side by side.

Each admin module keeps a :class:`RouteTable` and decorates its handlers::

    routes = RouteTable(schemas={"Topic": {...}})

    @routes.route("GET", "/v1/topics/{topic}", "One topic", "getTopic",
                  (200, "Topic", "the topic"), 404, params=[TOPIC])
    async def get_topic(request): ...

:meth:`RouteTable.add_to` registers the handlers on an app, and
:func:`openapi_document` builds ``/openapi.json`` from the same tables, so a route
cannot be served undocumented or documented unserved.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from halfmoon.server.admin_schemas import NAMESPACE, error_responses, json_content, ref

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)

# An answer's schema: the name of a component schema, or a schema written in place.
Schema = str | dict[str, Any]

# aiohttp's {name:regex} is documented as the plain {name} template it matches.
_PATH_REGEX = re.compile(r"\{(\w+):[^}]*\}")


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # as aiohttp routes it; a {name:regex} keeps its regex
    handler: Handler
    operation: dict[str, Any]

    @property
    def template(self) -> str:
        """The path as OpenAPI (and aiohttp's ``resource.canonical``) writes it."""
        return _PATH_REGEX.sub(r"{\1}", self.path)


def json_operation(
    summary: str,
    operation_id: str,
    ok: tuple[int, Schema, str],
    *errors: int,
    body: str | None = None,
    body_required: bool = True,
    params: Sequence[dict[str, Any]] = (),
    public: bool = False,
) -> dict[str, Any]:
    """A JSON endpoint's operation: its answer, its errors (and 500), its request body,
    its parameters and ``?namespace=``, which every JSON endpoint takes."""
    status, schema, description = ok
    operation: dict[str, Any] = {
        "summary": summary,
        "operationId": operation_id,
        "responses": {
            str(status): json_content(
                ref(schema) if isinstance(schema, str) else schema, description
            ),
            **error_responses(*errors),
        },
        "parameters": [*params, NAMESPACE],
    }
    if body is not None:
        operation["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": ref(body)}},
        }
    if public:  # answered without credentials, even with auth.enabled
        operation["security"] = []
    return operation


class RouteTable:
    """The routes of one admin module and the component schemas their operations name."""

    def __init__(
        self,
        schemas: Mapping[str, Any] | None = None,
        setup: Callable[[web.Application], None] | None = None,
    ) -> None:
        self.routes: list[Route] = []
        self.schemas: dict[str, Any] = dict(schemas or {})
        self._setup = setup  # what the handlers need on the app (a lock, a key)

    def route(
        self,
        method: str,
        path: str,
        summary: str,
        operation_id: str,
        ok: tuple[int, Schema, str],
        *errors: int,
        body: str | None = None,
        body_required: bool = True,
        params: Sequence[dict[str, Any]] = (),
        public: bool = False,
    ) -> Callable[[H], H]:
        """Declare a JSON endpoint (see :func:`json_operation` for the arguments)."""
        operation = json_operation(
            summary,
            operation_id,
            ok,
            *errors,
            body=body,
            body_required=body_required,
            params=params,
            public=public,
        )
        return self.operation(method, path, operation)

    def operation(self, method: str, path: str, operation: dict[str, Any]) -> Callable[[H], H]:
        """Declare an endpoint whose OpenAPI operation is written out whole (one that
        does not answer JSON: metrics, the dashboard's files)."""

        def register(handler: H) -> H:
            self.routes.append(Route(method.upper(), path, handler, operation))
            return handler

        return register

    def add_to(self, app: web.Application) -> None:
        if self._setup is not None:
            self._setup(app)
        for route in self.routes:
            if route.method == "GET":  # and HEAD, as aiohttp's add_get does
                app.router.add_get(route.path, route.handler)
            else:
                app.router.add_route(route.method, route.path, route.handler)


def openapi_paths(tables: Iterable[RouteTable]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for table in tables:
        for route in table.routes:
            item = paths.setdefault(route.template, {})
            method = route.method.lower()
            if method in item:
                raise ValueError(f"{route.method} {route.template} is declared twice")
            item[method] = route.operation
    return paths


def openapi_schemas(tables: Iterable[RouteTable]) -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for table in tables:
        for name, schema in table.schemas.items():
            if name in schemas and schemas[name] != schema:
                raise ValueError(f"component schema {name!r} is declared twice, differently")
            schemas[name] = schema
    return schemas
