"""Reading stored messages for operators: by id, by key, at an offset, and scans.

Reads never touch consumer state: no offsets move, nothing becomes
invisible. The message id is the unique id (``UNIQ_KEY``) the store indexes
beside the keys, so a lookup by id is a key-index query (dead-letter copies
keep their id, so one id may answer several messages).

A scan walks the given queues in order, each from ``offset`` (one queue
only), else from the first message stored at or after ``begin_ms``, else
from the queue's start; it stops at ``end_ms``, after ``limit`` messages, or
after examining ``MAX_SCAN_ENTRIES`` entries, and says where each queue
stopped (``next_offsets``) so a caller can continue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from halfmoon.broker.filter_spec import CompiledFilter
from halfmoon.broker.message import MessageView
from halfmoon.broker.topics import TopicConfig
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import StoredMessage, tag_hash
from halfmoon.store.reader import MessageNotFound

MAX_SCAN_ENTRIES = 100_000  # per scan: a caller pages with next_offsets
NO_TAG = "(none)"
_READ_BATCH = 64
_ID_RESULTS_PER_TOPIC = 16


@dataclass
class ScanResult:
    messages: list[MessageView]  # empty when the scan only counts
    matched: int
    examined: int
    tag_counts: dict[str, int]  # over every matching message seen, most frequent first
    next_offsets: dict[int, int] = field(default_factory=dict)  # queue id -> where to go on
    complete: bool = True  # False: stopped at a limit before the end


def _readable_queue(topic: TopicConfig, queue_id: int) -> None:
    if queue_id not in topic.readable_queues():
        raise InvalidArgument(
            f"topic {topic.name!r} has no queue {queue_id} "
            f"(0 to {len(topic.readable_queues()) - 1})"
        )


def by_id(
    store: Store, store_topics: Iterable[str], message_id: str, named: str | None
) -> list[MessageView]:
    """Messages with this id in ``store_topics`` (store topic names: a lite topic's queue is
    one of its own; ``named``: the topic the caller asked for, if any)."""
    found = [
        MessageView.of(stored)
        for name in store_topics
        for stored in store.query_by_key(name, message_id, max_results=_ID_RESULTS_PER_TOPIC)
        if stored.unique_id == message_id
    ]
    if not found:
        where = f"topic {named!r}" if named else "any topic"
        raise MessageNotFound(
            f"no message with id {message_id!r} in {where} (it may be older than the "
            "retention, or the id may be mistyped)"
        )
    return found


def by_key(
    store: Store, topic: TopicConfig, key: str, begin_ms: int, end_ms: int, limit: int
) -> list[MessageView]:
    found = store.query_by_key(topic.name, key, begin_ms, end_ms, limit)
    return [MessageView.of(m) for m in found if key in m.keys]


def at(store: Store, topic: TopicConfig, queue_id: int, offset: int) -> MessageView:
    _readable_queue(topic, queue_id)
    got = store.get(topic.name, queue_id, offset, max_messages=1)
    if got.status is not GetStatus.FOUND or got.messages[0].queue_offset != offset:
        raise MessageNotFound(
            f"queue {queue_id} of {topic.name!r} has no message at offset {offset} "
            f"(it holds offsets {got.min_offset} to {max(got.min_offset, got.max_offset - 1)}"
            f"{'' if got.max_offset > got.min_offset else ', none yet'})"
        )
    return MessageView.of(got.messages[0])


def scan(
    store: Store,
    config: TopicConfig,
    queue: int | None,
    offset: int | None,
    begin: int,
    end: int,
    limit: int,
    compiled: CompiledFilter,
    with_messages: bool,
) -> ScanResult:
    """One queue (``queue``) or every readable queue (None); see the module docs."""
    topic = config.name
    queues = list(config.readable_queues())
    if queue is not None:
        _readable_queue(config, queue)
        queues = [queue]
    messages: list[MessageView] = []
    tag_counts: dict[str, int] = {}
    next_offsets: dict[int, int] = {}
    matched = examined = 0
    complete = True
    for queue_id in queues:
        if offset is not None:
            position = offset
        elif begin > 0:
            position = store.offset_for_timestamp(topic, queue_id, begin)
        else:
            position = store.min_offset(topic, queue_id)
        position = max(position, store.min_offset(topic, queue_id))
        high = store.max_offset(topic, queue_id)
        done = False
        while not done and position < high:
            if (with_messages and len(messages) >= limit) or examined >= MAX_SCAN_ENTRIES:
                complete = False
                break
            got = store.get(
                topic, queue_id, position, _READ_BATCH
            )  # filter below: count what we skip
            if got.status is GetStatus.OFFSET_TOO_SMALL:
                position = got.next_offset
                continue
            if not got.messages:
                position = got.next_offset if got.next_offset > position else high
                continue
            for stored in got.messages:
                examined += 1
                if stored.store_timestamp > end:
                    done = True
                    break
                position = stored.queue_offset + 1
                if stored.store_timestamp < begin:
                    continue
                if compiled.tag_hashes is not None and not _tag_matches(compiled, stored):
                    continue
                if not compiled.matches(stored):
                    continue
                matched += 1
                tag = stored.tags or NO_TAG
                tag_counts[tag] = tag_counts.get(tag, 0) + 1
                if with_messages:
                    messages.append(MessageView.of(stored))
                    if len(messages) >= limit:
                        break
        next_offsets[queue_id] = position
    return ScanResult(
        messages,
        matched,
        examined,
        dict(sorted(tag_counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        next_offsets,
        complete,
    )


def _tag_matches(compiled: CompiledFilter, stored: StoredMessage) -> bool:
    assert compiled.tag_hashes is not None
    return tag_hash(stored.tags) in compiled.tag_hashes
