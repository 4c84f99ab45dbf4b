"""The OpenAPI vocabulary every admin module writes its operations and schemas in:
the primitive types, parameters, the error answer, paging, the security schemes.

Each module's own component schemas sit beside its handlers (its
:class:`~halfmoon.server.admin_routes.RouteTable`); the ones several modules
answer with (``Error``, ``Deleted``) are here.
"""

from __future__ import annotations

from typing import Any

INT: dict[str, Any] = {"type": "integer"}
NUM: dict[str, Any] = {"type": "number"}
STR: dict[str, Any] = {"type": "string"}
BOOL: dict[str, Any] = {"type": "boolean"}
NULL_INT: dict[str, Any] = {"type": "integer", "nullable": True}
NULL_STR: dict[str, Any] = {"type": "string", "nullable": True}
STRS: dict[str, Any] = {"type": "array", "items": STR}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def array_of(name: str) -> dict[str, Any]:
    return {"type": "array", "items": ref(name)}


def json_content(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def query(
    name: str, description: str, schema: dict[str, Any] = STR, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


def path(name: str, description: str | None = None, schema: dict[str, Any] = STR) -> dict[str, Any]:
    param: dict[str, Any] = {"name": name, "in": "path", "required": True, "schema": schema}
    if description is not None:
        param["description"] = description
    return param


def name_in_path(name: str, what: str) -> dict[str, Any]:
    """A topic's or group's name in the path (names may hold ``%``)."""
    return path(name, f"{what} name, percent-encoded (%DLQ%g is %25DLQ%25g)")


def path_int(name: str, description: str | None = None) -> dict[str, Any]:
    return path(name, description, {"type": "integer", "minimum": 0})


TOPIC = name_in_path("topic", "Topic")
GROUP = name_in_path("group", "Consumer group")

# Every JSON endpoint takes ?namespace= (halfmoon.server.admin_namespace).
NAMESPACE: dict[str, Any] = query(
    "namespace",
    "take the topic and consumer-group names of this request in this namespace "
    "(stored as NAMESPACE%name, as RocketMQ does); topic and group lists show only its own",
    {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,125}$"},
)

_ERROR_MEANINGS = {
    400: "The request is malformed or the broker refused it (see error.code).",
    403: "The operation is forbidden.",
    404: "The topic or group does not exist.",
    409: "It already exists, or the transaction is already decided the other way.",
    500: "Internal error.",
}


def error_responses(*statuses: int) -> dict[str, Any]:
    """The error answers of an operation: those given, and 500, which any may give."""
    return {str(s): json_content(ref("Error"), _ERROR_MEANINGS[s]) for s in (*statuses, 500)}


# ?search=, ?offset=, ?limit= on GET /v1/topics and GET /v1/groups (admin_paging).
PAGING_PARAMS = [
    query("search", "only names containing this text (case-insensitive)"),
    query("offset", "skip this many matches (names in order)", {**INT, "minimum": 0}),
    query("limit", "at most this many (default 100, max 1000)", {**INT, "minimum": 1}),
]

# Present when any of the paging parameters was given.
PAGING_FIELDS = {
    "total": {**INT, "description": "matches before paging"},
    "offset": INT,
    "limit": INT,
}

SHARED_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {**STR, "description": "stable code, e.g. TOPIC_NOT_FOUND"},
                    "message": {**STR, "description": "what went wrong and what to do"},
                },
            }
        },
    },
    "Deleted": {"type": "object", "properties": {"deleted": STR}},
}

# With auth.enabled (docs/security.md); an operation declared public overrides it.
SECURITY_SCHEMES: dict[str, Any] = {
    "basic": {"type": "http", "scheme": "basic", "description": "access key : secret key"},
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "the token is ACCESS_KEY:SECRET_KEY",
    },
}
SECURITY: list[dict[str, list[str]]] = [{"basic": []}, {"bearer": []}]
