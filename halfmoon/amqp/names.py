"""AMQP names onto halfmoon's: a vhost is a namespace, a queue is a topic and a group.

AMQP names are any UTF-8 up to 255 bytes; halfmoon's topics take letters,
digits, ``_`` and ``-`` (127 characters). A queue's topic name is its AMQP
name with every other byte (and ``-`` itself) escaped as ``-XX``, so
``task.q`` is ``task-2eq`` and distinct AMQP names never share a topic; a name
whose escape would not fit ends in a digest of the full name instead. The
consumer group that holds the queue's consumption state has the same name.
The mapping is one way: the AMQP name is kept with the queue's metadata.
"""

from __future__ import annotations

import hashlib

from halfmoon.amqp.reply_codes import (
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    AmqpChannelError,
    AmqpConnectionError,
)

DEFAULT_VHOST = "/"
MAX_NAME_BYTES = 255
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Room left for "namespace%" and for %DLQ% / %RETRY% prefixes of the group's own topics.
_MAX_STORED = 100
_DIGEST = 16


def namespace_of(vhost: str) -> str:
    """The namespace a vhost names: "" for ``/``, the vhost itself otherwise."""
    if vhost in ("", DEFAULT_VHOST):
        return ""
    name = vhost.lstrip("/")
    if not name or len(name) > 60 or not all(c.isalnum() or c in "_-" for c in name):
        raise AmqpConnectionError(
            NOT_ALLOWED,
            f"vhost {vhost!r} is not a halfmoon namespace: use '/' or 1 to 60 letters, "
            "digits, '_' or '-'",
        )
    return name


def check_name(name: str, what: str) -> str:
    if len(name.encode()) > MAX_NAME_BYTES:
        raise AmqpChannelError(PRECONDITION_FAILED, f"{what} name is longer than 255 bytes")
    return name


def stored_name(namespace: str, amqp_name: str) -> str:
    """The topic (and group) name of AMQP queue ``amqp_name`` in ``namespace``."""
    escaped = "".join(chr(b) if b in _PLAIN else f"-{b:02x}" for b in amqp_name.encode())
    if len(escaped) > _MAX_STORED - (len(namespace) + 1 if namespace else 0):
        digest = hashlib.sha256(amqp_name.encode()).hexdigest()[:_DIGEST]
        keep = _MAX_STORED - _DIGEST - 2 - (len(namespace) + 1 if namespace else 0)
        escaped = escaped[:keep] + "--" + digest
    return f"{namespace}%{escaped}" if namespace else escaped
