"""Topics: their message type, queue count and permissions, and the registry that keeps them.

A topic has ``queue_count`` writable queues. Growing it adds queues at once.
Shrinking it does not drop data: the removed queues become read-only (route
perm ``r``) and stay readable while they still hold retained messages; a
removed queue that never held a message disappears at once, and the others
disappear once retention has emptied them (``read_queue_count`` shrinks back,
see :meth:`TopicRegistry.drop_drained_queues`). Growing again makes them
writable again.

Names: letters, digits, ``_``, ``-`` and ``%``, at most 127 characters
(RocketMQ's rule). Names starting with ``%`` or ``RMQ_SYS_`` are reserved for
the broker's internal topics: users cannot create them (consumers may still
read ``%DLQ%<group>``).

The registry lives in ``<metadata_dir>/topics.json``, replaced atomically on
every change (changes are rare, admin-driven).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from halfmoon.broker.config import DEFAULT_QUEUE_COUNT, read_json, write_json_atomic
from halfmoon.broker.errors import IllegalTopic, TopicExists, TopicNotFound
from halfmoon.broker.message import MessageType
from halfmoon.broker.priority import scan_order
from halfmoon.errors import InvalidArgument

TIMER_TOPIC = "%HM_TIMER%"
OFFSETS_TOPIC = "%HM_OFFSETS%"  # committed offsets, journaled (offset_journal.py)
TIMER_PROGRESS_TOPIC = "%HM_TIMER_PROGRESS%"  # the timer's progress (timer_journal.py)
POP_TOPIC = "%HM_POP%"  # pop consumers' positions and acks (pop_journal.py)
TRACE_TOPIC = "%TRACE%"  # the broker's message trace (trace.py); never in the registry
DLQ_PREFIX = "%DLQ%"
# RocketMQ's retry topic prefix: halfmoon redelivers in place and keeps no retry topic, but
# group names leave room for one (groups.MAX_GROUP_LENGTH).
RETRY_PREFIX = "%RETRY%"
RESERVED_PREFIXES = ("%", "RMQ_SYS_")
# Internal topics whose names RocketMQ gave no reserved prefix.
RESERVED_NAMES = frozenset({"TRANS_CHECK_MAX_TIME_TOPIC"})
MAX_TOPIC_LENGTH = 127
MAX_QUEUE_COUNT = 1024
PERMS = ("rw", "r", "w", "-")
_NAME = re.compile(r"^[%a-zA-Z0-9_-]+$")


def is_reserved(name: str) -> bool:
    return name.startswith(RESERVED_PREFIXES) or name in RESERVED_NAMES


def is_internal_topic(name: str) -> bool:
    """Topics only the broker reads (timer, trace, transaction half/op, parked); DLQs are not."""
    return (
        name in (TIMER_TOPIC, TRACE_TOPIC, OFFSETS_TOPIC, POP_TOPIC, TIMER_PROGRESS_TOPIC)
        or name.startswith("RMQ_SYS_")
        or name in RESERVED_NAMES
    )


def dead_letter_topic(group: str) -> str:
    return DLQ_PREFIX + group


_legal_names: set[str] = set()  # names found legal and not reserved: a send checks each message's


def check_topic_name(name: str, *, allow_reserved: bool = False) -> None:
    if type(name) is str and name in _legal_names:
        return
    _check_topic_name(name, allow_reserved=allow_reserved)
    if not allow_reserved and len(_legal_names) < 65_536:
        _legal_names.add(name)


def _check_topic_name(name: str, *, allow_reserved: bool) -> None:
    if not name or len(name) > MAX_TOPIC_LENGTH or not _NAME.match(name):
        raise IllegalTopic(
            f"illegal topic name {name!r}: use 1 to {MAX_TOPIC_LENGTH} letters, digits, '_' or '-'"
        )
    if is_reserved(name) and not allow_reserved:
        raise IllegalTopic(
            f"topic name {name!r} is reserved (names starting with '%' or 'RMQ_SYS_', and "
            "TRANS_CHECK_MAX_TIME_TOPIC, are the broker's own); pick another name"
        )


def check_perm(perm: str) -> str:
    if perm not in PERMS:
        raise InvalidArgument(f"illegal perm {perm!r}: use one of {', '.join(PERMS)}")
    return perm


def check_queue_count(count: int) -> int:
    if not isinstance(count, int) or not 1 <= count <= MAX_QUEUE_COUNT:
        raise InvalidArgument(f"illegal queue count {count!r}: use 1 to {MAX_QUEUE_COUNT}")
    return count


@dataclass(frozen=True)
class TopicConfig:
    name: str
    message_type: MessageType = MessageType.NORMAL
    queue_count: int = DEFAULT_QUEUE_COUNT  # writable queues: 0 .. queue_count - 1
    perm: str = "rw"
    read_queue_count: int = DEFAULT_QUEUE_COUNT  # readable queues, >= queue_count after a shrink
    created_ms: int = 0
    trace: bool = True  # record its messages' trace (halfmoon/broker/trace.py)

    @property
    def readable(self) -> bool:
        return "r" in self.perm

    @property
    def writable(self) -> bool:
        return "w" in self.perm

    @property
    def internal(self) -> bool:
        return is_reserved(self.name)

    def accepts(self, message_type: MessageType) -> bool:
        return self.message_type is MessageType.MIXED or self.message_type is message_type

    def accepted_types(self) -> list[MessageType]:
        if self.message_type is MessageType.MIXED:
            return [
                MessageType.NORMAL,
                MessageType.FIFO,
                MessageType.DELAY,
                MessageType.TRANSACTION,
            ]
        return [self.message_type]

    def queue_perm(self, queue_id: int) -> str:
        """The route perm of one queue: removed (shrunk) queues are read-only."""
        if queue_id < self.queue_count:
            return self.perm
        return "r" if self.readable else "-"

    def readable_queues(self) -> range:
        return range(max(self.queue_count, self.read_queue_count))

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "message_type": self.message_type.value,
            "queue_count": self.queue_count,
            "perm": self.perm,
            "read_queue_count": self.read_queue_count,
            "created_ms": self.created_ms,
            "trace": self.trace,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TopicConfig:
        return cls(
            name=str(data["name"]),
            message_type=MessageType(data["message_type"]),
            queue_count=_json_int(data["queue_count"]),
            perm=str(data["perm"]),
            read_queue_count=_json_int(data.get("read_queue_count", data["queue_count"])),
            created_ms=_json_int(data.get("created_ms", 0)),
            trace=bool(data.get("trace", True)),
        )


def _json_int(value: object) -> int:
    """``int(value)`` for a number read from topics.json; TypeError (as int() raises) otherwise."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected a number, not {type(value).__name__}")


class TopicRegistry:
    """Every topic the broker knows, persisted to ``<metadata_dir>/topics.json``."""

    FILE = "topics.json"

    def __init__(self, metadata_dir: Path | None, now_ms: Callable[[], int]) -> None:
        self._path = metadata_dir / self.FILE if metadata_dir is not None else None
        self._now_ms = now_ms
        self._lock = threading.RLock()
        self._topics: dict[str, TopicConfig] = {}
        if self._path is not None:
            data = read_json(self._path)
            for item in (data or {}).get("topics", []):
                topic = TopicConfig.from_dict(item)
                self._topics[topic.name] = topic
        if TIMER_TOPIC not in self._topics:
            self._topics[TIMER_TOPIC] = TopicConfig(
                TIMER_TOPIC, MessageType.MIXED, 1, "rw", 1, now_ms()
            )

    def _save(self) -> None:
        if self._path is not None:
            items = [t.to_dict() for t in sorted(self._topics.values(), key=lambda t: t.name)]
            write_json_atomic(self._path, {"version": 1, "topics": items})

    def get(self, name: str) -> TopicConfig:
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    def find(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def readable_queue_ids(self, name: str) -> list[int]:
        """The queues a pop scans, in scan order (a priority topic's highest first)."""
        config = self.find(name)
        if config is None or not config.readable:
            return []
        if config.message_type is MessageType.PRIORITY:
            return scan_order(list(config.readable_queues()))
        return list(config.readable_queues())

    def is_priority(self, name: str) -> bool:
        config = self.find(name)
        return config is not None and config.message_type is MessageType.PRIORITY

    def delay_route(self, name: str, queue_id: int) -> int | None:
        """The queue a due delay message goes to (its own, folded if the topic shrank)."""
        config = self.find(name)
        if config is None:
            return None
        return queue_id if queue_id < config.queue_count else queue_id % config.queue_count

    def all(self) -> list[TopicConfig]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def create(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = DEFAULT_QUEUE_COUNT,
        perm: str = "rw",
        *,
        internal: bool = False,
    ) -> TopicConfig:
        check_topic_name(name, allow_reserved=internal)
        check_queue_count(queue_count)
        check_perm(perm)
        if not isinstance(message_type, MessageType):
            raise InvalidArgument(f"illegal message type {message_type!r}")
        with self._lock:
            if name in self._topics:
                raise TopicExists(name)
            topic = TopicConfig(name, message_type, queue_count, perm, queue_count, self._now_ms())
            self._topics[name] = topic
            self._save()
            return topic

    def ensure(self, name: str, message_type: MessageType, queue_count: int) -> TopicConfig:
        """The topic, created (internal names allowed) when missing: for DLQ topics."""
        with self._lock:
            topic = self._topics.get(name)
            if topic is not None:
                return topic
            return self.create(name, message_type, queue_count, internal=True)

    def ensure_dead_letter_topic(self, group: str) -> TopicConfig:
        return self.ensure(dead_letter_topic(group), MessageType.MIXED, 1)

    def update(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
        has_messages: Callable[[int], bool] = lambda queue_id: True,
    ) -> TopicConfig:
        """Change a topic. ``has_messages(queue_id)`` tells whether a removed queue holds data."""
        with self._lock:
            topic = self.get(name)
            changes: dict[str, object] = {}
            if perm is not None:
                changes["perm"] = check_perm(perm)
            if message_type is not None:
                if not isinstance(message_type, MessageType):
                    raise InvalidArgument(f"illegal message type {message_type!r}")
                changes["message_type"] = message_type
            if trace is not None:
                if not isinstance(trace, bool):
                    raise InvalidArgument(f"trace must be true or false, not {trace!r}")
                changes["trace"] = trace
            if queue_count is not None:
                check_queue_count(queue_count)
                changes["queue_count"] = queue_count
                changes["read_queue_count"] = max(queue_count, topic.read_queue_count)
            topic = replace(topic, **changes)  # type: ignore[arg-type]
            topic = self._without_drained(topic, has_messages)
            self._topics[name] = topic
            self._save()
            return topic

    def drop_all_drained_queues(
        self, has_messages_of: Callable[[str], Callable[[int], bool]]
    ) -> None:
        """``drop_drained_queues`` for every topic that still has removed queues."""
        for topic in self.all():
            if topic.read_queue_count > topic.queue_count:
                self.drop_drained_queues(topic.name, has_messages_of(topic.name))

    def drop_drained_queues(self, name: str, has_messages: Callable[[int], bool]) -> TopicConfig:
        """Forget removed read-only queues that hold nothing any more."""
        with self._lock:
            topic = self.get(name)
            trimmed = self._without_drained(topic, has_messages)
            if trimmed != topic:
                self._topics[name] = trimmed
                self._save()
            return trimmed

    @staticmethod
    def _without_drained(topic: TopicConfig, has_messages: Callable[[int], bool]) -> TopicConfig:
        count = topic.read_queue_count
        while count > topic.queue_count and not has_messages(count - 1):
            count -= 1
        return topic if count == topic.read_queue_count else replace(topic, read_queue_count=count)

    def delete(self, name: str) -> TopicConfig:
        with self._lock:
            topic = self.get(name)
            if is_internal_topic(name):
                raise IllegalTopic(
                    f"topic {name!r} is internal to the broker and cannot be deleted"
                )
            del self._topics[name]
            self._save()
            return topic

    def close(self) -> None:
        with self._lock:
            self._save()
