"""Queue allocation for a group of pull consumers: who reads which queue.

Every member computes the same answer from the same inputs (all queues,
all member ids, both sorted), so no coordinator is needed: each takes its
own share. ``average`` gives member *i* a contiguous block, the first
``len(queues) % len(members)`` members one extra (RocketMQ's
AllocateMessageQueueAveragely). ``consistent_hash`` places members on a hash
ring with virtual nodes; a queue goes to the first member clockwise from its
hash, so a member joining or leaving moves only about 1/n of the queues
(RocketMQ's AllocateMessageQueueConsistentHash).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence

AllocationStrategy = Callable[[Sequence[str], Sequence[str], str], list[str]]


def allocate_average(queues: Sequence[str], members: Sequence[str], me: str) -> list[str]:
    """Queues for ``me``: a contiguous, near-equal block of the sorted queues."""
    members = sorted(members)
    queues = sorted(queues)
    if me not in members or not queues:
        return []
    index = members.index(me)
    per, extra = divmod(len(queues), len(members))
    start = index * per + min(index, extra)
    size = per + (1 if index < extra else 0)
    return queues[start : start + size]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode(), usedforsecurity=False).digest()[:8], "big")


def allocate_consistent_hash(
    queues: Sequence[str], members: Sequence[str], me: str, virtual_nodes: int = 16
) -> list[str]:
    """Queues for ``me`` on a hash ring with ``virtual_nodes`` points per member."""
    if me not in members or not queues:
        return []
    ring = sorted(
        (_hash(f"{member}#{i}"), member) for member in set(members) for i in range(virtual_nodes)
    )
    points = [point for point, _ in ring]
    mine = []
    for queue in sorted(queues):
        index = bisect.bisect_left(points, _hash(queue)) % len(ring)
        if ring[index][1] == me:
            mine.append(queue)
    return mine


STRATEGIES: dict[str, AllocationStrategy] = {
    "average": allocate_average,
    "consistent_hash": allocate_consistent_hash,
}


def strategy_named(name: str | AllocationStrategy) -> AllocationStrategy:
    """The strategy for ``"average"`` / ``"consistent_hash"`` (a callable passes through)."""
    if callable(name):
        return name
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown allocation strategy {name!r}; use one of {sorted(STRATEGIES)}"
        ) from None
