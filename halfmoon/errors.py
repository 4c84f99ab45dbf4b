"""halfmoon's errors: one base class, a stable code, a sentence a user can act on.

Every error a user can cause is a subclass of :class:`HalfmoonError`. The
``code`` is stable across releases (scripts and the wire protocol depend on
it); the message is for people.

Each class also says how every front end reports it, next to its code:

- ``protocol_code``: the name of the RocketMQ protocol ``Code`` the gRPC
  servicer answers with (``halfmoon.server.errors`` turns the name into the
  number; nothing below the server package imports gRPC). A class that sets
  its own ``code`` and no ``protocol_code`` answers with its code, so a code
  that is not a protocol Code name must name one explicitly;
- ``http_status``: the admin API's HTTP status;
- ``exit_code``: the ``halfmoon`` command's exit status (1 failed, 2 usage, 3 the data
  directory is held by another live process).

The last two follow the error's kind and are inherited from the kinds below
(bad request 400, not found 404, conflict 409, storage fault 500). A test
walks every subclass and fails on one whose protocol Code does not exist.
"""

from __future__ import annotations

EXIT_FAILED = 1  # the operation failed
EXIT_USAGE = 2  # the command line (or its configuration) was wrong
EXIT_IN_USE = 3  # another live process holds what the command needs (its data directory)


class HalfmoonError(Exception):
    """Base of every error halfmoon raises on purpose."""

    code: str = "INTERNAL_ERROR"
    protocol_code: str = "INTERNAL_ERROR"
    http_status: int = 500
    exit_code: int = EXIT_FAILED

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A new code does not inherit its parent's protocol Code: it answers with itself
        # unless the class names another (the test checks that the name exists).
        if "code" in cls.__dict__ and "protocol_code" not in cls.__dict__:
            cls.protocol_code = cls.code

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}: {self.message})"


class InvalidArgument(HalfmoonError):
    """The caller sent something halfmoon refuses (bad name, oversize body, ...)."""

    code = "BAD_REQUEST"
    http_status = 400


class NotFound(HalfmoonError):
    code = "NOT_FOUND"
    http_status = 404


class Conflict(HalfmoonError):
    """The request contradicts the current state (e.g. ending a transaction both ways)."""

    code = "PRECONDITION_FAILED"
    http_status = 409


class Unavailable(HalfmoonError):
    """What the call needs cannot be reached now (a broker process down or restarting): the
    same call may succeed later."""


class StorageError(HalfmoonError):
    """Stored data is unreadable or the disk refused a write: the server's fault, not the
    caller's."""

    code = "STORAGE_ERROR"
    protocol_code = "INTERNAL_ERROR"
    http_status = 500


class CorruptionError(StorageError):
    code = "STORAGE_CORRUPTED"
    protocol_code = "INTERNAL_ERROR"
