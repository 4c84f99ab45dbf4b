"""The broker's settings, and how its small metadata files reach the disk.

Metadata (topics, groups, offsets, timer progress) is a handful of small JSON
files in the broker's metadata directory. Each is replaced atomically: write a
temporary file, fsync it, rename it over the old one, fsync the directory, so
a crash leaves either the old or the new version, never half of one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from halfmoon.errors import InvalidArgument
from halfmoon.store.fsutil import replace_atomically

DEFAULT_QUEUE_COUNT = 8  # a new topic's queues when its creator names no count

DAY_MS = 24 * 3600 * 1000


@dataclass
class BrokerConfig:
    name: str = "halfmoon"
    auto_create_topics: bool = False
    auto_create_groups: bool = True
    # Where a consumer group starts in each queue when it was auto-created or created
    # without an explicit start. "auto" is RocketMQ 5's pop rule: the queue's first message
    # while the queue's start is retained and hot, otherwise its last message (so a consumer
    # started after the producer still gets what was just sent). "earliest": the first
    # retained message; "latest": only what is sent from then on.
    default_consume_from: Literal["auto", "earliest", "latest"] = "auto"
    # "Hot" for the "auto" rule: the queue's first message lies within this many bytes of
    # the commit log's end. 0 means 40 % of physical memory, RocketMQ's
    # accessMessageInMemoryMaxRatio: data that recent is most likely still in page cache.
    hot_data_bytes: int = 0
    default_queue_count: int = DEFAULT_QUEUE_COUNT
    # False: the broker refuses new messages (mqadmin's wipeWritePerm) and routes show its
    # queues read-only, so producers go elsewhere while consumers drain it; acks, offsets,
    # transaction decisions and due delay messages go on.
    writable: bool = True
    max_body_size: int = 4 * 1024 * 1024
    default_invisible_ms: int = 30_000
    # Shortest invisible time a receive may ask for (RocketMQ proxy's
    # minInvisibleTimeMillsForRecv); changes of invisible duration have no minimum.
    min_receive_invisible_ms: int = 10_000
    offset_persist_interval_ms: int = 5_000
    # Delay messages: how far ahead a delivery time may be (RocketMQ's default: 40 days).
    max_delay_ms: int = 40 * DAY_MS
    # The timer keeps in memory only entries due within this window...
    timer_window_ms: int = 3_600_000
    # ...and never more than this many of them; the rest stay on disk.
    timer_max_heap: int = 100_000
    max_message_group_length: int = 128
    # Longest lite topic name (RIP-83; announced to lite consumers as max_lite_topic_size).
    max_lite_topic_length: int = 64
    # Lite topics one consumer client may subscribe to (announced as lite_subscription_quota).
    lite_subscription_quota: int = 1000
    # Lite topics one parent topic may hold; a send creating one more is refused.
    max_lite_topics_per_topic: int = 100_000
    # A consumer's lite subscriptions lapse this long after its last SyncLiteSubscription.
    lite_subscription_timeout_ms: int = 120_000

    def __post_init__(self) -> None:
        # Checked when the configuration is loaded, so a value no operation could use
        # (a topic of zero queues) stops the start instead of failing a user's call later.
        positive = (
            "default_queue_count",
            "max_body_size",
            "default_invisible_ms",
            "offset_persist_interval_ms",
            "max_delay_ms",
            "timer_window_ms",
            "timer_max_heap",
            "max_message_group_length",
            "max_lite_topic_length",
            "lite_subscription_quota",
            "max_lite_topics_per_topic",
            "lite_subscription_timeout_ms",
        )
        problems = [f"{name} must be positive" for name in positive if getattr(self, name) <= 0]
        if self.hot_data_bytes < 0 or self.min_receive_invisible_ms < 0:
            problems.append("hot_data_bytes and min_receive_invisible_ms must be >= 0")
        if not self.name:
            problems.append("name must not be empty")
        if problems:
            raise InvalidArgument(
                "invalid broker configuration: " + "; ".join(problems), code="BAD_CONFIG"
            )


def apply_changes(config: BrokerConfig, changes: Mapping[str, Any]) -> BrokerConfig:
    """Change settings of a running broker in place (unknown names or values the
    configuration would refuse at load: InvalidArgument)."""
    fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise InvalidArgument(f"no broker setting {', '.join(map(repr, unknown))}")
    dataclasses.replace(config, **changes)  # the same checks as at load, before any change
    for name, value in changes.items():
        setattr(config, name, value)
    return config


def write_json_atomic(path: Path, data: object) -> None:
    """Replace ``path`` with ``data`` as JSON so a crash leaves the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when the file does not exist."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return json.loads(raw)
