"""Recall of delay messages: before their time they never arrive; after it, a clear error."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from halfmoon.broker import (
    Broker,
    BrokerConfig,
    FakeClock,
    FilterSpec,
    MessageType,
    OutgoingMessage,
)
from halfmoon.broker.recall import (
    IllegalRecallHandle,
    RecallHandle,
    RecallTooLate,
    decode,
    encode,
)
from halfmoon.errors import HalfmoonError
from tests.broker.conftest import open_real_store


def delay(at: int, body: bytes, topic: str = "d") -> OutgoingMessage:
    return OutgoingMessage(topic, body, message_type=MessageType.DELAY, delivery_timestamp=at)


def delivered(broker: Broker, topic: str = "d") -> list[bytes]:
    assert broker.store.wait_durable(broker.store.stats().commit_log_max_offset, timeout=10)
    bodies = []
    for route in broker.route(topic):
        bodies += [
            m.body
            for m in broker.pull("probe", topic, route.queue_id, 0, 1000, FilterSpec()).messages
        ]
    return sorted(bodies)


def test_handle_round_trips_and_detects_every_single_byte_change() -> None:
    handle = RecallHandle("halfmoon", "orders", 17, 123_456_789, 1_700_000_003_000, "01ABC")
    text = encode(handle)
    assert decode(text) == handle and text.isascii() and "=" not in text
    raw = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    for i in range(len(raw)):
        flipped = raw.copy()
        flipped[i] ^= 0x01
        garbled = base64.urlsafe_b64encode(bytes(flipped)).rstrip(b"=").decode()
        with pytest.raises(IllegalRecallHandle):
            decode(garbled)
    for bad in ("", "garbage", text[:-3], text + "AA", "!" * 40, "A" * 5000):
        with pytest.raises(IllegalRecallHandle) as info:
            decode(bad)
        assert info.value.code == "ILLEGAL_RECALL_HANDLE" and "recall_handle" in info.value.message


def test_recalled_before_its_time_is_never_delivered(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=2)
    now = clock.now_ms()
    kept, recalled = broker.send([delay(now + 5_000, b"kept"), delay(now + 5_000, b"recalled")])
    assert (
        kept.recall_handle
        and recalled.recall_handle
        and kept.recall_handle != recalled.recall_handle
    )
    broker.tick()
    assert broker.timer.pending == 2
    assert broker.recall("d", recalled.recall_handle) == recalled.message_id
    assert broker.timer.pending == 1 and broker.status().pending_delay_messages == 1
    clock.advance(5_000)
    broker.tick()
    assert delivered(broker) == [b"kept"]
    assert broker.timer.recalled_total == 1 and broker.timer.pending == 0
    clock.advance(60_000)
    broker.tick()
    assert delivered(broker) == [b"kept"]


def test_recall_of_an_entry_the_timer_has_not_scanned_yet(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    (sent,) = broker.send([delay(clock.now_ms() + 1_000, b"x")])
    assert sent.recall_handle
    broker.recall("d", sent.recall_handle)  # before any tick
    clock.advance(2_000)
    broker.tick()
    assert delivered(broker) == [] and broker.timer.pending == 0


def test_recall_after_delivery_is_a_clear_error(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    (sent,) = broker.send([delay(clock.now_ms() + 1_000, b"x")])
    assert sent.recall_handle
    clock.advance(1_000)
    broker.tick()
    assert delivered(broker) == [b"x"]
    with pytest.raises(RecallTooLate) as info:
        broker.recall("d", sent.recall_handle)
    assert info.value.code == "NOT_FOUND" and "already delivered" in info.value.message


def test_recalling_twice_is_idempotent_even_after_the_skip(
    broker: Broker, clock: FakeClock
) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    (sent,) = broker.send([delay(clock.now_ms() + 1_000, b"x")])
    assert sent.recall_handle
    assert broker.recall("d", sent.recall_handle) == sent.message_id
    assert broker.recall("d", sent.recall_handle) == sent.message_id
    clock.advance(1_000)
    broker.tick()
    assert broker.recall("d", sent.recall_handle) == sent.message_id  # skipped, still remembered
    assert delivered(broker) == [] and broker.timer.recalled_total == 1


def test_forged_and_misdirected_handles_are_refused_cleanly(
    broker: Broker, clock: FakeClock
) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    broker.create_topic("other", MessageType.DELAY, queue_count=1)
    (sent,) = broker.send([delay(clock.now_ms() + 1_000, b"x")])
    assert sent.recall_handle
    real = decode(sent.recall_handle)
    forgeries = [
        RecallHandle(
            real.broker,
            real.topic,
            real.timer_offset,
            real.commit_log_offset,
            real.due_ms,
            "someone-else",
        ),
        RecallHandle(
            real.broker,
            real.topic,
            real.timer_offset + 1,
            real.commit_log_offset,
            real.due_ms,
            real.message_id,
        ),
        RecallHandle(
            real.broker,
            real.topic,
            real.timer_offset,
            real.commit_log_offset + 1,
            real.due_ms,
            real.message_id,
        ),
        RecallHandle(
            real.broker, real.topic, real.timer_offset, 10**15, real.due_ms, real.message_id
        ),
        RecallHandle(
            real.broker,
            real.topic,
            real.timer_offset,
            real.commit_log_offset,
            real.due_ms + 1,
            real.message_id,
        ),
        RecallHandle(
            "another-broker",
            real.topic,
            real.timer_offset,
            real.commit_log_offset,
            real.due_ms,
            real.message_id,
        ),
    ]
    for forged in forgeries:
        with pytest.raises(IllegalRecallHandle):
            broker.recall("d", encode(forged))
    with pytest.raises(IllegalRecallHandle) as info:
        broker.recall("other", sent.recall_handle)
    assert "of topic 'other'" in info.value.message and "'d'" not in info.value.message
    with pytest.raises(HalfmoonError) as unknown:
        broker.recall("no-such-topic", sent.recall_handle)
    assert unknown.value.code == "TOPIC_NOT_FOUND"
    clock.advance(1_000)
    broker.tick()
    assert delivered(broker) == [b"x"]  # none of that touched the real message


def test_only_delay_messages_get_a_handle(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    broker.create_topic("n", MessageType.NORMAL, queue_count=1)
    (normal,) = broker.send([OutgoingMessage("n", b"n")])
    (due_now,) = broker.send([delay(clock.now_ms(), b"now")])  # its time has come: no timer
    assert normal.recall_handle is None and due_now.recall_handle is None


def test_recall_is_durable_across_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    """Recall, then drop the broker without closing it (its timer never persists again)."""
    store = open_real_store(tmp_path / "data")
    broker = Broker(store, tmp_path / "meta", BrokerConfig(), clock)
    broker.create_topic("d", MessageType.DELAY, queue_count=2)
    now = clock.now_ms()
    sent = broker.send([delay(now + 10_000 + i, f"m{i}".encode()) for i in range(6)])
    broker.tick()
    handles = [r.recall_handle for r in sent]
    assert all(handles)
    recalled = {1, 4}
    for i in recalled:
        broker.recall("d", handles[i])  # type: ignore[arg-type]
    broker.topics.close()
    store.close()  # the broker itself is abandoned, as in a crash after the recall's answer

    store = open_real_store(tmp_path / "data")
    broker = Broker(store, tmp_path / "meta", BrokerConfig(), clock)
    try:
        broker.tick()
        assert broker.timer.pending == 4
        clock.advance(20_000)
        broker.tick()
        assert delivered(broker) == sorted(f"m{i}".encode() for i in range(6) if i not in recalled)
        assert broker.timer.recalled_total == 2
        assert broker.recall("d", handles[1]) == sent[1].message_id  # still remembered
        with pytest.raises(RecallTooLate):
            broker.recall("d", handles[0])  # type: ignore[arg-type]
    finally:
        broker.close()
        store.close()


def test_due_but_not_yet_moved_by_the_timer_can_still_be_recalled(
    broker: Broker, clock: FakeClock
) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    (sent,) = broker.send([delay(clock.now_ms() + 1_000, b"x")])
    assert sent.recall_handle
    broker.tick()
    clock.advance(1_500)  # its time has come, but no tick has delivered it
    assert broker.recall("d", sent.recall_handle) == sent.message_id
    broker.tick()
    assert delivered(broker) == [] and broker.timer.recalled_total == 1
