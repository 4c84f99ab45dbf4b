"""How a proxy names things that live on one broker of many: queues, receipt handles, ids.

- **Queues.** A topic placed in etcd has cluster-wide queue ids 0..N-1; queue
  ``q`` is queue ``broker_queue`` of the topic on broker ``broker``
  (:mod:`halfmoon.cluster.coordination.placement`). Each broker's store holds the topic with
  exactly its share of queues, numbered densely from 0, so a broker knows
  nothing of the cluster's numbering and the proxy translates both ways.
- **Topics the cluster did not place** (a group's ``%DLQ%`` topic, which a
  broker creates by itself when a message runs out of attempts): their queues
  are the brokers' queues laid end to end in broker name order.
- **Handles.** A receipt handle, recall handle or transaction id handed to a
  client is the broker's own, prefixed with the broker's name and ``:``
  (broker names cannot contain ``:``), so whichever proxy the client's next
  call reaches knows which broker to ask.
"""

from __future__ import annotations

from collections.abc import Sequence

from halfmoon.cluster.coordination.placement import QueueAssignment
from halfmoon.errors import InvalidArgument

SEPARATOR = ":"


class UnroutableHandle(InvalidArgument):
    """A receipt handle, recall handle or transaction id that names no broker of the cluster."""

    code = "UNROUTABLE_HANDLE"
    protocol_code = "BAD_REQUEST"


def qualify(broker: str, handle: str) -> str:
    return f"{broker}{SEPARATOR}{handle}"


def unqualify(handle: str, what: str = "handle") -> tuple[str, str]:
    """(broker, the broker's own handle); UnroutableHandle when no broker is named."""
    broker, separator, own = handle.partition(SEPARATOR)
    if not separator or not broker or not own:
        raise UnroutableHandle(f"{what} {handle[:64]!r} does not name a broker of this cluster")
    return broker, own


class Layout:
    """One topic's queues: cluster queue id <-> (broker, the broker's queue id)."""

    def __init__(
        self, topic: str, queues: Sequence[QueueAssignment], writable: int | None = None
    ) -> None:
        self.topic = topic
        self.queues = tuple(queues)
        # Cluster queue ids below this take sends; the rest are read-only until drained.
        self.writable = len(self.queues) if writable is None else writable
        self._by_id = {q.queue_id: q for q in self.queues}
        self._by_broker = {(q.broker, q.broker_queue): q.queue_id for q in self.queues}

    @classmethod
    def end_to_end(cls, topic: str, counts: Sequence[tuple[str, int]]) -> Layout:
        """The layout of a topic the cluster did not place: ``counts`` in broker name order."""
        queues: list[QueueAssignment] = []
        for broker, count in sorted(counts):
            for broker_queue in range(count):
                queues.append(QueueAssignment(len(queues), broker, broker_queue))
        return cls(topic, queues)

    @property
    def brokers(self) -> list[str]:
        return list(dict.fromkeys(q.broker for q in self.queues))

    def locate(self, queue_id: int) -> QueueAssignment | None:
        return self._by_id.get(queue_id)

    def cluster_queue(self, broker: str, broker_queue: int) -> int:
        """The cluster id of a broker's queue (the broker's id when the layout lacks it:
        a queue added on the broker by hand stays addressable rather than misnamed)."""
        return self._by_broker.get((broker, broker_queue), broker_queue)

    def on(self, broker: str) -> list[QueueAssignment]:
        return [q for q in self.queues if q.broker == broker]
