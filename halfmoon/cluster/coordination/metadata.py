"""The cluster's topics, groups and runtime settings, written to etcd.

Creation is a compare-and-swap on the key's create revision: of two proxies
creating the same topic at once, one writes and both return the record that
was stored, so every proxy routes the topic the same way. Changes to an
existing record compare its modification revision, so a change computed from
a stale read is refused (:class:`CoordinatorConflict`) instead of lost.

Reads here go to etcd; processes that serve clients read the watched cache
(:mod:`halfmoon.cluster.coordination.view`) instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from halfmoon.broker.config import DEFAULT_QUEUE_COUNT
from halfmoon.broker.errors import GroupNotFound, TopicNotFound
from halfmoon.broker.groups import GroupConfig, check_group_name
from halfmoon.broker.message import MessageType
from halfmoon.broker.topics import check_perm, check_queue_count, check_topic_name
from halfmoon.cluster.coordination.etcd import Compare, EtcdClient, put_op
from halfmoon.cluster.coordination.etcd_json import KeyValue
from halfmoon.cluster.coordination.keys import ClusterKeys, check_name
from halfmoon.cluster.coordination.placement import ClusterTopic, place_queues
from halfmoon.cluster.errors import CoordinatorConflict
from halfmoon.errors import InvalidArgument

DEFAULT_QUEUES = DEFAULT_QUEUE_COUNT


def encode(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _now_ms() -> int:
    return int(time.time() * 1000)


class ClusterMetadata:
    def __init__(
        self, client: EtcdClient, cluster: str, now_ms: Callable[[], int] = _now_ms
    ) -> None:
        self.client = client
        self.keys = ClusterKeys(cluster)
        self.now_ms = now_ms

    async def live_brokers(self) -> dict[str, dict[str, Any]]:
        """The brokers registered now (their lease alive), by name."""
        kvs, _ = await self.client.get_prefix(self.keys.kind_prefix("brokers"))
        found = {}
        for kv in kvs:
            split = self.keys.split(kv.key)
            if split is not None:
                found[split[1]] = kv.json()
        return found

    # Topics --------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        queues: int = DEFAULT_QUEUES,
        brokers: Sequence[str] = (),
        message_type: str = "normal",
        perm: str = "rw",
    ) -> tuple[ClusterTopic, bool]:
        """Place and store topic ``name``, unless it exists. Returns (the stored topic, created)."""
        check_topic_name(name)
        check_queue_count(queues)
        check_perm(perm)
        try:
            MessageType(message_type)
        except ValueError:
            kinds = ", ".join(t.value for t in MessageType)
            raise InvalidArgument(
                f"illegal message type {message_type!r}: use one of {kinds}"
            ) from None
        for broker in brokers:
            check_name("broker", broker)
        existing = await self.get_topic(name)
        if existing is not None:
            return existing, False
        placed = place_queues(name, queues, await self.live_brokers(), brokers)
        topic = ClusterTopic(name, placed, message_type, perm, self.now_ms())
        created, stored = await self.client.create(self.keys.topic(name), encode(topic.to_json()))
        return ClusterTopic.from_json(stored.json()), created

    async def get_topic(self, name: str) -> ClusterTopic | None:
        kv = await self.client.get(self.keys.topic(name))
        return ClusterTopic.from_json(kv.json()) if kv is not None else None

    async def list_topics(self) -> list[ClusterTopic]:
        kvs, _ = await self.client.get_prefix(self.keys.kind_prefix("topics"))
        return [ClusterTopic.from_json(kv.json()) for kv in kvs]

    async def update_topic(
        self, name: str, change: Callable[[ClusterTopic], ClusterTopic]
    ) -> ClusterTopic:
        """Apply ``change`` to the stored topic, if nobody changed it since it was read."""
        kv = await self.client.get(self.keys.topic(name))
        if kv is None:
            raise TopicNotFound(name)
        topic = change(ClusterTopic.from_json(kv.json()))
        if topic.name != name:
            raise InvalidArgument(f"a topic cannot be renamed ({name!r} to {topic.name!r})")
        await self._swap(kv, encode(topic.to_json()))
        return topic

    async def set_topic_perm(self, name: str, perm: str) -> ClusterTopic:
        check_perm(perm)
        return await self.update_topic(
            name,
            lambda t: replace(t, perm=perm),
        )

    async def set_topic_trace(self, name: str, trace: bool) -> ClusterTopic:
        return await self.update_topic(name, lambda t: replace(t, trace=trace))

    async def delete_topic(self, name: str) -> bool:
        return await self.client.delete(self.keys.topic(name))

    # Groups --------------------------------------------------------------------------

    async def create_group(self, group: GroupConfig) -> tuple[GroupConfig, bool]:
        check_group_name(group.name)
        if not group.created_ms:
            group = GroupConfig.from_dict({**group.to_dict(), "created_ms": self.now_ms()})
        created, stored = await self.client.create(
            self.keys.group(group.name), encode(group.to_dict())
        )
        return GroupConfig.from_dict(stored.json()), created

    async def get_group(self, name: str) -> GroupConfig | None:
        kv = await self.client.get(self.keys.group(name))
        return GroupConfig.from_dict(kv.json()) if kv is not None else None

    async def list_groups(self) -> list[GroupConfig]:
        kvs, _ = await self.client.get_prefix(self.keys.kind_prefix("groups"))
        return [GroupConfig.from_dict(kv.json()) for kv in kvs]

    async def update_group(
        self, name: str, change: Callable[[GroupConfig], GroupConfig]
    ) -> GroupConfig:
        kv = await self.client.get(self.keys.group(name))
        if kv is None:
            raise GroupNotFound(name)
        group = change(GroupConfig.from_dict(kv.json()))
        if group.name != name:
            raise InvalidArgument(f"a group cannot be renamed ({name!r} to {group.name!r})")
        await self._swap(kv, encode(group.to_dict()))
        return group

    async def delete_group(self, name: str) -> bool:
        return await self.client.delete(self.keys.group(name))

    # Settings ------------------------------------------------------------------------

    async def set_setting(self, key: str, value: Any) -> None:
        try:
            raw = encode(value)
        except (TypeError, ValueError) as error:
            raise InvalidArgument(f"setting {key!r} must be a JSON value: {error}") from None
        await self.client.put(self.keys.setting(key), raw)

    async def get_setting(self, key: str, default: Any = None) -> Any:
        kv = await self.client.get(self.keys.setting(key))
        return kv.json() if kv is not None else default

    async def settings(self) -> dict[str, Any]:
        kvs, _ = await self.client.get_prefix(self.keys.kind_prefix("settings"))
        found = {}
        for kv in kvs:
            split = self.keys.split(kv.key)
            if split is not None:
                found[split[1]] = kv.json()
        return found

    async def delete_setting(self, key: str) -> bool:
        return await self.client.delete(self.keys.setting(key))

    # Helpers -------------------------------------------------------------------------

    async def _swap(self, read: KeyValue, value: bytes) -> None:
        result = await self.client.txn(
            [Compare(read.key, "MOD", read.mod_revision)], [put_op(read.key, value)]
        )
        if not result.succeeded:
            raise CoordinatorConflict(
                f"{read.key} changed while this change was being made; read it again and retry"
            )
