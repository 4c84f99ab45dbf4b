"""The store's reads: a queue from an offset, a record at a commit-log offset, messages by key.

Reads take no lock. A queue is read up to its visible end
(:class:`~halfmoon.store.visibility.Visibility`; under ``sync``, what an fsync
covered); a record at a commit-log offset must end within the visible log.
Records are decoded straight from the commit log's memory maps.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from halfmoon.errors import NotFound
from halfmoon.store import record
from halfmoon.store.api import GetResult, GetStatus, MessagePredicate, TagHashes
from halfmoon.store.commitlog import CommitLog, OffsetGone
from halfmoon.store.config import StoreConfig
from halfmoon.store.consumequeue import ConsumeQueues
from halfmoon.store.keyindex import KeyIndex
from halfmoon.store.message import StoredMessage
from halfmoon.store.visibility import Visibility

log = logging.getLogger("halfmoon.store")


class MessageNotFound(NotFound):
    code = "MESSAGE_NOT_FOUND"


class Reader:
    """Reads one store's log through its consume queues and key index, up to what is visible."""

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        queues: ConsumeQueues,
        index: KeyIndex,
        visibility: Visibility,
    ) -> None:
        self._commitlog = commitlog
        self._queues = queues
        self._index = index
        self._visibility = visibility
        self._max_scan_entries = config.max_scan_entries
        self._verify_crc = config.verify_crc_on_read

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tag_hashes: TagHashes = None,
        predicate: MessagePredicate | None = None,
        below: int | None = None,
    ) -> GetResult:
        """``below``: a commit-log offset; the queue is read as if it ended at its first
        entry whose record does not end at or before it (a replica's committed point)."""
        key = (topic, queue_id)
        max_offset = self._visibility.visible.get(key)
        if max_offset is None:
            return GetResult(GetStatus.NO_SUCH_QUEUE, [], 0, 0, 0)
        if below is not None:
            max_offset = self.max_offset_below(topic, queue_id, below)
        min_offset = min(self._queues.min_offset(topic, queue_id), max_offset)
        if offset < min_offset:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], min_offset, min_offset, max_offset)
        if offset >= max_offset:
            status = GetStatus.NO_MESSAGE if offset == max_offset else GetStatus.OFFSET_OVERFLOW
            return GetResult(status, [], max_offset, min_offset, max_offset)
        budget = min(max_offset - offset, max(max_messages, self._max_scan_entries))
        commitlog = self._commitlog
        # Records past this point may still be being written (read after max_offset).
        readable_end = commitlog.write_position
        decode = record.decode_at
        verify = self._verify_crc
        messages: list[StoredMessage] = []
        total = 0
        next_offset = offset
        examined = 0
        full = False
        # The segment of the previous record: consecutive entries almost always
        # share it, so the lookup runs once per segment, not once per message.
        segment_start = segment_end = 0
        mm: record.Buffer = b""  # set with the first segment (end > segment_end)
        while not full and examined < budget:
            # Fetch only what is likely needed: a filter-free read needs max_messages entries.
            want = min(budget - examined, max(max_messages - len(messages), 16))
            first, entries = self._queues.raw_entries(topic, queue_id, next_offset, want)
            if not entries:
                break
            if first > next_offset:  # trimmed since min_offset was read
                if not examined:
                    return GetResult(GetStatus.OFFSET_TOO_SMALL, [], first, first, max_offset)
                break
            examined += len(entries)
            queue_offset = first - 1
            for commit_log_offset, size, entry_tag in entries:
                queue_offset += 1
                if tag_hashes is not None and entry_tag not in tag_hashes:
                    next_offset = queue_offset + 1
                    continue
                if messages and total + size > max_bytes:
                    full = True
                    break
                next_offset = queue_offset + 1
                end = commit_log_offset + size
                try:
                    if not segment_start <= commit_log_offset or end > segment_end:
                        segment = commitlog.segment_for(commit_log_offset)
                        if segment is None:
                            raise OffsetGone(commit_log_offset)
                        segment_start, segment_end, mm = segment.start, segment.end, segment.mm
                    if end > readable_end:
                        raise OffsetGone(commit_log_offset)
                    relative = commit_log_offset - segment_start
                    # Decoded straight from the mapping: no intermediate copy.
                    message = decode(mm, relative, relative + size, verify, segment_start)
                except (OffsetGone, record.RecordError, ValueError) as exc:
                    # ValueError: the segment was closed by retention under our feet.
                    log.warning(
                        "event=unreadable_entry topic=%s queue_id=%d queue_offset=%d error=%r",
                        topic, queue_id, queue_offset, str(exc),
                    )  # fmt: skip
                    segment_start = segment_end = 0
                    continue
                if message.destinations:  # a fanout record: as this queue holds it
                    found = message.at(topic, queue_id, queue_offset)
                    if found is not None:
                        message = found
                if message.queue_offset != queue_offset or message.topic != topic:
                    log.warning(
                        "event=entry_mismatch topic=%s queue_id=%d queue_offset=%d",
                        topic, queue_id, queue_offset,
                    )  # fmt: skip
                    continue
                if predicate is not None and not predicate(message):
                    continue
                messages.append(message)
                total += size
                if len(messages) >= max_messages:
                    full = True
                    break
        if messages:
            status = GetStatus.FOUND
        elif examined:
            status = GetStatus.NO_MATCHED_MESSAGE
        else:
            status = GetStatus.NO_MESSAGE
        return GetResult(status, messages, next_offset, min_offset, max_offset)

    def read_at(self, commit_log_offset: int) -> StoredMessage:
        try:
            message = self._commitlog.read_message(commit_log_offset, verify=True)
        except OffsetGone:
            message = None
        if message is None or commit_log_offset + message.size > self._visibility.position:
            raise MessageNotFound(
                f"no message starts at commit-log offset {commit_log_offset} (it may have "
                f"been deleted by retention; the log starts at {self._commitlog.min_offset})"
            )
        return message

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp: int = 0,
        end_timestamp: int = 2**63 - 1,
        max_results: int = 64,
    ) -> list[StoredMessage]:
        if max_results <= 0:
            return []
        candidates = self._index.query(
            topic, key, begin_timestamp, end_timestamp, max_results * 2 + 8
        )
        found: list[StoredMessage] = []
        for offset in candidates:
            try:
                message = self.read_at(offset)
            except MessageNotFound:
                continue
            if message.topic != topic:
                view = message.in_topic(topic)  # a fanout record indexed into ``topic`` too
                if view is None:
                    continue
                message = view
            if not begin_timestamp <= message.store_timestamp <= end_timestamp:
                continue
            if key in message.keys or message.unique_id == key:
                found.append(message)
                if len(found) >= max_results:
                    break
        return found

    # -- queues --------------------------------------------------------------

    def min_offset(self, topic: str, queue_id: int) -> int:
        visible = self._visibility.visible
        if (topic, queue_id) not in visible:
            return 0
        return min(self._queues.min_offset(topic, queue_id), visible[(topic, queue_id)])

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._visibility.visible.get((topic, queue_id), 0)

    def max_offset_below(self, topic: str, queue_id: int, below: int) -> int:
        """The queue's end counting only entries whose records end at or before commit-log
        offset ``below``: a queue's records lie in the log in queue order, so a binary search
        over its entries finds the first one past ``below``."""
        high = self.max_offset(topic, queue_id)
        low = self._queues.min_offset(topic, queue_id)
        if low >= high:
            return high
        while low < high:  # invariant: every entry below `low` ends at or before `below`
            middle = (low + high) // 2
            first, entries = self._queues.raw_entries(topic, queue_id, middle, 1)
            if not entries or first != middle:  # trimmed meanwhile: count it as below
                low = middle + 1
                continue
            commit_log_offset, size, _ = entries[0]
            if commit_log_offset + size <= below:
                low = middle + 1
            else:
                high = middle
        return low

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        max_offset = self.max_offset(topic, queue_id)
        if max_offset == 0:
            return 0

        def store_timestamp_of(commit_log_offset: int) -> int:
            try:
                return self._commitlog.store_timestamp_at(commit_log_offset)
            except OffsetGone:
                return -1  # deleted by retention: older than anything asked for

        found = self._queues.lookup_by_time(topic, queue_id, timestamp, store_timestamp_of)
        return min(found, max_offset)

    def queues(self) -> Iterable[tuple[str, int]]:
        return sorted(self._visibility.visible)
