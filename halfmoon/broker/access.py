"""Who may read and write what: the queues a topic reads from, whether a group
may consume a topic at all (readable, not internal, consuming enabled), and
the permissions a route announces."""

from __future__ import annotations

from collections.abc import Callable

from halfmoon.broker.errors import IllegalQueueId, PermissionDenied
from halfmoon.broker.facade import QueueRoute
from halfmoon.broker.groups import GroupConfig
from halfmoon.broker.topics import TopicConfig, is_internal_topic


def check_queue(config: TopicConfig, queue_id: int) -> None:
    """Refuse a queue id the topic does not read from."""
    if queue_id not in config.readable_queues():
        raise IllegalQueueId(
            f"topic {config.name!r} has no queue {queue_id} "
            f"(0 to {len(config.readable_queues()) - 1})"
        )


def check_consumable(
    get_topic: Callable[[str], TopicConfig],
    get_group: Callable[[str], GroupConfig],
    group: str,
    topic: str,
) -> TopicConfig:
    """The topic's config, if ``group`` may consume it; else PermissionDenied."""
    config = get_topic(topic)
    if not config.readable:
        raise PermissionDenied(f"topic {topic!r} is not readable (perm {config.perm!r})")
    if is_internal_topic(config.name):
        raise PermissionDenied(f"topic {topic!r} is internal to the broker")
    if not get_group(group).consume_enabled:
        raise PermissionDenied(f"consumer group {group!r} has consuming disabled")
    return config


def routes(config: TopicConfig, *, writable: bool) -> list[QueueRoute]:
    """The topic's readable queues as a route announces them; read-only while the broker
    is not ``writable`` (wiped write permission: producers go elsewhere)."""
    accepted = config.accepted_types()
    return [
        QueueRoute(
            config.name,
            q,
            config.queue_perm(q) if writable else _without_write(config.queue_perm(q)),
            list(accepted),
        )
        for q in config.readable_queues()
    ]


def _without_write(perm: str) -> str:
    return perm.replace("w", "") or "-"
