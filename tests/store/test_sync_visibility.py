"""Sync flush: a record an fsync covers becomes visible, even when the fsync ran in the middle of
its append.

The flusher reads the commit log's write position without the append lock.
An append writes its records first and queues them for visibility after, so
an fsync can start (and finish) between the two. The record is then durable,
``durable()`` answers at once, and it must still become visible and reach
the listeners with that fsync, not only with some later one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from halfmoon.store import GetStatus, MessageStore
from tests.store.storeutil import message, open_store

WAIT_S = 10.0


@contextmanager
def fsync_inside_next_append(store: MessageStore) -> Iterator[None]:
    """Make the next append's first record get fsynced between its write and the end of its append.

    The hook sits at the record's consume-queue dispatch (after the commit-log
    write, before the append finishes): it wakes the flusher and waits, still
    inside the append, until the fsync that covers the record has returned
    (the append fails if it did not).
    """
    queues, commitlog = store._queues, store._commitlog
    real_put, real_sync = queues.put, commitlog.sync
    synced = threading.Condition()
    covered = threading.Event()

    def sync(up_to: int | None = None) -> int:
        flushed = real_sync(up_to)
        with synced:
            synced.notify_all()
        return flushed

    def put(*args: Any, **kwargs: Any) -> Any:
        result = real_put(*args, **kwargs)
        if covered.is_set():  # once: the append bound this hook for all its records
            return result
        written = commitlog.write_position
        with synced:
            # The flusher is idle: this starts an fsync of the written bytes.
            store._visibility.flusher.written()
            synced.wait_for(lambda: commitlog.flushed_position >= written, WAIT_S)
        covered.set()
        assert commitlog.flushed_position >= written, "the fsync did not run inside the append"
        return result

    commitlog.sync = sync
    queues.put = put
    try:
        yield
    finally:
        queues.put = real_put
        commitlog.sync = real_sync


def collect(store: MessageStore) -> tuple[list[Any], threading.Event]:
    """The append results the store's listeners are told of, and an event set by the first."""
    seen: list[Any] = []
    arrived = threading.Event()

    def listener(result: Any) -> None:
        seen.append(result)
        arrived.set()

    store.add_listener(listener)
    return seen, arrived


def test_a_record_fsynced_during_its_own_append_is_visible_and_announced(tmp_path) -> None:
    with open_store(tmp_path, flush="sync") as store:
        seen, arrived = collect(store)
        with fsync_inside_next_append(store):
            (result,) = store.append([message(1)])
        assert store.durable(result.end_offset).result(timeout=WAIT_S) is None  # acknowledged...
        got = store.get("orders", 0, result.queue_offset, 1)
        assert got.status is GetStatus.FOUND, got.status  # ...so it must be readable from its queue
        assert got.messages[0].commit_log_offset == result.commit_log_offset
        assert arrived.wait(WAIT_S) and [r.commit_log_offset for r in seen] == [
            result.commit_log_offset
        ]


def test_records_after_the_fsynced_one_wait_for_their_own_fsync(tmp_path) -> None:
    with open_store(tmp_path, flush="sync") as store:
        with fsync_inside_next_append(store):
            first, second = store.append(
                [message(1), message(2)]
            )  # the fsync covers only the first
        assert store.durable(second.end_offset).result(timeout=WAIT_S) is None
        got = store.get("orders", 0, 0, 10)
        assert [m.commit_log_offset for m in got.messages] == [
            first.commit_log_offset,
            second.commit_log_offset,
        ]
