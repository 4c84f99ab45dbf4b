"""Following an etcd prefix: list it, watch it from the list's revision, start afresh on failure.

Every cached reader of etcd (the cluster view, the auth document, a proxy
worker's relayed commands) needs the same loop:

1. ``get_prefix`` gives what is there now and the revision it was read at;
2. a watch from the next revision gives every change after it, so nothing
   falls between the list and the watch;
3. beside the watch, a ping every ``heartbeat_s`` (allowing as long again for
   the answer): a watch on a hung etcd, or across a dropped connection, waits
   silently and must not be taken for a quiet cluster;
4. when any of it fails (etcd stopped or restarted, the connection lost, the
   watch's revision compacted away), wait ``retry_s`` doubling up to
   ``max_retry_s`` and list again: the list replaces the reader's state, so a
   change missed while disconnected is not missed for good.

The reader supplies what to do with a listing, a watch batch, and a failure;
this loop never stops by itself (cancel its task to stop it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from halfmoon.cluster.coordination.etcd import EtcdClient, KeyValue, WatchBatch, WatchCompacted
from halfmoon.cluster.errors import CoordinatorUnavailable

log = logging.getLogger("halfmoon.cluster.coordination.follow")

HEARTBEAT_S = 1.0
RETRY_S = 0.2
MAX_RETRY_S = 2.0


async def follow_prefix(
    client: EtcdClient,
    prefix: str,
    *,
    what: str,
    listed: Callable[[list[KeyValue], int], Awaitable[None]],
    changed: Callable[[WatchBatch], Awaitable[None]],
    lost: Callable[[BaseException], Awaitable[None]] | None = None,
    heard: Callable[[], None] | None = None,
    progress_notify: bool = True,
    heartbeat_s: float = HEARTBEAT_S,
    retry_s: float = RETRY_S,
    max_retry_s: float = MAX_RETRY_S,
) -> None:
    """Follow ``prefix`` forever.

    ``listed(kvs, revision)`` gets each fresh listing, ``changed(batch)`` each
    watch answer after it (progress notes included), ``lost(error)`` each
    interruption before the wait and the next listing. ``heard()`` is called
    whenever etcd answered (a listing, a batch, a ping): a reader that must
    refuse work after a long silence times it from there. ``what`` names the
    reader in the log.
    """
    note_heard = heard or (lambda: None)

    async def watch(revision: int) -> None:
        async for batch in client.watch_prefix(
            prefix, revision + 1, progress_notify=progress_notify
        ):
            note_heard()
            await changed(batch)

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(heartbeat_s)
            await client.ping(timeout_s=heartbeat_s)
            note_heard()

    delay = retry_s
    while True:
        try:
            kvs, revision = await client.get_prefix(prefix)
            note_heard()
            await listed(kvs, revision)
            delay = retry_s
            await first_to_fail(watch(revision), heartbeat())
        except (CoordinatorUnavailable, WatchCompacted) as error:
            log.warning("event=follow_interrupted what=%s prefix=%s error=%s", what, prefix, error)
            if lost is not None:
                await lost(error)
        except Exception as error:
            # A bug or an answer we cannot read: log it and follow afresh, never stop.
            log.exception("event=follow_failed what=%s prefix=%s", what, prefix)
            if lost is not None:
                await lost(error)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_retry_s)


async def first_to_fail(*jobs: Coroutine[Any, Any, None]) -> None:
    """Run ``jobs`` until one ends; cancel the others; raise what that one raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()
