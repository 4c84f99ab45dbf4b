"""halfmoon's errors: one base class, a stable code, a sentence a user can act on.

Every error a user can cause is a subclass of :class:`HalfmoonError`. The
``code`` is stable across releases (scripts and the wire protocol depend on
it); the message is for people. The gRPC servicer translates codes into the
protocol's ``Code`` values; nothing below the server package knows gRPC.
"""

from __future__ import annotations


class HalfmoonError(Exception):
    """Base of every error halfmoon raises on purpose."""

    code: str = "INTERNAL_ERROR"

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


class NotFound(HalfmoonError):
    code = "NOT_FOUND"


class Conflict(HalfmoonError):
    """The request contradicts the current state (e.g. ending a transaction both ways)."""

    code = "PRECONDITION_FAILED"


class StorageError(HalfmoonError):
    """Stored data is unreadable or the disk refused a write."""

    code = "STORAGE_ERROR"


class CorruptionError(StorageError):
    code = "STORAGE_CORRUPTED"
