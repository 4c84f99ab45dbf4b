import threading
import time

import pytest

from halfmoon.store import GetStatus, Message, MessageStore, Store, StoreClosed, tag_hash
from tests.store.storeutil import message, open_store


def test_message_store_satisfies_the_protocol(tmp_path):
    with open_store(tmp_path) as store:
        assert isinstance(store, Store)
        assert isinstance(store, MessageStore)


def test_get_statuses(tmp_path):
    with open_store(tmp_path) as store:
        assert store.get("orders", 0, 0).status is GetStatus.NO_SUCH_QUEUE
        store.put([message(i) for i in range(5)])
        assert store.get("orders", 0, 5).status is GetStatus.NO_MESSAGE
        over = store.get("orders", 0, 9)
        assert over.status is GetStatus.OFFSET_OVERFLOW and over.next_offset == 5
        found = store.get("orders", 0, 1, max_messages=2)
        assert found.status is GetStatus.FOUND and found.next_offset == 3
        assert [m.queue_offset for m in found.messages] == [1, 2]


def test_max_bytes_returns_at_least_one(tmp_path):
    with open_store(tmp_path) as store:
        results = store.put([message(i, size=1000) for i in range(5)])
        got = store.get("orders", 0, 0, max_bytes=results[0].size * 2)
        assert len(got.messages) == 2 and got.next_offset == 2
        assert len(store.get("orders", 0, 0, max_bytes=1).messages) == 1


def test_tag_filter_and_predicate_skip_and_advance(tmp_path):
    with open_store(tmp_path) as store:
        store.put([message(i, TAGS="red" if i % 3 == 0 else "blue") for i in range(30)])
        red = store.get("orders", 0, 0, 100, tag_hashes=frozenset({tag_hash("red")}))
        assert [m.queue_offset for m in red.messages] == list(range(0, 30, 3))
        assert red.next_offset == 30
        none = store.get("orders", 0, 0, 100, tag_hashes=frozenset({tag_hash("green")}))
        assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_offset == 30
        odd = store.get("orders", 0, 0, 100, predicate=lambda m: m.queue_offset % 2 == 1)
        assert len(odd.messages) == 15


def test_filtered_scan_is_bounded(tmp_path):
    with open_store(tmp_path, max_scan_entries=50, cq_entries_per_file=1000) as store:
        store.append([message(i, size=10) for i in range(200)])
        got = store.get("orders", 0, 0, 10, tag_hashes=frozenset({tag_hash("none")}))
        assert got.status is GetStatus.NO_MATCHED_MESSAGE and got.next_offset == 50


def test_queue_offsets_are_per_queue_and_survive_restart(tmp_path):
    with open_store(tmp_path) as store:
        store.put([message(i, queue_id=i % 3) for i in range(9)])
        store.put([message(i, topic="other") for i in range(4)])
        assert sorted(store.queues()) == [("orders", 0), ("orders", 1), ("orders", 2), ("other", 0)]
    with open_store(tmp_path) as store:
        assert store.put([message(9, queue_id=1)])[0].queue_offset == 3
        assert store.max_offset("other", 0) == 4


def test_concurrent_appends_get_dense_offsets(tmp_path):
    with open_store(tmp_path) as store:

        def work(n):
            for i in range(100):
                store.append([message(n * 1000 + i, size=50)])

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = store.get("orders", 0, 0, 1000)
        assert [m.queue_offset for m in got.messages] == list(range(800))


def test_sync_group_commit_shares_fsyncs(tmp_path):
    with open_store(tmp_path, flush="sync", segment_size=4 << 20) as store:

        def work(n):
            for i in range(30):
                store.put([message(n * 1000 + i, queue_id=n % 4, size=200)])

        threads = [threading.Thread(target=work, args=(n,)) for n in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        extra = store.stats().extra
        assert extra["appends"] == 64 * 30
        assert extra["fsyncs"] < extra["appends"] / 2
        assert store.stats().commit_log_flushed_offset == store.stats().commit_log_max_offset


def test_sync_visibility_waits_for_fsync(tmp_path):
    with open_store(tmp_path, flush="sync") as store:
        seen = []
        visible_when_called = []
        store.add_listener(
            lambda r: (seen.append(r), visible_when_called.append(store.max_offset("orders", 0)))
        )
        gate = threading.Event()
        real_sync = store._commitlog.sync
        store._commitlog.sync = lambda up_to=None: (gate.wait(10), real_sync(up_to))[1]
        result = store.append([message(0)])[0]
        future = store.durable(result.end_offset)
        assert not future.done()
        assert store.get("orders", 0, 0).messages == []
        assert store.max_offset("orders", 0) == 0 and seen == []
        gate.set()
        future.result(10)
        assert store.wait_durable(result.end_offset, 10)
        assert store.get("orders", 0, 0).messages[0].unique_id == "id-orders-0"
        assert seen == [result] and visible_when_called == [1]


def test_async_listener_fires_on_append_and_durable_is_done(tmp_path):
    with open_store(tmp_path) as store:
        seen = []
        store.add_listener(seen.append)
        store.add_listener(lambda r: 1 / 0)  # logged, kept, others still called
        result = store.append([message(0)])[0]
        assert seen == [result] and store.durable(result.end_offset).done()


def test_query_by_key_and_unique_id_with_time_range(tmp_path):
    clock = {"now": 1000.0}
    with open_store(tmp_path, store_kwargs={"clock": lambda: clock["now"]}) as store:
        store.put([message(1)])
        clock["now"] = 2000.0
        store.put([message(2, KEYS="key-1 extra")])
        store.put([message(3, topic="elsewhere", KEYS="key-1")])
        assert [m.unique_id for m in store.query_by_key("orders", "key-1")] == [
            "id-orders-2",
            "id-orders-1",
        ]
        assert [m.unique_id for m in store.query_by_key("orders", "key-1", 1_500_000)] == [
            "id-orders-2"
        ]
        assert store.query_by_key("orders", "id-orders-1")[0].queue_offset == 0
        assert store.query_by_key("orders", "missing") == []


def test_offset_for_timestamp(tmp_path):
    clock = {"now": 1000.0}
    with open_store(tmp_path, store_kwargs={"clock": lambda: clock["now"]}) as store:
        for i in range(10):
            clock["now"] = 1000.0 + i
            store.put([message(i)])
        assert store.offset_for_timestamp("orders", 0, 1_004_000) == 4
        assert store.offset_for_timestamp("orders", 0, 0) == 0
        assert store.offset_for_timestamp("orders", 0, 9_999_999) == 10


def test_delete_topic_stays_deleted_after_restart(tmp_path):
    with open_store(tmp_path) as store:
        store.put([message(i) for i in range(5)])
        store.delete_topic("orders")
        assert store.get("orders", 0, 0).status is GetStatus.NO_SUCH_QUEUE
    with open_store(tmp_path) as store:
        assert store.max_offset("orders", 0) == 0 and list(store.queues()) == []


def test_read_at_and_closed_store(tmp_path):
    store = open_store(tmp_path)
    result = store.put([Message(topic="t", body=b"abc")])[0]
    assert store.read_at(result.commit_log_offset).body == b"abc"
    store.close()
    with pytest.raises(StoreClosed):
        store.append([Message(topic="t", body=b"x")])


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_batch_listener_hears_each_visible_batch_once_in_log_order(tmp_path, flush):
    with open_store(tmp_path, flush=flush) as store:
        batches: list[list] = []
        each: list = []
        store.add_batch_listener(batches.append)
        store.add_batch_listener(lambda results: 1 / 0)  # logged, kept, others still called
        store.add_listener(each.append)
        results = store.append([message(0), message(1), message(2, topic="elsewhere")])
        deadline = time.monotonic() + 10  # under sync, the flush thread tells the listeners
        while len(each) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        heard = [r for batch in batches for r in batch]
        assert heard == results == each  # every message heard, each once, in log order
        assert len(batches) == 1  # one append, one flush: one call


def test_the_memory_store_hears_batches_too():
    from halfmoon.store.memory import MemoryStore

    store = MemoryStore()
    batches: list[list] = []
    store.add_batch_listener(batches.append)
    results = store.append([message(0), message(1)])
    assert batches == [results]
