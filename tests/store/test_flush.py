"""Group commit: how waiters share fsyncs (flush.GroupCommitFlusher through the store)."""

from __future__ import annotations

import threading

from halfmoon.store import GetStatus
from tests.store.storeutil import message, open_store


def test_put_returns_only_once_its_message_is_visible(tmp_path):
    with open_store(tmp_path, flush="sync") as store:
        for i in range(20):
            result = store.put([message(i)])[0]
            got = store.get("orders", 0, result.queue_offset, 1)
            assert got.status is GetStatus.FOUND
            assert got.messages[0].commit_log_offset == result.commit_log_offset


def test_cancelling_a_shared_durable_future_does_not_cancel_it_for_others(tmp_path):
    with open_store(tmp_path, flush="sync") as store:
        results = store.append([message(0), message(1)])
        first = store.durable(results[0].end_offset)
        second = store.durable(results[1].end_offset)
        first.cancel()  # e.g. an asyncio task wrapping it was cancelled
        assert first.result(timeout=10) is None
        assert second.result(timeout=10) is None
        assert not first.cancelled() and not second.cancelled()


def test_durable_for_bytes_not_yet_written_waits_for_them(tmp_path):
    with open_store(tmp_path, flush="sync") as store:
        end = store.put([message(0)])[0].end_offset
        ahead = store.durable(end + 150)
        store.put([message(1, size=10)])  # ends before end + 150
        assert store.wait_durable(store.stats().commit_log_max_offset, 10)
        assert not ahead.done()
        store.put([message(2, size=200)])
        assert ahead.result(timeout=10) is None


def test_concurrent_put_writers_all_acknowledged_with_shared_fsyncs(tmp_path):
    threads, per_thread = 16, 25
    errors: list[BaseException] = []
    with open_store(tmp_path, flush="sync", segment_size=1024 * 1024) as store:

        def writer(t: int) -> None:
            try:
                for i in range(per_thread):
                    result = store.put([message(t * 1000 + i, queue_id=t % 4)])[0]
                    assert result.end_offset <= store.stats().commit_log_flushed_offset
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
        stats = store.stats()
        assert stats.extra["appends"] == threads * per_thread
        assert stats.extra["fsyncs"] < threads * per_thread
        assert sum(store.max_offset("orders", q) for q in range(4)) == threads * per_thread


def test_close_completes_every_waiter(tmp_path):
    store = open_store(tmp_path, flush="sync")
    results = store.append([message(i) for i in range(10)])
    futures = [store.durable(r.end_offset) for r in results]
    store.close()
    for future in futures:
        assert future.result(timeout=10) is None
    # After close, bytes already durable are reported done at once.
    assert store.durable(results[-1].end_offset).done()
