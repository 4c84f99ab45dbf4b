"""The errors of authentication and authorization, each with its stable code.

``Unauthenticated`` (no, malformed or wrong credentials) and ``Forbidden``
(known user, missing permission) are kept apart as RocketMQ's proxy keeps
them (``UNAUTHORIZED`` vs ``FORBIDDEN``). Neither message ever carries a
secret or a signature; ``Forbidden`` names the missing permission and
nothing about whether the resource exists.
"""

from __future__ import annotations

from halfmoon.errors import EXIT_USAGE, Conflict, HalfmoonError, InvalidArgument, NotFound


class Unauthenticated(HalfmoonError):
    """The request carries no credentials, malformed ones, or ones that do not verify."""

    code = "UNAUTHORIZED"
    http_status = 401


class Forbidden(HalfmoonError):
    """The user is known but lacks the permission the request needs."""

    code = "FORBIDDEN"
    http_status = 403


class UserNotFound(NotFound):
    code = "USER_NOT_FOUND"
    protocol_code = "NOT_FOUND"


class UserExists(Conflict):
    code = "USER_EXISTS"
    protocol_code = "PRECONDITION_FAILED"


class LastSuperUser(Conflict):
    """Deleting, disabling or demoting the last enabled super user would leave nobody able
    to manage users and ACLs."""

    code = "LAST_SUPER_USER"
    protocol_code = "PRECONDITION_FAILED"


class AclNotFound(NotFound):
    code = "ACL_NOT_FOUND"
    protocol_code = "NOT_FOUND"


class AclExists(Conflict):
    code = "ACL_EXISTS"
    protocol_code = "PRECONDITION_FAILED"


class IllegalPolicy(InvalidArgument):
    """A user or policy document that does not follow the model (bad resource, action, IP)."""

    code = "ILLEGAL_POLICY"
    protocol_code = "BAD_REQUEST"


class InsecureListen(InvalidArgument):
    """``serve`` was asked to listen beyond loopback with authentication off."""

    code = "INSECURE_LISTEN"
    protocol_code = "BAD_REQUEST"
    exit_code = EXIT_USAGE


class AuthStoreCorrupt(HalfmoonError):
    """The users file does not decrypt with the configured key, or does not parse."""

    code = "AUTH_STORE_CORRUPT"
    protocol_code = "INTERNAL_ERROR"
    http_status = 500
