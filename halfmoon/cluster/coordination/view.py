"""The watched cache: every proxy and broker reads the cluster from memory, kept current by a watch.

Algorithm (one task per view):

1. **List** every key under ``/halfmoon/<cluster>/`` at one revision R and
   replace the cached map with it (so deletions missed while away are seen).
2. **Watch** the prefix from R + 1, applying each batch of events in order and
   advancing the view's revision; a change made anywhere reaches every view
   within etcd's watch latency (milliseconds on a LAN).
3. Beside the watch, ask etcd for its status every ``heartbeat_s`` (1 s),
   allowing as long again for the answer: a watch on a hung etcd or across a
   dead network path would wait silently, and the view must know it is stale.
4. When the watch breaks (etcd stopped or restarted, the connection lost),
   the heartbeat goes unanswered, or the watch's start revision was
   compacted, go back to 1 after ``retry_s`` (0.2 s, doubling to 2 s while
   etcd stays away). Meanwhile the cached map keeps answering: readers get
   the last view they had, marked ``synced = False``.

Steps 1–4 are :func:`halfmoon.cluster.coordination.follow.follow_prefix`, shared with the
other cached readers of etcd; this module is what the view does with what
it hears.

Readers never wait on etcd. :meth:`ClusterView.wait_for` lets a caller (or a
test) wait, with a deadline, until the view satisfies a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from halfmoon.broker.groups import GroupConfig
from halfmoon.cluster.coordination.etcd import EtcdClient, KeyValue, WatchBatch
from halfmoon.cluster.coordination.follow import HEARTBEAT_S, MAX_RETRY_S, RETRY_S, follow_prefix
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.coordination.placement import ClusterTopic
from halfmoon.cluster.errors import CoordinatorUnavailable

log = logging.getLogger("halfmoon.cluster.coordination.view")


@dataclass(frozen=True)
class RoutedQueue:
    queue_id: int
    broker: str
    broker_queue: int
    endpoint: str | None  # None: the broker is not registered now


class ClusterView:
    def __init__(
        self,
        client: EtcdClient,
        cluster: str,
        *,
        retry_s: float = RETRY_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.client = client
        self.keys = ClusterKeys(cluster)
        self.retry_s = retry_s
        self.heartbeat_s = heartbeat_s
        self.revision = 0
        self.synced = False
        self.resyncs = 0  # how many times the view re-listed after its first sync
        self._entries: dict[str, dict[str, Any]] = {kind: {} for kind in _PARSERS}
        # Broker groups' keys ("<group>/isr", "<group>/members/<m>", ...) → their records.
        self._group_keys: dict[str, Any] = {}
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    # Lifecycle -----------------------------------------------------------------------

    async def start(self, *, first_sync_timeout: float | None = 5.0) -> None:
        """Start following etcd; wait up to ``first_sync_timeout`` for the first listing.

        Raises :class:`CoordinatorUnavailable` if etcd did not answer in time (the view
        keeps trying in the background until :meth:`stop`).
        """
        self._task = asyncio.create_task(self._follow(), name=f"view {self.keys.prefix}")
        if first_sync_timeout is not None:
            try:
                await self.wait_for(lambda view: view.revision > 0, first_sync_timeout)
            except TimeoutError:
                raise CoordinatorUnavailable(
                    f"could not read the cluster from etcd within {first_sync_timeout} s"
                ) from None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_for(self, condition: Callable[[ClusterView], bool], timeout: float) -> None:
        """Return once ``condition(view)`` holds; TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: condition(self))

    # Reads ---------------------------------------------------------------------------

    @property
    def brokers(self) -> dict[str, dict[str, Any]]:
        return dict(self._entries["brokers"])

    @property
    def proxies(self) -> dict[str, dict[str, Any]]:
        return dict(self._entries["proxies"])

    @property
    def topics(self) -> dict[str, ClusterTopic]:
        return dict(self._entries["topics"])

    def topic(self, name: str) -> ClusterTopic | None:
        return self._entries["topics"].get(name)

    def route(self, topic: str) -> list[RoutedQueue] | None:
        """Each queue of ``topic`` with its broker's endpoint (None while that broker is down)."""
        placed = self._entries["topics"].get(topic)
        if placed is None:
            return None
        brokers = self._entries["brokers"]
        return [
            RoutedQueue(
                q.queue_id, q.broker, q.broker_queue, brokers.get(q.broker, {}).get("endpoint")
            )
            for q in placed.queues
        ]

    @property
    def groups(self) -> dict[str, GroupConfig]:
        return dict(self._entries["groups"])

    @property
    def group_keys(self) -> dict[str, Any]:
        """The broker groups' keys under ``broker-groups/`` (docs/replication.md), each
        without that prefix, with its JSON record."""
        return dict(self._group_keys)

    def setting(self, key: str, default: Any = None) -> Any:
        return self._entries["settings"].get(key, default)

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self._entries["settings"])

    # The follower --------------------------------------------------------------------

    async def _follow(self) -> None:
        await follow_prefix(
            self.client,
            self.keys.prefix,
            what="view",
            listed=self._list,
            changed=self._changed_batch,
            lost=self._lost,
            heartbeat_s=self.heartbeat_s,
            retry_s=self.retry_s,
            max_retry_s=MAX_RETRY_S,
        )

    async def _lost(self, error: BaseException) -> None:
        # The cached map keeps answering, marked stale, until the next listing.
        self.synced = False
        await self._notify()

    async def _changed_batch(self, batch: WatchBatch) -> None:
        for event in batch.events:
            self._apply(event.kind, event.kv.key, event.kv.value)
        self.revision = max(self.revision, batch.revision)
        await self._notify()

    async def _list(self, kvs: list[KeyValue], revision: int) -> None:
        fresh: dict[str, dict[str, Any]] = {kind: {} for kind in _PARSERS}
        group_keys: dict[str, Any] = {}
        for kv in kvs:
            group_key = self._group_key(kv.key)
            if group_key is not None:
                with contextlib.suppress(ValueError):
                    group_keys[group_key] = json.loads(kv.value)
                continue
            parsed = self._parse(kv.key, kv.value)
            if parsed is not None:
                kind, name, value = parsed
                fresh[kind][name] = value
        if self.revision:
            self.resyncs += 1
        self._entries = fresh
        self._group_keys = group_keys
        self.revision = revision
        self.synced = True
        log.info("event=view_synced prefix=%s revision=%d", self.keys.prefix, revision)
        await self._notify()

    def _group_key(self, key: str) -> str | None:
        prefix = self.keys.prefix + "broker-groups/"
        return key[len(prefix) :] if key.startswith(prefix) else None

    def _apply(self, kind_of_event: str, key: str, value: bytes) -> None:
        group_key = self._group_key(key)
        if group_key is not None:
            self._group_keys.pop(group_key, None)
            if kind_of_event != "DELETE":
                with contextlib.suppress(ValueError):
                    self._group_keys[group_key] = json.loads(value)
            return
        if kind_of_event == "DELETE":
            split = self.keys.split(key)
            if split is not None:
                self._entries[split[0]].pop(split[1], None)
            return
        parsed = self._parse(key, value)
        if parsed is not None:
            kind, name, entry = parsed
            self._entries[kind][name] = entry

    def _parse(self, key: str, value: bytes) -> tuple[str, str, Any] | None:
        split = self.keys.split(key)
        if split is None:
            return None
        kind, name = split
        try:
            return kind, name, _PARSERS[kind](json.loads(value))
        except (ValueError, TypeError, KeyError) as error:
            # One unreadable record must not blind the view to the rest of the cluster.
            log.warning("event=view_bad_record key=%s error=%s", key, error)
            return None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _member(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"a member record is a JSON object, not {data!r}")
    return data


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "brokers": _member,
    "proxies": _member,
    "topics": ClusterTopic.from_json,
    "groups": GroupConfig.from_dict,
    "settings": lambda value: value,
}
