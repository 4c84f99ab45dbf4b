"""What an operator reads: the broker's status page, each queue's range and last
store time (a topic's status), and how far a group has consumed each queue."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from halfmoon.broker.facade import QueueProgress, QueueStatus
from halfmoon.broker.stats import BrokerStatus, RateCounter
from halfmoon.broker.topics import TopicConfig
from halfmoon.store.api import Store, StoreStats

# (queue id, committed offset, cursor, messages in flight) of a group's pop consumption.
PopProgress = Callable[[str, str], Iterable[tuple[int, int, int, int]]]
# Per queue id, the messages in flight delivered more than once.
PopRetrying = Callable[[str, str], Mapping[int, int]]
# Per queue id, the messages a receive would hand out now (PopStates.ready).
PopReady = Callable[[str, str], Mapping[int, int]]


def topic_status(store: Store, topic: TopicConfig) -> list[QueueStatus]:
    name = topic.name
    statuses = []
    for queue_id in topic.readable_queues():
        low = store.min_offset(name, queue_id)
        high = store.max_offset(name, queue_id)
        last = None
        if high > low:
            got = store.get(name, queue_id, high - 1, max_messages=1)
            last = got.messages[0].store_timestamp if got.messages else None
        statuses.append(QueueStatus(name, queue_id, low, high, last, topic.queue_perm(queue_id)))
    return statuses


def group_progress(
    store: Store,
    group: str,
    topics: Iterable[str],
    pulled: Mapping[tuple[str, int], int],
    pop_progress: PopProgress,
    pop_retrying: PopRetrying | None = None,
    pop_ready: PopReady | None = None,
) -> list[QueueProgress]:
    """Per queue: what pop consumption committed, else the offset a pull consumer stored.
    Ready is pop's count where pop has touched the queue, else the lag."""
    out = []
    for name in topics:
        retrying = pop_retrying(group, name) if pop_retrying is not None else {}
        ready = pop_ready(group, name) if pop_ready is not None else {}
        seen: dict[int, tuple[int, int]] = {
            queue_id: (committed, inflight)
            for queue_id, committed, _cursor, inflight in pop_progress(group, name)
        }
        for (t, queue_id), committed in pulled.items():
            if t == name and queue_id not in seen:
                seen[queue_id] = (committed, 0)
        for queue_id, (committed, inflight) in sorted(seen.items()):
            high = store.max_offset(name, queue_id)
            lag = max(0, high - committed)
            out.append(
                QueueProgress(
                    group,
                    name,
                    queue_id,
                    committed,
                    high,
                    lag,
                    inflight,
                    retrying.get(queue_id, 0),
                    ready.get(queue_id, lag),
                )
            )
    return out


def broker_status(
    name: str,
    uptime_ms: int,
    stats: StoreStats,
    *,
    topics: int,
    queues: int,
    groups: int,
    received: RateCounter,
    delivered: RateCounter,
    pending_delay_messages: int,
    extra: dict[str, int] | None = None,
) -> BrokerStatus:
    return BrokerStatus(
        name=name,
        uptime_ms=uptime_ms,
        topics=topics,
        groups=groups,
        queues=queues,
        messages_in_total=received.total,
        messages_out_total=delivered.total,
        tps_in=received.per_second(),
        tps_out=delivered.per_second(),
        disk_bytes=stats.disk_bytes,
        commit_log_min_offset=stats.commit_log_min_offset,
        commit_log_max_offset=stats.commit_log_max_offset,
        commit_log_flushed_offset=stats.commit_log_flushed_offset,
        pending_delay_messages=pending_delay_messages,
        extra=dict(extra or {}),
    )
