"""The BulkRead wire format, version 1: one msgpack map per request and per answer.

grpc carries the bytes as they are (method ``/halfmoon.v1.BulkRead/Read``,
unary; no protobuf), with the same metadata as MessagingService calls
(client id, namespace header, signature). The grammar, with a worked
example, is in docs/bulk-read.md; this module is its one implementation.

An answer is *columnar*: one list per field, ``count`` long, so a reader
builds Arrow arrays (or anything else) column by column, and the server
packs a whole batch with one msgpack call instead of one protobuf message
per record. Errors travel in the answer (``code``, ``error``, ``message``),
as the RocketMQ protocol's Status does, never as a bare transport error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack  # type: ignore[import-untyped]

SERVICE = "halfmoon.v1.BulkRead"
METHOD = f"/{SERVICE}/Read"
FORMAT_VERSION = 1

DEFAULT_MAX_MESSAGES = 1024
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
MAX_WAIT_MS = 60_000  # the server caps a long poll lower still (long_polling_max)
FILTER_KINDS = ("TAG", "SQL92")

# The answer's columns, in the order docs/bulk-read.md lists them. Timestamps are
# milliseconds since the epoch; absent values are nil.
COLUMNS = (
    "topic",  # str: the topic as the reader named it (namespace stripped)
    "queue_offset",  # int
    "message_id",  # str
    "tag",  # str | nil
    "keys",  # [str]
    "properties",  # {str: str}: the producer's properties only
    "body",  # bin
    "born_timestamp",  # int (ms)
    "store_timestamp",  # int (ms)
    "born_host",  # str
    "message_type",  # "NORMAL" | "FIFO" | "DELAY" | "TRANSACTION" | "PRIORITY" | "LITE"
    "message_group",  # str | nil
    "delivery_timestamp",  # int (ms) | nil
    "transaction_id",  # str | nil: a committed transactional message's transaction id
)


class FormatError(ValueError):
    """Bytes that are not a BulkRead request or answer of this version (a sentence why)."""


@dataclass(frozen=True)
class BulkRequest:
    """Read ``[offset, end_offset)`` of one queue, at most ``max_messages`` and about
    ``max_bytes`` per answer (always at least one message when there is one)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    end_offset: int | None = None
    max_messages: int = DEFAULT_MAX_MESSAGES
    max_bytes: int = DEFAULT_MAX_BYTES
    filter_kind: str = "TAG"
    filter_expression: str = "*"
    wait_ms: int = 0  # long poll: wait this long for a message when there is none yet
    namespace: str = ""

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "group": self.group,
            "topic": self.topic,
            "queue_id": self.queue_id,
            "offset": self.offset,
            "max_messages": self.max_messages,
            "max_bytes": self.max_bytes,
        }
        if self.end_offset is not None:
            body["end_offset"] = self.end_offset
        if (self.filter_kind, self.filter_expression.strip()) != ("TAG", "*"):
            body["filter"] = [self.filter_kind, self.filter_expression]
        if self.wait_ms:
            body["wait_ms"] = self.wait_ms
        if self.namespace:
            body["namespace"] = self.namespace
        return msgpack.packb(body, use_bin_type=True)

    @classmethod
    def decode(cls, raw: bytes) -> BulkRequest:
        """The request ``raw`` encodes; FormatError naming the first thing wrong."""
        body = _unpack(raw, "request")
        version = body.get("v")
        if version != FORMAT_VERSION:
            raise FormatError(
                f"BulkRead format version {version!r} is not supported; this server speaks "
                f"version {FORMAT_VERSION}"
            )
        unknown = set(body) - _REQUEST_KEYS
        if unknown:
            raise FormatError(f"unknown request fields {sorted(unknown)}; see docs/bulk-read.md")
        kind, expression = "TAG", "*"
        if body.get("filter") is not None:
            spec = body["filter"]
            if (
                not isinstance(spec, list)
                or len(spec) != 2
                or spec[0] not in FILTER_KINDS
                or not isinstance(spec[1], str)
            ):
                raise FormatError(
                    f'filter must be ["TAG", expression] or ["SQL92", expression], got {spec!r}'
                )
            kind, expression = spec
        end = body.get("end_offset")
        return cls(
            group=_field(body, "group", str),
            topic=_field(body, "topic", str),
            queue_id=_field(body, "queue_id", int),
            offset=_field(body, "offset", int),
            end_offset=None if end is None else _field(body, "end_offset", int),
            max_messages=_field(body, "max_messages", int, DEFAULT_MAX_MESSAGES),
            max_bytes=_field(body, "max_bytes", int, DEFAULT_MAX_BYTES),
            filter_kind=kind,
            filter_expression=expression,
            wait_ms=min(max(_field(body, "wait_ms", int, 0), 0), MAX_WAIT_MS),
            namespace=_field(body, "namespace", str, ""),
        )


_REQUEST_KEYS = frozenset(
    {
        "v",
        "group",
        "topic",
        "queue_id",
        "offset",
        "end_offset",
        "max_messages",
        "max_bytes",
        "filter",
        "wait_ms",
        "namespace",
    }
)


@dataclass
class BulkAnswer:
    """One answer: a status, where to read next, the queue's bounds, and the messages as
    columns (``columns[name][i]`` is message ``i``'s field; empty when ``count`` is 0).

    ``code`` is the RocketMQ protocol's Code number (20000 OK; 40012 ILLEGAL_OFFSET for
    an offset outside the queue; the Status codes of MessagingService otherwise).
    ``status`` says what the read found (``FOUND``, ``NO_MESSAGE``,
    ``NO_MATCHED_MESSAGE``, ``OFFSET_TOO_SMALL``, ``OFFSET_OVERFLOW``) or, on an error,
    halfmoon's stable error code (``TOPIC_NOT_FOUND``, ``FORBIDDEN``, ``BAD_REQUEST``...).
    """

    code: int
    status: str
    message: str = ""
    queue_id: int = 0
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    count: int = 0
    columns: dict[str, list[Any]] = field(default_factory=dict)

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "v": FORMAT_VERSION,
                "code": self.code,
                "status": self.status,
                "message": self.message,
                "queue_id": self.queue_id,
                "next_offset": self.next_offset,
                "min_offset": self.min_offset,
                "max_offset": self.max_offset,
                "count": self.count,
                "columns": self.columns,
            },
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, raw: bytes) -> BulkAnswer:
        body = _unpack(raw, "answer")
        if body.get("v") != FORMAT_VERSION:
            raise FormatError(
                f"BulkRead answer of format version {body.get('v')!r}; this reader speaks "
                f"version {FORMAT_VERSION}"
            )
        count = _field(body, "count", int, 0)
        columns = body.get("columns") or {}
        if count and (
            not isinstance(columns, dict)
            or any(len(columns.get(name) or ()) != count for name in COLUMNS)
        ):
            raise FormatError(f"a BulkRead answer of {count} messages lacks complete columns")
        return cls(
            code=_field(body, "code", int),
            status=_field(body, "status", str),
            message=_field(body, "message", str, ""),
            queue_id=_field(body, "queue_id", int, 0),
            next_offset=_field(body, "next_offset", int, 0),
            min_offset=_field(body, "min_offset", int, 0),
            max_offset=_field(body, "max_offset", int, 0),
            count=count,
            columns=columns if count else {},
        )


def _unpack(raw: bytes, what: str) -> dict[str, Any]:
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FormatError(f"the BulkRead {what} is not valid msgpack: {exc}") from None
    if not isinstance(body, dict):
        raise FormatError(f"a BulkRead {what} is a msgpack map, got {type(body).__name__}")
    return body


def _field(body: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    value = body.get(name, default)
    if value is ...:
        raise FormatError(f"{name} is missing")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise FormatError(f"{name} must be {kind.__name__}, got {value!r}")
    return value
