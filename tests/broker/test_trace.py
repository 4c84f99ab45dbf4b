"""The message trace (halfmoon/broker/trace.py): what the broker records, where it keeps it,
and that it never reaches a consumer or a backlog."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.topics import TRACE_TOPIC
from halfmoon.broker.trace import KEYS_PER_RECORD, TraceRecorder, position_key
from halfmoon.broker.transactions import TransactionConfig
from halfmoon.store.memory import MemoryStore

from .test_check_service import RecordingSender

ANY = FilterSpec()


def events(broker: Broker, message_id: str) -> list[tuple[Any, ...]]:
    """(event, group, attempt, source) of each recorded event, oldest first."""
    return [
        (e["event"], e.get("group"), e.get("attempt"), e.get("source"))
        for e in broker.message_trace(message_id)
    ]


def send(broker: Broker, topic: str = "orders", **kw: Any) -> str:
    return broker.send([OutgoingMessage(topic, b"body", **kw)])[0].message_id


def test_pop_delivery_retry_and_ack_are_recorded(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("orders", queue_count=1)
    message_id = send(broker)
    (first,) = broker.receive("billing", "orders", ANY, 1, 10_000, client_id="c-1")
    broker.change_invisible_duration("billing", "orders", first.receipt_handle, 5_000)  # a nack
    clock.advance(6_000)
    (second,) = broker.receive("billing", "orders", ANY, 1, 10_000, client_id="c-2")
    broker.ack("billing", "orders", second.receipt_handle)
    assert events(broker, message_id) == [
        ("delivered", "billing", 1, None),
        ("invisible_changed", "billing", 1, None),
        ("delivered", "billing", 2, None),
        ("acked", "billing", 2, None),
    ]
    delivered = broker.message_trace(message_id)[2]
    assert (delivered["client"], delivered["mode"], delivered["invisible_ms"]) == (
        "c-2",
        "pop",
        10_000,
    )


def test_a_lite_topic_message_is_traced_and_found_by_id_like_any_other(
    broker: Broker, clock: FakeClock
) -> None:
    broker.create_topic("chat", MessageType.LITE, queue_count=1)
    broker.create_group("bots")
    broker.sync_lite_subscription("c-1", "bots", "chat", "partial_add", ["s1"])
    (sent,) = broker.send(
        [OutgoingMessage("chat", b"hi", message_type=MessageType.LITE, lite_topic="s1")]
    )
    (first,) = broker.receive("bots", "chat", ANY, 1, 10_000, client_id="c-1")
    handle = broker.change_invisible_duration(
        "bots", "chat", first.receipt_handle, 5_000, lite_topic="s1"
    )
    broker.ack("bots", "chat", handle, lite_topic="s1")
    assert events(broker, sent.message_id) == [
        ("delivered", "bots", 1, None),
        ("invisible_changed", "bots", 1, None),
        ("acked", "bots", 1, None),
    ]
    # Found by id like any other message, under its parent topic.
    (found,) = broker.messages_by_id(sent.message_id)
    assert (found.topic, found.lite_topic, found.body) == ("chat", "s1", b"hi")


def test_trace_records_reach_the_store_at_the_tick_and_are_read_back_from_it(
    broker: Broker, store: MemoryStore
) -> None:
    broker.create_topic("orders", queue_count=1)
    message_id = send(broker)
    (view,) = broker.receive("billing", "orders", ANY, 1, 10_000)
    assert store.max_offset(TRACE_TOPIC, 0) == 0  # buffered: nothing written yet
    broker.tick()
    assert store.max_offset(TRACE_TOPIC, 0) == 1
    (record,) = store.query_by_key(TRACE_TOPIC, position_key(view.commit_log_offset))
    assert position_key(view.commit_log_offset) in record.keys
    # A fresh recorder over the same store (a restart) reads the same event back.
    fresh = TraceRecorder(store, FakeClock(), lambda topic: True)
    assert [e["event"] for e in fresh.events([position_key(view.commit_log_offset)])] == [
        "delivered"
    ]
    assert broker.trace.stats()["trace_events_total"] == 1
    assert broker.status().extra["trace_records_total"] == 1
    assert [e[0] for e in events(broker, message_id)] == ["delivered"]


def test_many_messages_share_a_few_records(broker: Broker, store: MemoryStore) -> None:
    broker.create_topic("orders", queue_count=1)
    ids = [send(broker) for _ in range(KEYS_PER_RECORD + 10)]
    views = broker.receive("billing", "orders", ANY, 32, 10_000)
    views += broker.receive("billing", "orders", ANY, 32, 10_000)
    while len(views) < len(ids):
        got = broker.receive("billing", "orders", ANY, 32, 10_000)
        assert got
        views += got
    broker.tick()
    assert store.max_offset(TRACE_TOPIC, 0) == 2  # 138 keys: two records
    assert all([e[0] for e in events(broker, i)] == ["delivered"] for i in ids)


def test_pull_deliveries_are_recorded(broker: Broker) -> None:
    broker.create_topic("orders", queue_count=1)
    message_id = send(broker)
    broker.pull("etl", "orders", 0, 0, 10, ANY)
    broker.pull("etl", "orders", 0, 0, 10, ANY)  # pulled again (a rewind)
    trace = broker.message_trace(message_id)
    assert [(e["event"], e["group"], e["mode"]) for e in trace] == [
        ("delivered", "etl", "pull"),
        ("delivered", "etl", "pull"),
    ]


def test_dead_lettering_and_resend_are_recorded(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("orders", queue_count=1)
    broker.create_group("fragile", max_delivery_attempts=1)
    message_id = send(broker)
    (view,) = broker.receive("fragile", "orders", ANY, 1, 10_000)
    clock.advance(11_000)
    broker.tick()  # the revive scan dead-letters the last delivery
    dead = [e for e in broker.message_trace(message_id) if e["event"] == "dead_lettered"]
    assert [(e["group"], e["attempts"], e["dead_letter_topic"]) for e in dead] == [
        ("fragile", 1, "%DLQ%fragile")
    ]
    # An operator's resend (the admin API sets resent_from) links the two messages.
    new_id = send(broker, resent_from=message_id)
    resent = broker.message_trace(message_id)[-1]
    assert (resent["event"], resent["message_id"], resent["to_topic"]) == (
        "resent",
        new_id,
        "orders",
    )
    assert [(e["event"], e["message_id"]) for e in broker.message_trace(new_id)] == [
        ("resent_from", message_id)
    ]


def test_forward_to_dead_letter_is_recorded(broker: Broker) -> None:
    broker.create_topic("orders", queue_count=1)
    message_id = send(broker)
    (view,) = broker.receive("billing", "orders", ANY, 1, 10_000)
    broker.forward_to_dead_letter("billing", "orders", view.receipt_handle)
    assert [e[0] for e in events(broker, message_id)] == ["delivered", "dead_lettered"]


def test_a_topic_with_trace_off_records_nothing(broker: Broker, store: MemoryStore) -> None:
    broker.create_topic("orders", queue_count=1)
    assert broker.update_topic("orders", trace=False).trace is False
    message_id = send(broker)
    (view,) = broker.receive("billing", "orders", ANY, 1, 10_000)
    broker.ack("billing", "orders", view.receipt_handle)
    broker.tick()
    assert broker.message_trace(message_id) == []
    assert store.max_offset(TRACE_TOPIC, 0) == 0
    assert broker.update_topic("orders", trace=True).trace is True
    assert broker.get_topic("orders").to_dict()["trace"] is True


def test_trace_records_are_never_consumed_listed_or_counted(
    broker: Broker, store: MemoryStore
) -> None:
    broker.create_topic("orders", queue_count=1)
    send(broker)
    broker.receive("billing", "orders", ANY, 1, 10_000)
    broker.tick()
    assert store.max_offset(TRACE_TOPIC, 0) == 1
    for consume in (
        lambda: broker.receive("billing", TRACE_TOPIC, ANY, 1, 10_000),
        lambda: broker.pull("billing", TRACE_TOPIC, 0, 0, 10, ANY),
        lambda: broker.scan(TRACE_TOPIC, None, None, 0, 2**62, 10, ANY),
    ):
        with pytest.raises(TopicNotFound):
            consume()
    assert TRACE_TOPIC not in [t.name for t in broker.list_topics()]
    assert all(p.topic != TRACE_TOPIC for p in broker.group_progress("billing"))
    assert all(row.topic != TRACE_TOPIC for row in broker.traffic())


def test_traces_survive_a_restart(real_broker: Callable[..., Broker]) -> None:
    broker = real_broker()
    broker.create_topic("orders", queue_count=1)
    message_id = send(broker)
    (view,) = broker.receive("billing", "orders", ANY, 1, 10_000)
    broker.ack("billing", "orders", view.receipt_handle)
    reopened = real_broker()  # close (which flushes) and open again
    assert [e[0] for e in events(reopened, message_id)] == ["delivered", "acked"]


def test_a_transaction_committed_through_a_check(
    store: MemoryStore, clock: FakeClock, tmp_path: Any
) -> None:
    sender = RecordingSender()
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_max=3))
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=1)
    broker.set_check_sender(sender)
    (result,) = broker.send(
        [OutgoingMessage("orders", b"x", message_type=MessageType.TRANSACTION, producer_group="pg")]
    )
    clock.advance(30_000)
    broker.tick()  # the first scan sends a check
    assert len(sender.sent) == 1
    broker.end_transaction("orders", result.message_id, result.transaction_id, "unknown", "check")
    clock.advance(30_000)
    broker.tick()  # checked again
    broker.end_transaction("orders", result.message_id, result.transaction_id, "commit", "check")
    (view,) = broker.receive("billing", "orders", ANY, 1, 10_000)
    broker.ack("billing", "orders", view.receipt_handle)
    trace = broker.message_trace(result.message_id)
    assert [(e["event"], e.get("check"), e.get("resolution"), e.get("source")) for e in trace] == [
        ("half_stored", None, None, None),
        ("check_sent", 1, None, None),
        ("check_answered", None, "unknown", None),
        ("check_sent", 2, None, None),
        ("check_answered", None, "commit", None),
        ("committed", None, None, "check"),
        ("delivered", None, None, None),
        ("acked", None, None, None),
    ]
    assert {e["transaction_id"] for e in trace[:6]} == {result.transaction_id}
    assert trace[0]["producer_group"] == "pg"


def test_a_check_answered_before_the_scan_counted_it_is_still_traced_in_order(
    store: MemoryStore, clock: FakeClock
) -> None:
    # A live producer can answer a check while the sender is still returning: the commit lands
    # before the scan counts the check, and the trace must still say the check went out first.
    sender = RecordingSender()
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_max=3))
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=1)
    broker.set_check_sender(sender)
    (result,) = broker.send(
        [OutgoingMessage("orders", b"x", message_type=MessageType.TRANSACTION, producer_group="pg")]
    )

    def answer_at_once(transaction_id: str) -> None:
        broker.end_transaction("orders", result.message_id, transaction_id, "commit", "check")

    sender.on_send = answer_at_once
    clock.advance(30_000)
    broker.tick()
    assert len(sender.sent) == 1
    assert [(e["event"], e.get("check")) for e in broker.message_trace(result.message_id)] == [
        ("half_stored", None),
        ("check_sent", 1),
        ("check_answered", None),
        ("committed", None),
    ]


def test_rollback_by_an_operator_and_parking(store: MemoryStore, clock: FakeClock) -> None:
    sender = RecordingSender()
    sender.live = True
    broker = Broker(store, None, BrokerConfig(), clock, TransactionConfig(check_max=1))
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=1)
    broker.set_check_sender(sender)
    (result,) = broker.send([OutgoingMessage("orders", b"x", message_type=MessageType.TRANSACTION)])
    for _ in range(2):
        clock.advance(30_000)
        broker.tick()  # one check, then parked
    broker.resume_transaction(result.transaction_id)
    broker.end_transaction(
        "orders", result.message_id, result.transaction_id, "rollback", "operator"
    )
    assert [(e["event"], e.get("source")) for e in broker.message_trace(result.message_id)] == [
        ("half_stored", None),
        ("check_sent", None),
        ("parked", None),
        ("resumed", "operator"),
        ("rolled_back", "operator"),
    ]


def test_a_producer_commit_says_so(broker: Broker) -> None:
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=1)
    (result,) = broker.send([OutgoingMessage("orders", b"x", message_type=MessageType.TRANSACTION)])
    broker.end_transaction("orders", result.message_id, result.transaction_id, "commit", "client")
    assert [(e["event"], e.get("source")) for e in broker.message_trace(result.message_id)] == [
        ("half_stored", None),
        ("committed", "producer"),
    ]


def test_a_fanout_is_traced_once_per_queue_it_was_consumed_from(broker: Broker) -> None:
    for topic in ("fan-a", "fan-b"):
        broker.create_topic(topic, queue_count=1)
        broker.create_group(f"g-{topic}", consume_from="earliest")
        broker.subscribe(f"g-{topic}", topic)
    (sent, _) = broker.send_fanout(OutgoingMessage("fan-a", b"body"), ["fan-b"])
    (got,) = broker.receive("g-fan-a", "fan-a", ANY, 1, 10_000, client_id="c-1")
    broker.ack("g-fan-a", "fan-a", got.receipt_handle)
    (other,) = broker.receive("g-fan-b", "fan-b", ANY, 1, 10_000, client_id="c-2")
    # One record holds the message for both queues: its trace holds both queues' consumers,
    # each event once and naming its group.
    assert events(broker, sent.message_id) == [
        ("delivered", "g-fan-a", 1, None),
        ("acked", "g-fan-a", 1, None),
        ("delivered", "g-fan-b", 1, None),
    ]
    assert other.message_id == sent.message_id
