"""Reads served by a broker group's replicas (RocketMQ's ``slaveReadEnable``).

With ``--replica-reads`` a group's replicas answer pulls and bulk reads (the
Spark source, ``PullConsumer``) from their own store; pops, acks and offset
commits always go to the master. The service, ``halfmoon.internal.v1.ReplicaRead``
on the replica's port, has one unary method, ``Read``: a request is the
internal wire's encoding (``wire``) of ``[operation, args]`` with operation
``pull`` or ``bulk_read`` and the arguments of the broker methods of those
names; the answer is an encoded :class:`~halfmoon.broker.facade.PullResult`.

The guarantee (Kafka's high watermark): a replica may hold records the group
has not acknowledged (its master wrote and shipped them, then died before
enough replicas had them; the next master may lack them, and the replica
will cut them). A replica therefore reads each queue only up to the group's
committed point, the end every in-sync replica holds, which the master sends
with every message of the replication stream (``committed``); a queue's
``max_offset`` is where its first record past that point lies. A replica
that has not been told a committed point (just restarted) serves nothing
new. The committed point the replica knows may be behind the master's: a
read from a replica may be stale, never ahead.

Refusals (``REPLICA_READ_REFUSED``: the setting is off, the member is the
master now, or the group's topic checks are needed) and every other error
send the proxy to the master (:class:`ReplicaReads`). A replica has no topic
or group table: it reads the queue it is asked for; the proxy checked the
topic's queues against the cluster's placement before asking.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from halfmoon.broker.errors import IllegalOffset
from halfmoon.broker.facade import PullResult
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.message import MessageView
from halfmoon.broker.pull import MAX_BULK_BYTES, MAX_BULK_MESSAGES, MAX_PULL_BATCH
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.errors import Conflict, HalfmoonError, InvalidArgument
from halfmoon.metrics import default_registry
from halfmoon.store.api import GetStatus
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.cluster.internal.replica_reads")

SERVICE = "halfmoon.internal.v1.ReplicaRead"
READ = f"/{SERVICE}/Read"
READ_TIMEOUT_S = 5.0
PULL_MAX_BYTES = 4 * 1024 * 1024  # what a pull answers at most, as on the master
# How long a read finding only records past the committed point waits for it to move.
COMMIT_WAIT_S = 0.5
MAX_WAIT_S = 2.0  # the most a proxy may ask a replica to wait


# On the proxy's /metrics: reads of groups with replica reads on, by who answered them
# ("replica", or "master" after a replica's error).
READS = default_registry().counter(
    "halfmoon_replication_replica_reads_total",
    "Pulls and bulk reads of groups with replica reads on, by who answered (replica, or "
    "master after a replica's error)",
    ("group", "answered_by"),
)


class ReplicaReadRefused(Conflict):
    """This member does not serve reads now (the setting is off, or it is the master)."""

    code = "REPLICA_READ_REFUSED"
    protocol_code = "PRECONDITION_FAILED"


def read_committed(
    store: MessageStore,
    committed: int,
    filters: FilterCache,
    topic: str,
    queue_id: int,
    offset: int,
    max_messages: int,
    max_bytes: int,
    filter: FilterSpec,
    end_offset: int | None = None,
) -> PullResult:
    """A queue's messages from ``offset``, never any whose record ends past commit-log
    offset ``committed``, nor at or past queue offset ``end_offset``."""
    if offset < 0:
        raise IllegalOffset(f"offset must be >= 0, got {offset}")
    if end_offset is not None:
        if end_offset < offset:
            raise IllegalOffset(
                f"end_offset {end_offset} is before offset {offset}; ask for [offset, end)"
            )
        max_messages = min(max_messages, max(end_offset - offset, 1))
    compiled = filters.get(filter)
    got = store.get(
        topic, queue_id, offset, max_messages, max_bytes,
        tag_hashes=compiled.tag_hashes, predicate=compiled.predicate, below=committed,
    )  # fmt: skip
    status = got.status
    if status is GetStatus.NO_SUCH_QUEUE:  # a queue that has no data here yet
        status = GetStatus.NO_MESSAGE if offset == 0 else GetStatus.OFFSET_OVERFLOW
    views = [MessageView.of(m) for m in got.messages]
    next_offset = got.next_offset
    if end_offset is not None:
        if end_offset == offset:
            views, next_offset, status = [], offset, GetStatus.NO_MESSAGE
        elif next_offset > end_offset:
            views = [v for v in views if v.queue_offset < end_offset]
            next_offset = end_offset
            if not views and status is GetStatus.FOUND:
                status = GetStatus.NO_MATCHED_MESSAGE
    return PullResult(status, views, next_offset, got.min_offset, got.max_offset)


class ReplicaReadService:
    """The replica's side: ``committed()`` is the group's committed point as this member
    knows it, or None when it serves no reads (the setting off, or it is the master)."""

    def __init__(
        self,
        store: MessageStore,
        committed: Callable[[], int | None],
        await_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        self._store = store
        self._committed = committed
        # (point, timeout): wait until the committed point passes ``point``.
        self._await_commit = await_commit
        self._filters = FilterCache()
        self._lock = threading.Lock()
        self.served = 0  # reads answered (a replica's Status shows it)

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {"Read": grpc.unary_unary_rpc_method_handler(self._read)}
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    def read(self, operation: str, args: list[Any], wait_s: float = 0.0) -> PullResult:
        """The read; finding nothing, it waits up to ``wait_s`` (``COMMIT_WAIT_S`` when this
        log holds records past the committed point) for the point to move and reads again.
        A read long-polled on the master's arrival notice comes before the replica hears
        that the group acknowledged the record: waiting a moment spares the caller the
        rest of its poll."""
        committed = self._committed()
        if committed is None:
            raise ReplicaReadRefused("this member serves no reads (replica reads off, or master)")
        result = self._read_below(committed, operation, args)
        topic, queue_id = args[1], args[2]
        if not result.messages and self._store.max_offset(topic, queue_id) > result.max_offset:
            wait_s = max(wait_s, COMMIT_WAIT_S)
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        while not result.messages and self._await_commit is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._await_commit(committed, remaining)
            moved = self._committed()
            if moved is None or moved <= committed:
                break  # the deadline passed, or this member stopped serving reads
            committed = moved
            result = self._read_below(committed, operation, args)
        with self._lock:
            self.served += 1
        return result

    def _read_below(self, committed: int, operation: str, args: list[Any]) -> PullResult:
        if operation == "pull":
            _group, topic, queue_id, offset, batch_size, spec = args
            if not 1 <= batch_size <= MAX_PULL_BATCH:
                raise InvalidArgument(f"batch size must be 1 to {MAX_PULL_BATCH}, got {batch_size}")
            result = read_committed(
                self._store, committed, self._filters, topic, queue_id, offset, batch_size,
                PULL_MAX_BYTES, spec,
            )  # fmt: skip
        elif operation == "bulk_read":
            _group, topic, queue_id, offset, max_messages, max_bytes, spec, end_offset = args
            if not 1 <= max_messages <= MAX_BULK_MESSAGES or not 1 <= max_bytes <= MAX_BULK_BYTES:
                raise InvalidArgument("bulk read bounds out of range")
            result = read_committed(
                self._store, committed, self._filters, topic, queue_id, offset, max_messages,
                max_bytes, spec, end_offset,
            )  # fmt: skip
        else:
            raise InvalidArgument(f"replicas serve pull and bulk_read, not {operation!r}")
        return result

    def _read(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            operation, args, wait_ms = wire.decode(request)
            if (
                not isinstance(operation, str)
                or not isinstance(args, list)
                or not isinstance(wait_ms, int)
            ):
                raise InvalidArgument("a replica read is [operation, args, wait_ms]")
            return wire.encode(self.read(operation, args, wait_ms / 1000))
        except HalfmoonError as error:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{error.code}: {error.message}")
        except (TypeError, ValueError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"MALFORMED_REQUEST: {error}")
        raise AssertionError("unreachable: abort raises")


class ReplicaReads:
    """The proxy's side: which replica of a group serves a read, and the call to it.

    A group's replicas are the in-sync set it publishes in etcd (``broker-groups/<g>/isr``,
    with the ``replica_reads`` setting) and their member records' endpoints, both from
    the proxy's watched view; reads are spread round-robin over them.
    """

    def __init__(
        self,
        group_keys: Callable[[], dict[str, dict[str, Any]]],
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self._group_keys = group_keys
        self._tls = tls  # "<group>/isr", "<group>/members/<m>" → record
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def replicas(self, group: str) -> list[str]:
        """Endpoints of the group's in-sync replicas when it enables replica reads."""
        keys = self._group_keys()
        isr = keys.get(f"{group}/isr")
        if not isr or not isr.get("replica_reads"):
            return []
        endpoints = []
        for member in isr.get("isr") or []:
            record = keys.get(f"{group}/members/{member}")
            if record and member != isr.get("master") and record.get("endpoint"):
                endpoints.append(str(record["endpoint"]))
        return endpoints

    def pick(self, group: str) -> str | None:
        endpoints = self.replicas(group)
        if not endpoints:
            return None
        return endpoints[next(self._turn) % len(endpoints)]

    def read(
        self, endpoint: str, operation: str, args: list[Any], wait_s: float = 0.0
    ) -> PullResult:
        with self._lock:
            channel = self._channels.get(endpoint)
            if channel is None:
                channel = self._tls.channel(
                    endpoint,
                    [
                        ("grpc.max_receive_message_length", 2 * MAX_BULK_BYTES),
                        ("grpc.max_send_message_length", 2 * MAX_BULK_BYTES),
                    ],
                )
                self._channels[endpoint] = channel
        call = channel.unary_unary(READ)
        request = wire.encode([operation, args, int(wait_s * 1000)])
        answer = wire.decode(call(request, timeout=READ_TIMEOUT_S + wait_s))
        if not isinstance(answer, PullResult):
            raise TypeError(f"a replica answered {type(answer).__name__}, not a PullResult")
        return answer

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
