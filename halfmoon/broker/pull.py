"""Consumption by pull: a consumer reads a queue at an offset it keeps itself, and
may commit that offset to the broker (:mod:`offsets`) to resume from after a restart.

Unlike pop (:mod:`pop`), the broker tracks nothing in flight: a pull reads the
store and counts what it handed out, and the committed offsets are plain
values per group, topic and queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from halfmoon.broker.access import check_queue
from halfmoon.broker.errors import IllegalOffset, OffsetNotFound
from halfmoon.broker.facade import PullResult
from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.broker.groups import GroupConfig
from halfmoon.broker.message import MessageView
from halfmoon.broker.offsets import OffsetTable
from halfmoon.broker.topics import TopicConfig
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import GetStatus, Store

MAX_PULL_BATCH = 1024
# Bulk reads (halfmoon.v1.BulkRead, docs/bulk-read.md): many messages per answer, bounded by
# count and bytes. The byte cap keeps one answer well under a gRPC message's usual limits.
MAX_BULK_MESSAGES = 16384
MAX_BULK_BYTES = 16 * 1024 * 1024


class PullService:
    """Pull reads and the offsets pull consumers commit, for one broker."""

    def __init__(
        self,
        store: Store,
        offsets: OffsetTable,
        filters: FilterCache,
        *,
        get_topic: Callable[[str], TopicConfig],
        get_group: Callable[[str], GroupConfig],
        check_consumable: Callable[[str, str], TopicConfig],
        delivered: Callable[[str, str, int], None],
        reset_pop: Callable[[str, str, int, int], None],
    ) -> None:
        self._store = store
        self._offsets = offsets
        self._filters = filters
        self._get_topic = get_topic
        self._get_group = get_group
        self._check_consumable = check_consumable
        self._delivered = delivered  # (group, topic, count): the traffic counters
        self._reset_pop = reset_pop  # a reset moves the group's pop cursor as well

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        if not 1 <= batch_size <= MAX_PULL_BATCH:
            raise InvalidArgument(f"batch size must be 1 to {MAX_PULL_BATCH}, got {batch_size}")
        return self._read(group, topic, queue_id, offset, batch_size, 4 * 1024 * 1024, filter)

    def bulk_read(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        filter: FilterSpec,
        end_offset: int | None = None,
    ) -> PullResult:
        """:meth:`pull` with bigger answers, bounded by count and bytes, and never past
        ``end_offset`` (exclusive; None: the queue's end)."""
        if offset < 0:
            raise IllegalOffset(f"offset must be >= 0, got {offset}")
        if not 1 <= max_messages <= MAX_BULK_MESSAGES:
            raise InvalidArgument(
                f"max_messages must be 1 to {MAX_BULK_MESSAGES}, got {max_messages}"
            )
        if not 1 <= max_bytes <= MAX_BULK_BYTES:
            raise InvalidArgument(f"max_bytes must be 1 to {MAX_BULK_BYTES}, got {max_bytes}")
        if end_offset is not None:
            if end_offset < offset:
                raise IllegalOffset(
                    f"end_offset {end_offset} is before offset {offset}; ask for [offset, end)"
                )
            if end_offset == offset:  # an empty range: nothing to read, nothing lost
                config = self._check_consumable(group, topic)
                check_queue(config, queue_id)
                low = self._store.min_offset(topic, queue_id)
                high = self._store.max_offset(topic, queue_id)
                return PullResult(GetStatus.NO_MESSAGE, [], offset, low, high)
            max_messages = min(max_messages, end_offset - offset)
        result = self._read(group, topic, queue_id, offset, max_messages, max_bytes, filter)
        if end_offset is not None and result.next_offset > end_offset:
            # A filtered read may have scanned past the end: what lies there is not this range's.
            result.messages = [m for m in result.messages if m.queue_offset < end_offset]
            result.next_offset = end_offset
            if not result.messages and result.status is GetStatus.FOUND:
                result.status = GetStatus.NO_MATCHED_MESSAGE
        return result

    def _read(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        filter: FilterSpec,
    ) -> PullResult:
        config = self._check_consumable(group, topic)
        check_queue(config, queue_id)
        if offset < 0:
            raise IllegalOffset(f"offset must be >= 0, got {offset}")
        compiled = self._filters.get(filter)
        got = self._store.get(
            topic,
            queue_id,
            offset,
            max_messages,
            max_bytes,
            tag_hashes=compiled.tag_hashes,
            predicate=compiled.predicate,
        )
        status = got.status
        if status is GetStatus.NO_SUCH_QUEUE:  # a queue of a known topic that has no data yet
            status = GetStatus.NO_MESSAGE if offset == 0 else GetStatus.OFFSET_OVERFLOW
        views = [MessageView.of(m) for m in got.messages]
        self._delivered(group, topic, len(views))
        return PullResult(status, views, got.next_offset, got.min_offset, got.max_offset)

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        self._get_group(group)
        check_queue(self._get_topic(topic), queue_id)
        offset = self._offsets.get(group, topic, queue_id)
        if offset is None:
            raise OffsetNotFound(
                f"group {group!r} has no committed offset for {topic!r} queue {queue_id}; "
                "start with query_offset"
            )
        return offset

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.check_offset(group, topic, queue_id, offset)
        self._offsets.set(group, topic, queue_id, offset)

    def check_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Raise unless ``offset`` is a committable offset of the queue for ``group``."""
        self._get_group(group)
        check_queue(self._get_topic(topic), queue_id)
        high = self._store.max_offset(topic, queue_id)
        if not 0 <= offset <= high:
            raise IllegalOffset(
                f"offset {offset} is outside queue {queue_id} of {topic!r} (0 to {high})"
            )

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        check_queue(self._get_topic(topic), queue_id)
        if policy == "beginning":
            return self._store.min_offset(topic, queue_id)
        if policy == "end":
            return self._store.max_offset(topic, queue_id)
        if policy == "timestamp":
            if timestamp is None:
                raise InvalidArgument("query_offset by timestamp needs a timestamp")
            return self._store.offset_for_timestamp(topic, queue_id, timestamp)
        raise InvalidArgument(f"unknown offset policy {policy!r}: use beginning, end or timestamp")

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        self._get_group(group)
        config = self._get_topic(topic)
        offsets = {
            queue_id: self._store.offset_for_timestamp(topic, queue_id, timestamp)
            for queue_id in config.readable_queues()
        }
        self._move(group, topic, offsets)
        return offsets

    def seek_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        self._get_group(group)
        config = self._get_topic(topic)
        for queue_id, offset in offsets.items():  # all checked before any moves
            check_queue(config, queue_id)
            low, high = (
                self._store.min_offset(topic, queue_id),
                self._store.max_offset(topic, queue_id),
            )
            if not low <= offset <= high:
                raise IllegalOffset(
                    f"offset {offset} is outside queue {queue_id} of {topic!r} ({low} to {high})"
                )
        self._move(group, topic, offsets)
        return dict(offsets)

    def _move(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        for queue_id, offset in offsets.items():
            self._offsets.set(group, topic, queue_id, offset)
            self._reset_pop(group, topic, queue_id, offset)
