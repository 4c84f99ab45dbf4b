"""One record for several queues (``append_fanout``): one commit-log record, an entry in each
destination's consume queue, rebuilt from the record by recovery and by a replica."""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from halfmoon.store import Message, MessageStore, record
from halfmoon.store.memory import MemoryStore
from halfmoon.store.validate import IllegalMessageField, IllegalQueueId, IllegalTopic
from tests.store.crash_child import body_for
from tests.store.fanout_child import QUEUES
from tests.store.storeutil import message, open_store
from tests.store.test_shipping import ship_all

ROOT = Path(__file__).resolve().parents[2]
OTHERS = [(f"q{i}", 0) for i in range(1, 10)]


def read_all(store: MessageStore | MemoryStore, topic: str, queue_id: int = 0) -> list:
    got = store.get(topic, queue_id, store.min_offset(topic, queue_id), 1000)
    return got.messages


def test_one_record_is_indexed_into_every_destination(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        before = store.end_offset
        results = store.append_fanout(message(1, topic="q0"), OTHERS)
        assert store.end_offset - before == results[0].size  # one record, not ten
        assert [(r.topic, r.queue_id, r.queue_offset) for r in results] == [
            ("q0", 0, 0),
            *[(t, q, 0) for t, q in OTHERS],
        ]
        assert {(r.commit_log_offset, r.size) for r in results} == {(before, results[0].size)}
        for topic in ["q0", *(t for t, _ in OTHERS)]:
            [got] = read_all(store, topic)
            assert (got.topic, got.queue_id, got.queue_offset) == (topic, 0, 0)
            assert got.commit_log_offset == before
            assert got.body == message(1).body
            assert got.unique_id == "id-q0-1"
            assert got.sys_flag == 0  # the store's own bit never shows
            [by_key] = store.query_by_key(topic, "key-1")
            assert (by_key.topic, by_key.queue_offset) == (topic, 0)
        first = store.read_at(before)
        assert first.topic == "q0"
        assert first.destinations == tuple((t, q, 0) for t, q in OTHERS)


def test_each_destination_gets_its_own_next_queue_offset(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.append([message(i, topic="a") for i in range(3)])
        store.append([message(9, topic="b", queue_id=2)])
        results = store.append_fanout(message(5, topic="a"), [("b", 2), ("c", 1)])
        assert [(r.topic, r.queue_id, r.queue_offset) for r in results] == [
            ("a", 0, 3),
            ("b", 2, 1),
            ("c", 1, 0),
        ]
        store.append([message(6, topic="b", queue_id=2)])
        assert [m.queue_offset for m in read_all(store, "b", 2)] == [0, 1, 2]
        assert [m.body for m in read_all(store, "b", 2)] == [
            message(9).body,
            message(5).body,
            message(6).body,
        ]
        assert store.max_offset("c", 1) == 1


def test_two_queues_of_one_topic_each_see_their_own_place(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.append([message(0, topic="t", queue_id=1)])
        store.append_fanout(message(1, topic="t", queue_id=0), [("t", 1)])
        [first] = read_all(store, "t", 0)
        assert (first.queue_id, first.queue_offset) == (0, 0)
        in_second = read_all(store, "t", 1)
        assert [(m.queue_id, m.queue_offset) for m in in_second] == [(1, 0), (1, 1)]
        assert in_second[1].body == message(1).body


@pytest.mark.parametrize(
    ("others", "error"),
    [
        ([("q1", 0), ("q1", 0)], IllegalMessageField),
        ([("q0", 0)], IllegalMessageField),  # the message's own queue again
        ([("bad topic", 0)], IllegalTopic),
        ([("q1", -1)], IllegalQueueId),
    ],
)
def test_bad_destinations_are_refused_before_anything_is_written(
    tmp_path: Path, others: list[tuple[str, int]], error: type[Exception]
) -> None:
    with open_store(tmp_path) as store:
        end = store.end_offset
        with pytest.raises(error):
            store.append_fanout(message(1, topic="q0"), others)
        assert store.end_offset == end
        assert list(store.queues()) == []


def test_the_store_bit_cannot_be_set_by_a_sender(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        flagged = message(1)
        flagged.sys_flag = record.DESTINATIONS_FLAG
        with pytest.raises(IllegalMessageField, match="DESTINATIONS"):
            store.append([flagged])


def test_a_fanout_read_back_is_appended_again_as_a_plain_message(tmp_path: Path) -> None:
    """What a retry or dead letter does: the copy is a message of one queue."""
    with open_store(tmp_path) as store:
        store.append_fanout(message(1, topic="q0"), OTHERS)
        [got] = read_all(store, "q3")
        again = Message(
            got.topic, got.body, got.queue_id, dict(got.properties), sys_flag=got.sys_flag
        )
        [result] = store.append([again])
        assert store.read_at(result.commit_log_offset).destinations == ()


def test_every_entry_is_rebuilt_from_the_record_when_the_queues_are_lost(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        for i in range(20):
            store.append_fanout(message(i, topic="q0"), OTHERS)
            store.append([message(100 + i, topic="q5")])
    shutil.rmtree(tmp_path / "consumequeue")
    with open_store(tmp_path) as store:
        assert ("q5", 0) in store.recovery.rebuilt_queues
        for topic in ["q0", *(t for t, _ in OTHERS)]:
            got = read_all(store, topic)
            assert [m.queue_offset for m in got] == list(range(len(got)))
            assert [m.topic for m in got] == [topic] * len(got)
        assert len(read_all(store, "q1")) == 20
        assert len(read_all(store, "q5")) == 40  # its own twenty and the fanouts'


def test_a_replica_indexes_every_destination_of_a_shipped_record(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "r") as replica:
        master.append([message(0, topic="q1")])
        master.append_fanout(message(1, topic="q0"), OTHERS)
        ship_all(master, replica)
        assert [m.queue_offset for m in read_all(replica, "q1")] == [0, 1]
        for topic, _ in OTHERS[1:]:
            [got] = read_all(replica, topic)
            assert got.topic == topic and got.body == message(1).body
        assert replica.max_offset("q9", 0) == 1
        # The replica assigns the next offsets where the master would.
        [after] = replica.append([message(2, topic="q9")])
        assert after.queue_offset == 1


def test_a_destination_list_that_does_not_parse_is_a_bad_record() -> None:
    buffer = record.encode_unsealed(message(1, topic="q0"))
    record.add_destinations(buffer, "q0", [("q1", 0)])
    record.seal(buffer, 0, 0, 0)
    assert record.decode(bytes(buffer)).destinations == (("q1", 0, 0),)
    # One byte fewer in the list, size and CRC made to agree: the fields do not parse.
    cut = buffer[:-1]
    struct.pack_into(">I", cut, 0, len(cut))
    record.seal(cut, 0, 0, 0)
    with pytest.raises(record.RecordError) as caught:
        record.decode(bytes(cut))
    assert caught.value.reason == "bad_fields"


@pytest.mark.parametrize(
    "names",
    [
        ["q1"],
        ["q00", "q0", "q", "r", "q0"],  # longer, shorter, nothing shared, shared again
        ["amq-2egen-" + "x" * 117, "amq-2egen-" + "y" * 117, "a"],
    ],
)
def test_destination_topics_round_trip_through_their_shared_prefixes(names: list[str]) -> None:
    buffer = record.encode_unsealed(message(1, topic="q0"))
    record.add_destinations(buffer, "q0", [(n, i) for i, n in enumerate(names)])
    record.seal(buffer, 5, 0, 0)
    decoded = record.decode(bytes(buffer))
    assert decoded.destinations == tuple((n, i, 0) for i, n in enumerate(names))
    assert (decoded.topic, decoded.queue_offset) == ("q0", 5)


def _v1_record(topic: str, queue_id: int, queue_offset: int, position: int, body: bytes) -> bytes:
    """A record as docs/storage-format.md gives it, built by hand (no encoder of this code)."""
    names = b"".join(bytes((len(s),)) + s for s in (topic.encode(), b"10.0.0.7:5000", b"h:1"))
    props = b"TAGS\x01new\x02UNIQ_KEY\x01old-" + str(queue_offset).encode() + b"\x02"
    fields = (
        struct.pack(">iiqqiqqiqI", queue_id, 0, queue_offset, position, 0,
                    1700000000000, 1700000000005, 0, 0, len(body))
        + body + names + struct.pack(">H", len(props)) + props
    )  # fmt: skip
    total = 12 + len(fields)
    return struct.pack(">II", total, 0x484D3031) + struct.pack(">I", zlib.crc32(fields)) + fields


def test_a_data_directory_of_the_earlier_format_opens_and_takes_fanouts(tmp_path: Path) -> None:
    segment = bytearray(64 * 1024)  # the size storeutil's stores use
    position = 0
    for queue_offset in range(3):
        data = _v1_record("orders", 1, queue_offset, position, b"hi%d" % queue_offset)
        segment[position : position + len(data)] = data
        position += len(data)
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(bytes(segment))
    with open_store(tmp_path) as store:  # no checkpoint: recovery scans and indexes
        assert store.recovery.end == position
        got = read_all(store, "orders", 1)
        assert [m.body for m in got] == [b"hi0", b"hi1", b"hi2"]
        assert store.query_by_key("orders", "old-2")[0].queue_offset == 2
        results = store.append_fanout(message(7, topic="orders", queue_id=1), [("other", 0)])
        assert [r.queue_offset for r in results] == [3, 0]
    with open_store(tmp_path) as store:
        assert [m.body for m in read_all(store, "orders", 1)][-1] == message(7).body
        assert read_all(store, "other")[0].commit_log_offset == position


def test_the_memory_store_holds_a_fanout_as_the_real_one_does() -> None:
    store = MemoryStore()
    store.append([message(0, topic="q2")])
    results = store.append_fanout(message(1, topic="q0"), OTHERS)
    assert len({r.commit_log_offset for r in results}) == 1
    assert [(m.topic, m.queue_offset) for m in read_all(store, "q2")] == [("q2", 0), ("q2", 1)]
    assert store.query_by_key("q4", "key-1")[0].topic == "q4"
    with pytest.raises(IllegalMessageField):
        store.append_fanout(message(2, topic="q0"), [("q1", 0), ("q1", 0)])


# -- crash: SIGKILL of a real process appending fanouts under sync flush ---------------------


def _run_and_kill(data_dir: Path, round_number: int, rng: random.Random) -> dict[str, int]:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.store.fanout_child", str(data_dir), str(round_number), "4"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: dict[str, int] = {}
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first == "ready\n", first + (child.stderr.read() if child.stderr else "")
        target = rng.randint(20, 200)
        for line in child.stdout:
            _, offset, message_id = line.split()
            acked[message_id] = int(offset)
            if len(acked) >= target:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.stdout is not None
    for line in child.stdout.read().splitlines():  # acked before the kill, still in the pipe
        parts = line.split()
        if len(parts) == 3:
            acked[parts[2]] = int(parts[1])
    return acked


def _is_fanout(message_id: str) -> bool:
    return int(message_id.rsplit("-", 1)[1]) % 4 != 3  # the child's every fourth is plain


@pytest.mark.parametrize("lose_queues", [False, True], ids=["queues-kept", "queues-lost"])
def test_acknowledged_fanouts_are_in_every_queue_after_sigkill(
    tmp_path: Path, lose_queues: bool
) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    data_dir = tmp_path / "store"
    acked: dict[str, int] = {}
    for round_number in range(3):
        acked.update(_run_and_kill(data_dir, round_number, rng))
        if lose_queues:
            shutil.rmtree(data_dir / "consumequeue", ignore_errors=True)
        with open_store(data_dir, segment_size=256 * 1024) as store:
            assert store.recovery.crashed
            ids: dict[str, list[str]] = {}
            for topic in QUEUES:
                got = read_all(store, topic)
                assert [m.queue_offset for m in got] == list(range(len(got)))  # dense, in order
                assert all(m.body == body_for(m.unique_id) for m in got)
                ids[topic] = [m.unique_id for m in got]
            for message_id, offset in acked.items():
                whole = store.read_at(offset)
                assert whole.unique_id == message_id
                in_queues = [t for t in QUEUES if message_id in ids[t]]
                assert in_queues == (QUEUES if _is_fanout(message_id) else QUEUES[:1])
                assert len(whole.destinations) == (9 if _is_fanout(message_id) else 0)
    assert len(acked) >= 60
