"""Consumer groups: delivery rules per group, and the registry that keeps them.

A group decides how its consumers are served: FIFO or not, how many delivery
attempts before a message goes to ``%DLQ%<group>`` (17 by default, as RocketMQ
5), how long to wait before each redelivery (:class:`RetryPolicy`), where a
new group starts reading (``latest`` or ``earliest``), whether consuming is
enabled, and whether it is a broadcast group (each consumer keeps its own
offsets; the pull path serves those).

Names: letters, digits, ``_``, ``-`` and ``%``, at most 120 characters, so
that the group's dead-letter topic ``%DLQ%<group>`` (and RocketMQ's longer
``%RETRY%<group>``) fits the 127-character topic limit. A longer name is
refused when the group is created, not when its first message is
dead-lettered. Names starting with ``%`` or ``RMQ_SYS_`` are reserved.

The registry lives in ``<metadata_dir>/groups.json``, replaced atomically on
every change.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from halfmoon.broker.config import read_json, write_json_atomic
from halfmoon.broker.errors import GroupExists, GroupNotFound, IllegalGroup
from halfmoon.broker.topics import MAX_TOPIC_LENGTH, RETRY_PREFIX
from halfmoon.errors import InvalidArgument

# A group's name is part of its dead-letter topic, %DLQ%<group>, which must fit the topic
# limit. RocketMQ caps groups at 120 (TopicValidator.GROUP_MAX_LENGTH, the client's
# Validators too) to leave room for %RETRY%<group>, the longer prefix; halfmoon uses the
# same number, so a group name is valid on both and any derived topic fits.
MAX_GROUP_LENGTH = MAX_TOPIC_LENGTH - len(RETRY_PREFIX)
_NAME = re.compile(r"^[%a-zA-Z0-9_-]+$")
CONSUME_FROM = ("latest", "earliest", "auto")
# Deliveries before a message goes to the dead-letter topic (RocketMQ 5's default: 16 retries).
DEFAULT_MAX_DELIVERY_ATTEMPTS = 17

# RocketMQ's customized backoff levels (messageDelayLevel without the leading
# 1s level's duplicates): 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
_S = 1000
_M = 60 * _S
DEFAULT_RETRY_LEVELS_MS: tuple[int, ...] = (
    1 * _S, 5 * _S, 10 * _S, 30 * _S,
    1 * _M, 2 * _M, 3 * _M, 4 * _M, 5 * _M, 6 * _M, 7 * _M, 8 * _M, 9 * _M, 10 * _M,
    20 * _M, 30 * _M, 60 * _M, 120 * _M,
)  # fmt: skip


@dataclass(frozen=True)
class RetryPolicy:
    """How long a consumer waits before a failed message is delivered again.

    ``customized``: the n-th failed attempt waits ``levels_ms[n - 1]`` (the last
    level repeats). ``exponential``: ``initial_ms * multiplier ** (n - 1)``,
    capped at ``max_ms``.
    """

    kind: str = "customized"
    levels_ms: tuple[int, ...] = DEFAULT_RETRY_LEVELS_MS
    initial_ms: int = 1_000
    max_ms: int = 7_200_000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.kind not in ("customized", "exponential"):
            raise InvalidArgument(
                f"illegal retry policy {self.kind!r}: use 'customized' or 'exponential'"
            )
        if self.kind == "customized" and (
            not self.levels_ms or any(level < 0 for level in self.levels_ms)
        ):
            raise InvalidArgument("customized retry levels must be a non-empty list of ms >= 0")
        if self.kind == "exponential" and (
            self.initial_ms < 0 or self.max_ms < self.initial_ms or self.multiplier < 1
        ):
            raise InvalidArgument(
                "exponential retry needs 0 <= initial_ms <= max_ms and multiplier >= 1"
            )

    @classmethod
    def customized(cls, levels_ms: tuple[int, ...] = DEFAULT_RETRY_LEVELS_MS) -> RetryPolicy:
        return cls("customized", tuple(levels_ms))

    @classmethod
    def exponential(cls, initial_ms: int, max_ms: int, multiplier: float = 2.0) -> RetryPolicy:
        return cls("exponential", (), initial_ms, max_ms, multiplier)

    def delay_for_attempt(self, attempt: int) -> int:
        """Milliseconds to wait after delivery attempt ``attempt`` (1-based) failed."""
        attempt = max(1, attempt)
        if self.kind == "customized":
            return self.levels_ms[min(attempt, len(self.levels_ms)) - 1]
        # Cap the exponent so a huge attempt number cannot overflow a float.
        delay = self.initial_ms * self.multiplier ** min(attempt - 1, 64)
        return int(min(delay, self.max_ms))

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "customized":
            return {"kind": "customized", "levels_ms": list(self.levels_ms)}
        return {
            "kind": "exponential",
            "initial_ms": self.initial_ms,
            "max_ms": self.max_ms,
            "multiplier": self.multiplier,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetryPolicy:
        if data.get("kind") == "exponential":
            return cls.exponential(
                int(data["initial_ms"]), int(data["max_ms"]), float(data["multiplier"])
            )
        return cls.customized(tuple(int(x) for x in data.get("levels_ms", DEFAULT_RETRY_LEVELS_MS)))


@dataclass(frozen=True)
class GroupConfig:
    name: str
    fifo: bool = False
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    consume_from: str = "latest"
    consume_enabled: bool = True
    broadcast: bool = False
    created_ms: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fifo": self.fifo,
            "max_delivery_attempts": self.max_delivery_attempts,
            "retry_policy": self.retry_policy.to_dict(),
            "consume_from": self.consume_from,
            "consume_enabled": self.consume_enabled,
            "broadcast": self.broadcast,
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupConfig:
        return cls(
            name=str(data["name"]),
            fifo=bool(data.get("fifo", False)),
            max_delivery_attempts=int(
                data.get("max_delivery_attempts", DEFAULT_MAX_DELIVERY_ATTEMPTS)
            ),
            retry_policy=RetryPolicy.from_dict(data.get("retry_policy", {})),
            consume_from=str(data.get("consume_from", "latest")),
            consume_enabled=bool(data.get("consume_enabled", True)),
            broadcast=bool(data.get("broadcast", False)),
            created_ms=int(data.get("created_ms", 0)),
        )


_FIELDS = {
    "fifo", "max_delivery_attempts", "retry_policy", "consume_from", "consume_enabled", "broadcast",
}  # fmt: skip


def check_group_name(name: str) -> None:
    if len(name) > MAX_GROUP_LENGTH:
        raise IllegalGroup(
            f"consumer group name {name[:32]!r}... is {len(name)} characters; a group name may "
            f"have at most {MAX_GROUP_LENGTH}, so that its dead-letter topic "
            f"%DLQ%<group> fits the {MAX_TOPIC_LENGTH}-character topic limit"
        )
    if not name or not _NAME.match(name):
        raise IllegalGroup(
            f"illegal consumer group name {name!r}: use 1 to {MAX_GROUP_LENGTH} letters, "
            "digits, '_' or '-'"
        )
    if name.startswith(("%", "RMQ_SYS_")):
        raise IllegalGroup(f"consumer group name {name!r} is reserved; pick another name")


def _checked(group: GroupConfig) -> GroupConfig:
    if (
        not isinstance(group.max_delivery_attempts, int)
        or not 1 <= group.max_delivery_attempts <= 1000
    ):
        raise InvalidArgument(
            f"illegal max delivery attempts {group.max_delivery_attempts!r}: use 1 to 1000"
        )
    if group.consume_from not in CONSUME_FROM:
        raise InvalidArgument(
            f"illegal consume_from {group.consume_from!r}: use 'latest', 'earliest' or 'auto'"
        )
    if not isinstance(group.retry_policy, RetryPolicy):
        raise InvalidArgument("retry_policy must be a RetryPolicy")
    return group


class GroupRegistry:
    """Every consumer group, persisted to ``<metadata_dir>/groups.json``."""

    FILE = "groups.json"

    def __init__(self, metadata_dir: Path | None, now_ms: Callable[[], int]) -> None:
        self._path = metadata_dir / self.FILE if metadata_dir is not None else None
        self._now_ms = now_ms
        self._lock = threading.RLock()
        self._groups: dict[str, GroupConfig] = {}
        if self._path is not None:
            for item in (read_json(self._path) or {}).get("groups", []):
                group = GroupConfig.from_dict(item)
                self._groups[group.name] = group

    def _save(self) -> None:
        if self._path is not None:
            items = [g.to_dict() for g in sorted(self._groups.values(), key=lambda g: g.name)]
            write_json_atomic(self._path, {"version": 1, "groups": items})

    def find(self, name: str) -> GroupConfig | None:
        return self._groups.get(name)

    def get(
        self, name: str, *, auto_create: bool = False, consume_from: str = "latest"
    ) -> GroupConfig:
        """The group ``name``; with ``auto_create``, created on first use (starting at
        ``consume_from``)."""
        group = self._groups.get(name)
        if group is not None:
            return group
        if not auto_create:
            check_group_name(name)
            raise GroupNotFound(name)
        with self._lock:
            group = self._groups.get(name)
            return group if group is not None else self.create(name, consume_from=consume_from)

    def all(self) -> list[GroupConfig]:
        with self._lock:
            return sorted(self._groups.values(), key=lambda g: g.name)

    def create(self, name: str, **settings: Any) -> GroupConfig:
        check_group_name(name)
        unknown = set(settings) - _FIELDS
        if unknown:
            raise InvalidArgument(f"unknown group setting(s): {', '.join(sorted(unknown))}")
        if settings.get("retry_policy") is None:
            settings.pop("retry_policy", None)
        group = _checked(GroupConfig(name, created_ms=self._now_ms(), **settings))
        with self._lock:
            if name in self._groups:
                raise GroupExists(name)
            self._groups[name] = group
            self._save()
            return group

    def update(self, name: str, **changes: Any) -> GroupConfig:
        unknown = set(changes) - _FIELDS
        if unknown:
            raise InvalidArgument(f"unknown group setting(s): {', '.join(sorted(unknown))}")
        with self._lock:
            group = _checked(replace(self.get(name), **changes))
            self._groups[name] = group
            self._save()
            return group

    def delete(self, name: str) -> GroupConfig:
        with self._lock:
            group = self.get(name)
            del self._groups[name]
            self._save()
            return group

    def close(self) -> None:
        with self._lock:
            self._save()
