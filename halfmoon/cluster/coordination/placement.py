"""Where a topic's queues live: the placement rule and the record stored in etcd.

A topic of N queues gets queue ids 0..N-1 across the cluster. Each queue lives
on one broker, where it is that broker's queue ``broker_queue`` of the topic
(0, 1, ... in the order of the cluster-wide ids), so a broker's own store
keeps dense queue ids, as a RocketMQ broker's does.

- **Spread** (no broker list): round-robin over every live broker in name
  order, starting at a broker chosen by the topic name's CRC-32, so that the
  queue 0 of many small topics does not pile up on the first broker.
- **Pinned** (``--brokers a,b``): round-robin over the named brokers in the
  order given, starting with the first; each must be live when the topic is
  created.

Placement is decided once, at creation, and stored: a broker that joins later
takes queues of topics created after it, and existing queues do not move
(moving queues means moving their data; that is an explicit operation).

Changing the queue count (:func:`grow_queues`) keeps every existing queue where
it is: growing places the new ids round-robin over the live brokers, each
taking the next id of its own store; shrinking only lowers ``write_queues``,
so the queues above it stay readable (read-only) until they are drained, as a
local topic's removed queues do.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from halfmoon.cluster.errors import NoLiveBrokers


@dataclass(frozen=True)
class QueueAssignment:
    queue_id: int  # the cluster-wide id clients see
    broker: str
    broker_queue: int  # the queue's id in that broker's store


def place_queues(
    topic: str, queue_count: int, live_brokers: Collection[str], pinned: Sequence[str] = ()
) -> tuple[QueueAssignment, ...]:
    if pinned:
        candidates = list(dict.fromkeys(pinned))  # keeps the order given, drops repeats
        missing = [b for b in candidates if b not in live_brokers]
        if missing:
            raise NoLiveBrokers(
                f"cannot pin topic {topic!r} to {', '.join(missing)}: no such live broker "
                f"(live: {', '.join(sorted(live_brokers)) or 'none'})"
            )
        start = 0
    else:
        candidates = sorted(live_brokers)
        if not candidates:
            raise NoLiveBrokers(f"cannot place topic {topic!r}: no broker is registered")
        start = zlib.crc32(topic.encode()) % len(candidates)
    per_broker: dict[str, int] = {}
    queues = []
    for queue_id in range(queue_count):
        broker = candidates[(start + queue_id) % len(candidates)]
        queues.append(QueueAssignment(queue_id, broker, per_broker.get(broker, 0)))
        per_broker[broker] = per_broker.get(broker, 0) + 1
    return tuple(queues)


@dataclass(frozen=True)
class ClusterTopic:
    name: str
    queues: tuple[QueueAssignment, ...]
    message_type: str = "normal"
    perm: str = "rw"
    created_ms: int = 0
    trace: bool = True  # its brokers record its messages' trace (halfmoon/broker/trace.py)
    # Queues 0..write_queues-1 take sends; those above are read-only until drained.
    write_queues: int | None = None  # None: every queue

    @property
    def writable(self) -> int:
        return len(self.queues) if self.write_queues is None else self.write_queues

    @property
    def brokers(self) -> list[str]:
        return sorted({q.broker for q in self.queues})

    def queues_on(self, broker: str) -> list[QueueAssignment]:
        return [q for q in self.queues if q.broker == broker]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "message_type": self.message_type,
            "perm": self.perm,
            "created_ms": self.created_ms,
            "trace": self.trace,
            **({} if self.write_queues is None else {"write_queues": self.write_queues}),
            "queues": [
                {"queue_id": q.queue_id, "broker": q.broker, "broker_queue": q.broker_queue}
                for q in self.queues
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterTopic:
        try:
            return cls(
                name=str(data["name"]),
                queues=tuple(
                    QueueAssignment(int(q["queue_id"]), str(q["broker"]), int(q["broker_queue"]))
                    for q in data["queues"]
                ),
                message_type=str(data.get("message_type", "normal")),
                perm=str(data.get("perm", "rw")),
                created_ms=int(data.get("created_ms", 0)),
                trace=bool(data.get("trace", True)),
                write_queues=(
                    int(data["write_queues"]) if data.get("write_queues") is not None else None
                ),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"unreadable topic record {data!r}: {error}") from None


def grow_queues(
    topic: ClusterTopic, queue_count: int, live_brokers: Collection[str]
) -> ClusterTopic:
    """``topic`` with ``queue_count`` writable queues.

    Up to the queues it already has (read-only ones included), only the writable
    count changes. Beyond them, the new ids go round-robin over the live brokers in
    name order (brokers that joined since creation included), each taking its own
    store's next queue id."""
    if queue_count <= len(topic.queues):
        write = None if queue_count == len(topic.queues) else queue_count
        return replace(topic, write_queues=write)
    candidates = sorted(live_brokers)
    if not candidates:
        raise NoLiveBrokers(f"cannot place new queues of topic {topic.name!r}: no live broker")
    per_broker: dict[str, int] = {}
    for q in topic.queues:
        per_broker[q.broker] = max(per_broker.get(q.broker, 0), q.broker_queue + 1)
    start = zlib.crc32(topic.name.encode()) % len(candidates)
    queues = list(topic.queues)
    for queue_id in range(len(topic.queues), queue_count):
        broker = candidates[(start + queue_id) % len(candidates)]
        queues.append(QueueAssignment(queue_id, broker, per_broker.get(broker, 0)))
        per_broker[broker] = per_broker.get(broker, 0) + 1
    return replace(topic, queues=tuple(queues), write_queues=None)
