"""Builders of OpenAPI 3 operations shared by ``admin_openapi`` and ``admin_openapi_ops``."""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "The request is malformed or the broker refused it (see error.code).",
        403: "The operation is forbidden.",
        404: "The topic or group does not exist.",
        409: "It already exists, or the transaction is already decided the other way.",
        500: "Internal error.",
    }
    return {str(s): _json(_ref("Error"), meaning[s]) for s in (*statuses, 500)}


def _op(
    summary: str,
    op_id: str,
    ok: tuple[int, dict[str, Any], str],
    *errors: int,
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status, schema, description = ok
    op: dict[str, Any] = {
        "summary": summary,
        "operationId": op_id,
        "responses": {str(status): _json(schema, description), **_errors(*errors)},
    }
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    # Every /v1 endpoint takes ?namespace= (halfmoon.server.admin_namespace).
    op["parameters"] = [*(params or []), _NAMESPACE]
    return op


_NAMESPACE: dict[str, Any] = {
    "name": "namespace",
    "in": "query",
    "required": False,
    "description": "take the topic and consumer-group names of this request in this namespace "
    "(stored as NAMESPACE%name, as RocketMQ does); topic and group lists show only its own",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,125}$"},
}


def _path_param(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": f"{what} name, percent-encoded (%DLQ%g is %25DLQ%25g)",
        "schema": {"type": "string"},
    }
