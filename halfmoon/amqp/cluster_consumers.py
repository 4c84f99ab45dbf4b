"""What an AMQP server asks of the cluster about a queue's consumers, when it is one of many.

In cluster mode every proxy worker process is an AMQP server of its own, with
its connections and their consumers in its memory. What depends on a queue's
consumers (the consumer count of Declare-Ok, ``queue.delete`` with
``if-unused``, exclusive consumers, ``auto-delete``, ``x-expires``) must count
every worker's, so each worker records its consumers where the others see them
(:class:`~halfmoon.cluster.coordination.amqp_consumers.EtcdClusterConsumers`)
through this interface. ``halfmoon serve`` has no such thing: its one server
counts its own consumers in memory and calls none of this.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from halfmoon.amqp.topology import Queue


class Refusal(enum.Enum):
    """Why the cluster refused a consumer."""

    EXCLUSIVE = "exclusive"  # held exclusively, or exclusive asked of a queue with consumers
    DELETING = "deleting"  # a worker is deleting the queue (auto-delete or x-expires)


class Deletion(enum.Enum):
    """Why a queue nobody asked to delete is deleted."""

    AUTO_DELETE = "auto-delete"  # its last consumer in the cluster went
    EXPIRED = "x-expires"  # unused in the whole cluster for its x-expires


class ConsumersUnknown(Exception):
    """The cluster's record of consumers could not be read or written (etcd unreachable):
    nothing that depends on it may be decided now."""


class ClusterConsumers(Protocol):
    """The consumers of every server of the cluster, and the decisions taken on them."""

    # A consumer of this server whose record was lost (its worker's lease lapsed) and could
    # not be made again (another server took the queue meanwhile): it must end.
    on_lost: Callable[[str], None]

    async def count(self, stored: str) -> int:
        """The queue's consumers on every server (raises :class:`ConsumersUnknown`)."""
        ...

    async def attach(self, consumer_id: str, queue: Queue, exclusive: bool) -> Refusal | None:
        """Record a consumer of this server, unless the cluster refuses it (raises
        :class:`ConsumersUnknown` when it cannot tell: then nothing was recorded)."""
        ...

    async def detach(self, consumer_id: str) -> None:
        """Forget one of this server's consumers (kept trying if etcd is away)."""
        ...

    def used(self, queue: Queue) -> None:
        """The queue was used here (declared, read by Basic.Get, its last consumer here
        gone): an ``x-expires`` queue's clock restarts for the whole cluster."""
        ...

    def due(self, queue: Queue) -> Deletion | None:
        """Whether the queue seems ready to go (no consumer anywhere and auto-delete, or
        unused past its x-expires), as this server last heard; a hint only."""
        ...

    async def claim_deletion(self, queue: Queue, why: Deletion) -> bool:
        """Whether this server is the one to delete the queue: true for exactly one server,
        and only while the reason holds in the cluster's record (never on a guess: an
        unreachable etcd is false)."""
        ...

    async def created(self, stored: str) -> None:
        """The queue is new here (declared, not yet saved): nothing an earlier queue of its
        name left behind may make it go."""
        ...

    async def deleted(self, stored: str) -> None:
        """The queue was deleted here: its record goes."""
        ...

    async def clear_leftovers(self, known: Callable[[str], bool]) -> None:
        """Clear what deleted queues left in the record (a deletion cut short); ``known``:
        whether a queue of that stored name exists here. Called by each housekeeping
        sweep."""
        ...
