from halfmoon.store import Message, record
from halfmoon.store.commitlog import CommitLog, segment_name
from tests.store.corrupt import segment_of, simulate_crash
from tests.store.storeutil import SEGMENT, message, open_store


def _fill(store, target_left: int, topic: str = "t") -> None:
    """Append until exactly ``target_left`` bytes remain in the current segment."""
    while True:
        position = store.stats().commit_log_max_offset
        left = SEGMENT - position % SEGMENT
        probe = record.prepare(Message(topic=topic, body=b""), "").size
        if left - target_left < probe + 2000:
            body = left - target_left - probe
            assert body >= 0
            store.append([Message(topic=topic, body=b"b" * body)])
            assert -store.stats().commit_log_max_offset % SEGMENT == target_left
            return
        store.append([Message(topic=topic, body=b"a" * 1000)])


def test_segments_are_named_by_their_start_offset(tmp_path):
    with open_store(tmp_path) as store:
        for i in range(150):
            store.append([message(i, size=1000)])
    names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
    assert names == [segment_name(i * SEGMENT) for i in range(len(names))]
    assert len(names) >= 3 and all(len(n) == 20 for n in names)


def test_record_that_does_not_fit_moves_to_next_segment_after_blank_filler(tmp_path):
    with open_store(tmp_path) as store:
        _fill(store, 500)
        filler_at = store.stats().commit_log_max_offset
        result = store.append([Message(topic="t", body=b"z" * 600)])[0]
        assert result.commit_log_offset == SEGMENT  # never straddles the boundary
        assert store.read_at(SEGMENT).body == b"z" * 600
        path, position = segment_of(tmp_path, filler_at)
        assert record.FRAME.unpack_from(path.read_bytes(), position) == (500, record.BLANK_MAGIC)
        count = store.max_offset("t", 0)
    simulate_crash(tmp_path, remove_checkpoint=True)  # full scan must cross the filler
    with open_store(tmp_path) as store:
        assert store.max_offset("t", 0) == count
        assert store.recovery.end == SEGMENT + result.size
        assert store.get("t", 0, count - 1).messages[0].body == b"z" * 600


def test_tail_too_small_for_filler_is_left_zero_and_skipped(tmp_path):
    with open_store(tmp_path) as store:
        _fill(store, 5)
        result = store.append([Message(topic="t", body=b"q" * 50)])[0]
        assert result.commit_log_offset == SEGMENT
        count = store.max_offset("t", 0)
    simulate_crash(tmp_path, remove_checkpoint=True)
    with open_store(tmp_path) as store:
        assert store.recovery.damaged == []
        assert store.max_offset("t", 0) == count
        assert store.read_at(SEGMENT).body == b"q" * 50


def test_record_exactly_filling_a_segment(tmp_path):
    with open_store(tmp_path) as store:
        _fill(store, 0)
        result = store.append([Message(topic="t", body=b"e")])[0]
        assert result.commit_log_offset == SEGMENT
    simulate_crash(tmp_path, remove_checkpoint=True)
    with open_store(tmp_path) as store:
        assert store.read_at(SEGMENT).body == b"e"


def test_commit_log_reads_and_iterates(tmp_path):
    log = CommitLog(tmp_path, SEGMENT)
    positions = []
    for i in range(100):
        prepared = record.prepare(message(i, size=900))
        positions.append(log.append(prepared, i, 1000 + i))
    assert [m.queue_offset for m in log.records(0)] == list(range(100))
    assert log.read_message(positions[42]).store_timestamp == 1042
    assert log.store_timestamp_at(positions[7]) == 1007
    assert log.sync() == log.write_position == log.flushed_position
    log.close()
