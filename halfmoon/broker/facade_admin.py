"""The broker facade's administration role: the broker itself (settings, status,
metrics), its topics and its consumer groups (see :mod:`halfmoon.broker.facade`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from halfmoon.broker.config import DEFAULT_QUEUE_COUNT, BrokerConfig
from halfmoon.broker.facade_types import QueueProgress, QueueRoute, QueueStatus
from halfmoon.broker.groups import DEFAULT_MAX_DELIVERY_ATTEMPTS, GroupConfig, RetryPolicy
from halfmoon.broker.message import MessageType
from halfmoon.broker.statistics import TrafficRow
from halfmoon.broker.stats import BrokerStatus
from halfmoon.broker.topics import TopicConfig
from halfmoon.broker.transactions import (
    CheckSender,
)
from halfmoon.store.api import StoreStats


class Administration(Protocol):
    """What is asked of a broker about itself, its topics and its consumer groups."""

    # -- lifecycle and settings ----------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        """The settings in force (read only: change them with :meth:`update_config`)."""
        ...

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        """Set ``BrokerConfig`` fields by name, effective at once for the fields the broker
        reads on each use; all names are checked before any changes (``InvalidArgument``)."""
        ...

    def close(self) -> None:
        """Persist metadata, offsets, timer progress and consumption state (not the store)."""
        ...

    def tick(self) -> bool:
        """Background work: due delay messages, dead letters of expired last deliveries,
        transaction checks, periodic persistence.

        Call every ~100 ms from one thread. True while a transaction check scan
        is unfinished: tick again at once rather than after the interval.
        """
        ...

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(topic, queue_id)`` after messages are appended to a user topic
        (from the appending thread; it must not block). Long polls wake on it."""
        ...

    def set_check_sender(self, sender: CheckSender | None) -> None:
        """Where transaction checks go (live producers' telemetry streams); None: nowhere."""
        ...

    def status(self) -> BrokerStatus:
        """Name, uptime, counts, traffic rates, commit-log offsets, pending delay messages."""
        ...

    def store_stats(self) -> StoreStats:
        """The store's figures: commit-log offsets (written and flushed), segments, disk."""
        ...

    def counted_metrics(self) -> list[list[Any]]:
        """The broker's own counters for ``/metrics`` (:func:`broker_metrics.snapshot`):
        messages per topic and group, dead letters, end-to-end latency."""
        ...

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        """Messages in (per topic) and out (per topic and group) per second and over 24 h."""
        ...

    def traffic_history(
        self, topic: str | None = None, group: str | None = None, minutes: int = 60
    ) -> dict[str, Any]:
        """Messages in, out, acked and redelivered per step over the last ``minutes`` of a
        topic and/or a group (:meth:`TrafficStatistics.history`): the rate charts."""
        ...

    # -- topics ---------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = DEFAULT_QUEUE_COUNT,
        perm: str = "rw",
        brokers: Sequence[str] = (),
    ) -> TopicConfig:
        """A new topic; TopicExists when the name is taken, IllegalTopic for a bad name.

        ``brokers``: in a cluster, the brokers to place its queues on (default: every live
        one); a single broker refuses a non-empty list (InvalidArgument)."""
        ...

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
    ) -> TopicConfig:
        """Change queues, permission, type or the trace switch; shrunk queues stay readable
        until drained."""
        ...

    def delete_topic(self, name: str) -> None:
        """Forget the topic, its messages and every group's offsets in it."""
        ...

    def get_topic(self, name: str) -> TopicConfig:
        """The topic; TopicNotFound unless auto-creation is on (then a new mixed topic)."""
        ...

    def find_topic(self, name: str) -> TopicConfig | None:
        """The topic (internal ones included) or None; never creates one."""
        ...

    def list_topics(self) -> list[TopicConfig]:
        """User topics and dead-letter topics (not the broker's internal ones), by name."""
        ...

    def topic_status(self, name: str) -> list[QueueStatus]:
        """Per readable queue: min/max offset, last store time, permission."""
        ...

    def route(self, topic: str) -> list[QueueRoute]:
        """The topic's readable queues with their permission and accepted message types."""
        ...

    # -- consumer groups -------------------------------------------------------------

    def create_group(
        self,
        name: str,
        *,
        fifo: bool = False,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        retry_policy: RetryPolicy | None = None,
        consume_from: str | None = None,
        consume_enabled: bool = True,
        broadcast: bool = False,
    ) -> GroupConfig:
        """A new consumer group; GroupExists when the name is taken. ``consume_from``
        (latest|earliest|auto) None means ``config.default_consume_from``."""
        ...

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        """Change any of create_group's settings."""
        ...

    def delete_group(self, name: str) -> None:
        """Forget the group, its offsets and its consumption state."""
        ...

    def get_group(self, name: str) -> GroupConfig:
        """The group; GroupNotFound unless auto-creation is on (then a new group)."""
        ...

    def find_group(self, name: str) -> GroupConfig | None:
        """The group or None; never creates one."""
        ...

    def list_groups(self) -> list[GroupConfig]:
        """Every consumer group, by name."""
        ...

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue the group consumed by pop or pull: committed offset, lag, in flight."""
        ...

    def subscribe(self, group: str, topic: str) -> None:
        """Fix a new group's start position in ``topic`` now (when a consumer subscribes)."""
        ...
