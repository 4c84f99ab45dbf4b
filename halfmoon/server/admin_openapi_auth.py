"""OpenAPI paths and schemas of the users and ACLs endpoints (``admin_users``), and the
security schemes every other route is under (``admin_auth``)."""

from __future__ import annotations

from typing import Any

from halfmoon.server.admin_openapi_common import _op, _ref

_STR = {"type": "string"}
_STRS = {"type": "array", "items": _STR}

SECURITY_SCHEMES: dict[str, Any] = {
    "basic": {"type": "http", "scheme": "basic", "description": "access key : secret key"},
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "the token is ACCESS_KEY:SECRET_KEY",
    },
}

SCHEMAS: dict[str, Any] = {
    "User": {
        "type": "object",
        "properties": {
            "access_key": _STR,
            "user_type": {"type": "string", "enum": ["Super", "Normal"]},
            "enabled": {"type": "boolean"},
        },
    },
    "UserCreate": {
        "type": "object",
        "required": ["access_key", "secret_key"],
        "properties": {
            "access_key": _STR,
            "secret_key": {**_STR, "minLength": 8, "writeOnly": True},
            "user_type": {"type": "string", "enum": ["Super", "Normal"]},
            "enabled": {"type": "boolean"},
        },
    },
    "UserUpdate": {
        "type": "object",
        "properties": {
            "secret_key": {**_STR, "minLength": 8, "writeOnly": True},
            "user_type": {"type": "string", "enum": ["Super", "Normal"]},
            "enabled": {"type": "boolean"},
        },
    },
    "UserList": {
        "type": "object",
        "properties": {"users": {"type": "array", "items": _ref("User")}},
    },
    "PolicyEntry": {
        "type": "object",
        "required": ["resource", "actions"],
        "properties": {
            "resource": {**_STR, "description": "Cluster, Namespace:NS, Topic:NAME, Group:NAME"},
            "actions": {
                "type": "array",
                "items": {
                    "type": "string",
                    "enum": ["Pub", "Sub", "Create", "Update", "Delete", "Get", "List", "All"],
                },
            },
            "source_ips": _STRS,
            "decision": {"type": "string", "enum": ["Allow", "Deny"]},
        },
    },
    "Acl": {
        "type": "object",
        "properties": {
            "subject": {**_STR, "description": "User:ACCESS_KEY"},
            "policies": {"type": "array", "items": _ref("PolicyEntry")},
        },
    },
    "AclList": {"type": "object", "properties": {"acls": {"type": "array", "items": _ref("Acl")}}},
    "AclPolicies": {
        "type": "object",
        "required": ["policies"],
        "properties": {"policies": {"type": "array", "items": _ref("PolicyEntry")}},
    },
    "Deleted": {"type": "object", "properties": {"deleted": _STR}},
}


def _param(name: str, where: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": what,
        "schema": _STR,
    }


def paths() -> dict[str, Any]:
    access_key = [_param("access_key", "path", "the user's access key")]
    subject = [_param("subject", "path", "User:ACCESS_KEY")]
    return {
        "/v1/users": {
            "get": _op("Users (never their secret keys)", "listUsers", (200, _ref("UserList"), "")),
            "post": _op(
                "Create a user",
                "createUser",
                (201, _ref("User"), "created"),
                400,
                409,
                body="UserCreate",
            ),
        },
        "/v1/users/{access_key}": {
            "get": _op("A user", "getUser", (200, _ref("User"), ""), 404, params=access_key),
            "patch": _op(
                "Change a user's secret key, type or enabled flag",
                "updateUser",
                (200, _ref("User"), "updated"),
                400,
                404,
                body="UserUpdate",
                params=access_key,
            ),
            "delete": _op(
                "Delete a user and its ACL",
                "deleteUser",
                (200, _ref("Deleted"), "deleted"),
                404,
                params=access_key,
            ),
        },
        "/v1/acls": {
            "get": _op(
                "ACLs, optionally of one subject or resource",
                "listAcls",
                (200, _ref("AclList"), ""),
                params=[
                    _param("subject", "query", "only User:ACCESS_KEY's"),
                    _param("resource", "query", "only entries of this resource"),
                ],
            ),
            "post": _op(
                "Add policy entries for resources a subject has none for yet",
                "createAcl",
                (201, _ref("Acl"), "created"),
                400,
                404,
                409,
                body="Acl",
            ),
        },
        "/v1/acls/{subject}": {
            "get": _op("A subject's ACL", "getAcl", (200, _ref("Acl"), ""), 404, params=subject),
            "patch": _op(
                "Replace (or add) the entries of the resources named",
                "updateAcl",
                (200, _ref("Acl"), "updated"),
                400,
                404,
                body="AclPolicies",
                params=subject,
            ),
            "delete": _op(
                "Delete a subject's ACL, or its entry for ?resource=",
                "deleteAcl",
                (200, _ref("Deleted"), "deleted"),
                400,
                404,
                params=[*subject, _param("resource", "query", "only this resource's entry")],
            ),
        },
    }
