"""The replication protocol: gRPC service ``halfmoon.replication.v1.Replication``.

Its own service beside the broker's internal protocol (``halfmoon.internal.v1``),
on the same port, with plain msgpack maps as bodies (bytes stay bytes; nothing
but maps, lists, strings, numbers and bytes is decoded).

``Stream`` (bidirectional), opened by a replica:

- replica → master, first: ``{"hello": {"group", "replica", "epoch", "from",
  "window", "segment_size"}}``: who it is, the newest epoch it knows, its log's
  end (where shipping starts), and how many bytes may be unacknowledged;
- master → replica, first: ``{"welcome": {"epoch", "epochs", "from"}}``: the
  master's epoch, its epoch table (``[[epoch, start], ...]``), and where it
  ships from; or the stream ends with an error (below);
- master → replica, then: ``{"epoch", "at", "data", "end", "committed"}``: ``data``
  is the log's bytes at offset ``at`` (a whole number of records, see
  ``halfmoon.store.shipping``), ``end`` the master's visible end (so the
  replica knows its lag), ``committed`` the group's committed point (the end
  every in-sync replica holds; under sync not past the last acknowledged
  write), below which a replica serves reads; ``data`` is empty in a
  heartbeat, sent also as soon as the committed point moves;
- replica → master, then: ``{"epoch", "acked"}``: everything below ``acked``
  is durable on the replica (under its own flush policy). Sent after each
  chunk and at least every ``HEARTBEAT_S`` as a heartbeat.

Flow control: the master keeps at most ``window`` bytes shipped and not
acknowledged, in chunks of at most ``MAX_CHUNK_BYTES``.

Fencing: every message carries the sender's epoch. A master refuses a replica
that knows a newer epoch than its own (the master has been replaced); a
replica refuses anything from an epoch older than the newest it knows.
Errors end the stream with a gRPC status whose details start with the stable
code (``REPLICATION_EPOCH_STALE``, ``REPLICATION_REFUSED``).

``EpochEnd`` (unary), asked by a member before it streams, to find where its
log and the master's part (``epochs``): ``{"group", "replica", "epoch"}`` → ``{"epoch",
"answered", "end"}``: the master's epoch, the newest epoch of its table not
newer than the one asked about, and the offset where that epoch's part of the
master's log ends (``end`` -1: the master knows no epoch that old). Kafka's
OffsetsForLeaderEpoch.

``Status`` (unary, ``{"queues": [[topic, queue_id], ...]}``, the list optional):
the member's role, epoch, log end, master and, on a master, its replicas'
progress and the in-sync set; ``max_offsets`` answers the queues asked about
(what this member's own consume queues hold). ``{"check_appointment": true}``
makes a replica ask etcd at once whether a controller appointed it (instead of
at its follower's next check).

``Handover`` (unary, ``{"epoch", "to", "timeout_ms", "hold_ms"}``, sent by a
controller to the master for a planned switchover): the master fences its
store (no write is taken), waits until replica ``to`` holds its whole log and
answers ``{"end_offset", "epoch", "fenced_ms"}``; the controller then appoints
``to``. The master stays fenced until etcd names another master (it steps down
and rejoins as a replica) or ``hold_ms`` passes (it takes writes again if etcd
still names it). Not caught up within ``timeout_ms``: ``SWITCHOVER_TIMEOUT``
and the master takes writes again at once.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped]

from halfmoon.errors import Conflict, HalfmoonError

SERVICE = "halfmoon.replication.v1.Replication"
STREAM = f"/{SERVICE}/Stream"
STATUS = f"/{SERVICE}/Status"
EPOCH_END = f"/{SERVICE}/EpochEnd"
HANDOVER = f"/{SERVICE}/Handover"
MAX_CHUNK_BYTES = 1024 * 1024
DEFAULT_WINDOW_BYTES = 8 * 1024 * 1024
HEARTBEAT_S = 0.2  # a replica's ack heartbeat; also how often an idle master says it lives
MAX_MESSAGE_BYTES = 2 * MAX_CHUNK_BYTES


class StaleEpoch(Conflict):
    """A replication peer speaks for an older epoch than one already seen: it was replaced."""

    code = "REPLICATION_EPOCH_STALE"
    protocol_code = "PRECONDITION_FAILED"


class ReplicationRefused(Conflict):
    """The master cannot serve this replica (another group, another segment size, a log
    ahead of the master's that was not cut back, a log below the master's retained one)."""

    code = "REPLICATION_REFUSED"
    protocol_code = "PRECONDITION_FAILED"


class MalformedReplication(HalfmoonError):
    code = "MALFORMED_REQUEST"
    protocol_code = "BAD_REQUEST"


def encode(value: dict[str, Any]) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def decode(raw: bytes) -> dict[str, Any]:
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any undecodable body
        raise MalformedReplication(f"undecodable replication message: {exc}") from None
    if not isinstance(value, dict):
        raise MalformedReplication("a replication message is a map")
    return value


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``message[name]``, checked to be of ``kind``."""
    value = message.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise MalformedReplication(f"replication message field {name!r} is missing or mistyped")
    return value
