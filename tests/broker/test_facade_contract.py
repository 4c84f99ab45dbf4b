"""The contract of the ``Broker`` facade (halfmoon/broker/facade.py), for every implementation.

Each test talks to the facade only, never to a store or a registry below
it, so an implementation that drives a broker in another process plugs in
as one more entry of ``IMPLEMENTATIONS``: a factory that opens a facade
(given a clock, a directory and a config) and returns it with its closer.
The in-process broker over the in-memory store and over real files, and
``RemoteBroker`` driving a real ``halfmoon broker`` process over the internal
protocol (its clock is a test clock moved with the test's, see
halfmoon/broker_node.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from halfmoon.broker import (
    BrokerConfig,
    FakeClock,
    FilterSpec,
    GroupExists,
    InvalidReceiptHandle,
    MessageType,
    OffsetNotFound,
    OutgoingMessage,
    TopicExists,
    TopicNotFound,
    dead_letter_topic,
)
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.facade import Broker, Pending, Written, operations
from halfmoon.broker.message import Received
from halfmoon.broker.transaction_state import TxnState
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.errors import HalfmoonError, InvalidArgument, NotFound
from halfmoon.store.memory import MemoryStore
from tests.broker.conftest import open_real_store
from tests.cluster.broker_processes import BrokerProcess

WAIT_S = 10.0
EVERYTHING = FilterSpec()
Opened = tuple[Broker, Callable[[], None]]


def in_process_memory(clock: FakeClock, tmp_path: Path, config: BrokerConfig) -> Opened:
    store = MemoryStore(clock.now_ms)
    broker = InProcessBroker(store, tmp_path / "meta", config, clock)

    def close() -> None:
        broker.close()
        store.close()

    return broker, close


def in_process_files(clock: FakeClock, tmp_path: Path, config: BrokerConfig) -> Opened:
    store = open_real_store(tmp_path / "data")  # sync flush: durability is a real wait
    broker = InProcessBroker(store, tmp_path / "meta", config, clock)

    def close() -> None:
        broker.close()
        store.close()

    return broker, close


def remote_process(clock: FakeClock, tmp_path: Path, config: BrokerConfig) -> Opened:
    process = BrokerProcess(tmp_path / "remote", fake_clock_ms=clock.now_ms()).start()
    try:
        remote = RemoteBroker(process.address)
        default = BrokerConfig()
        changes = {
            f.name: getattr(config, f.name)
            for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(default, f.name)
        }
        if changes:
            remote.update_config(changes)
    except BaseException:
        process.kill()
        raise
    advance_here = clock.advance

    def advance_both(ms: int) -> int:  # the broker's clock moves with the test's
        remote.connection.advance_clock(ms)
        return advance_here(ms)

    setattr(clock, "advance", advance_both)  # noqa: B010 - a method replaced on one instance

    def close() -> None:
        remote.close()
        assert process.stop() == 0, "".join(process.output[-20:])

    return remote, close


IMPLEMENTATIONS: dict[str, Callable[[FakeClock, Path, BrokerConfig], Opened]] = {
    "in-process/memory-store": in_process_memory,
    "in-process/real-store": in_process_files,
    "remote/broker-process": remote_process,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def open_facade(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> Iterator[Callable[..., Broker]]:
    """Open a facade (optionally with a config); everything opened is closed at the end."""
    closers: list[Callable[[], None]] = []

    def open_(config: BrokerConfig | None = None) -> Broker:
        broker, close = IMPLEMENTATIONS[request.param](clock, tmp_path, config or BrokerConfig())
        closers.append(close)
        return broker

    yield open_
    for close in reversed(closers):
        close()


@pytest.fixture
def facade(open_facade: Callable[..., Broker]) -> Broker:
    broker = open_facade()
    broker.create_topic("orders", queue_count=2)
    broker.create_group("billing", consume_from="earliest")
    return broker


def has_cheap_path(broker: Broker) -> bool:
    """Whether a write (a send, an end of transaction) may be answered ``Written`` at once:
    not from a network hop away."""
    return not isinstance(broker, RemoteBroker)


def bodies(broker: Broker, group: str, topic: str) -> list[bytes]:
    return sorted(m.body for m in broker.receive(group, topic, EVERYTHING, 32, 30_000))


def half(body: bytes, **kw: object) -> OutgoingMessage:
    return OutgoingMessage(
        "payments", body, message_type=MessageType.TRANSACTION, producer_group="pg", **kw
    )


# -- the protocol itself ---------------------------------------------------------------------------


def _members() -> list[str]:
    return sorted(
        name
        for name, value in operations(Broker).items()
        if callable(value) or isinstance(value, property)
    )


def test_every_operation_is_documented_and_implemented_with_the_same_signature(
    facade: Broker,
) -> None:
    members = _members()
    assert len(members) >= 50
    for name in members:
        declared = operations(Broker)[name]
        assert inspect.getdoc(declared), f"facade operation {name} has no documentation"
        if isinstance(declared, property):  # an attribute satisfies it
            assert hasattr(facade, name), f"{type(facade).__name__} lacks {name}"
            continue
        implemented = getattr(type(facade), name, None)
        assert callable(implemented), f"{type(facade).__name__} lacks {name}"
        wanted = inspect.signature(declared).parameters
        got = inspect.signature(implemented).parameters
        assert [(p.name, p.kind, p.default) for p in got.values()] == [
            (p.name, p.kind, p.default) for p in wanted.values()
        ], f"{name}: {inspect.signature(implemented)} != {inspect.signature(declared)}"


# -- settings, lifecycle, status -------------------------------------------------------------------


def test_config_changes_apply_at_once_and_unknown_names_change_nothing(facade: Broker) -> None:
    assert facade.config.max_body_size == BrokerConfig().max_body_size
    facade.update_config({"max_body_size": 8, "default_queue_count": 3})
    assert (facade.config.max_body_size, facade.config.default_queue_count) == (8, 3)
    with pytest.raises(HalfmoonError):
        facade.send([OutgoingMessage("orders", b"more than eight bytes")])
    with pytest.raises(InvalidArgument) as info:
        facade.update_config({"max_body_size": 1024, "no_such_setting": 1})
    assert "no_such_setting" in info.value.message
    assert facade.config.max_body_size == 8


def test_tick_says_no_more_work_when_idle_and_status_counts(facade: Broker) -> None:
    assert facade.tick() is False
    facade.send([OutgoingMessage("orders", b"x") for _ in range(3)])
    status = facade.status()
    assert (status.topics, status.groups, status.messages_in_total) == (1, 1, 3)
    stats = facade.store_stats()
    assert stats.commit_log_max_offset > 0
    assert stats.commit_log_flushed_offset == stats.commit_log_max_offset  # send waited
    rows = {(r.topic, r.group): r.total_24h for r in facade.traffic(topic="orders")}
    assert rows[("orders", None)] == 3


def test_arrival_listeners_hear_of_user_topics(facade: Broker) -> None:
    heard: list[tuple[str, int]] = []
    arrived = threading.Event()

    def listener(topic: str, queue_id: int) -> None:
        heard.append((topic, queue_id))
        arrived.set()

    facade.add_arrival_listener(listener)  # in-process: called at once; remote: a hop later
    facade.send([OutgoingMessage("orders", b"x", queue_id=1)])
    assert arrived.wait(WAIT_S)
    assert heard == [("orders", 1)]


# -- topics and groups -----------------------------------------------------------------------------


def test_topic_lifecycle_and_lookups_that_never_create(open_facade: Callable[..., Broker]) -> None:
    facade = open_facade(BrokerConfig(auto_create_topics=True, default_queue_count=2))
    created = facade.create_topic("orders", MessageType.FIFO, 4, "rw")
    assert (created.name, created.message_type, created.queue_count) == (
        "orders",
        MessageType.FIFO,
        4,
    )
    with pytest.raises(TopicExists):
        facade.create_topic("orders")
    assert facade.find_topic("orders") == facade.get_topic("orders") == created
    assert facade.find_topic("elsewhere") is None
    assert [t.name for t in facade.list_topics()] == ["orders"]  # find did not create it
    assert facade.get_topic("elsewhere").message_type is MessageType.MIXED  # get may create
    assert facade.update_topic("orders", perm="r").perm == "r"
    assert [(r.queue_id, r.perm) for r in facade.route("orders")] == [(q, "r") for q in range(4)]
    assert [q.queue_id for q in facade.topic_status("orders")] == [0, 1, 2, 3]
    facade.delete_topic("orders")
    assert facade.find_topic("orders") is None


def test_group_lifecycle_and_lookups_that_never_create(facade: Broker) -> None:
    with pytest.raises(GroupExists):
        facade.create_group("billing")
    assert facade.find_group("billing") == facade.get_group("billing")
    assert facade.find_group("audit") is None
    assert [g.name for g in facade.list_groups()] == ["billing"]
    assert facade.get_group("audit").name == "audit"  # auto-created (the default)
    assert facade.update_group("billing", fifo=True).fifo is True
    facade.delete_group("audit")
    assert facade.find_group("audit") is None


# -- send ------------------------------------------------------------------------------------------


def test_send_returns_once_durable_and_stores_all_or_nothing(facade: Broker) -> None:
    results = facade.send([OutgoingMessage("orders", b"a", queue_id=0, keys=["k1"])])
    assert results[0].topic == "orders" and results[0].message_id and results[0].queue_offset == 0
    with pytest.raises(HalfmoonError):
        facade.send([OutgoingMessage("orders", b"b"), OutgoingMessage("", b"no topic")])
    assert bodies(facade, "billing", "orders") == [b"a"]
    assert facade.send([]) == []


def test_send_nowait_gives_a_future_that_completes_when_durable(facade: Broker) -> None:
    written = facade.send_nowait(
        [OutgoingMessage("orders", b"a"), OutgoingMessage("orders", b"b")]
    ).write()
    assert isinstance(written, Written) and len(written.result) == 2
    assert written.durable.result(timeout=WAIT_S) is None
    assert bodies(facade, "billing", "orders") == [b"a", b"b"]
    empty = facade.send_nowait([]).write()
    assert empty.result == [] and empty.durable.done()


def test_send_nowait_writes_at_once_only_to_existing_topics_outside_transaction_groups(
    open_facade: Callable[..., Broker],
) -> None:
    # A send that only appends is written by the call; one that would block (a topic to
    # create, a group's index lookup, a network hop) is left to its answer, written when
    # asked for: nothing is stored before.
    facade = open_facade(BrokerConfig(auto_create_topics=True))
    facade.create_topic("orders")
    facade.create_topic("payments", MessageType.TRANSACTION)
    cheap = has_cheap_path(facade)

    def written_at_once(*messages: OutgoingMessage) -> bool:
        answer = facade.send_nowait(list(messages))
        at_once = isinstance(answer, Written)
        assert at_once or isinstance(answer, Pending)
        answer.write().durable.result(timeout=WAIT_S)
        return at_once

    assert written_at_once(OutgoingMessage("orders", b"a")) is cheap
    assert written_at_once(half(b"h")) is cheap
    assert not written_at_once(OutgoingMessage("orders", b"b"), OutgoingMessage("new", b""))
    assert written_at_once(OutgoingMessage("new", b"a")) is cheap  # created by the send before
    assert not written_at_once(half(b"h", transaction_group="tg"))
    later = facade.send_nowait([OutgoingMessage("later", b"x")])
    assert isinstance(later, Pending)
    assert "later" not in {t.name for t in facade.list_topics()}  # not written yet
    assert [r.topic for r in later.write().result] == ["later"]
    assert bodies(facade, "billing", "orders") == [b"a", b"b"]


def test_send_nowait_answers_are_awaited_on_an_event_loop(
    open_facade: Callable[..., Broker],
) -> None:
    # Written and Pending alike: the results once durable, the writes left to the answer
    # made off the loop (a worker thread, or a proxy's sender).
    facade = open_facade(BrokerConfig(auto_create_topics=True))
    facade.create_topic("orders")
    facade.create_group("billing", consume_from="earliest")

    async def sent() -> list[list[str]]:
        answers = [
            facade.send_nowait([OutgoingMessage("orders", b"a")]),
            facade.send_nowait([OutgoingMessage("auto-created", b"b")]),
            facade.send_fanout_nowait(OutgoingMessage("orders", b"c"), ["auto-created"]),
        ]
        return [[r.topic for r in await answer] for answer in answers]

    assert asyncio.run(sent()) == [["orders"], ["auto-created"], ["orders", "auto-created"]]
    assert bodies(facade, "billing", "orders") == [b"a", b"c"]


def _fanout_topics(facade: Broker) -> list[str]:
    names = ["fan-a", "fan-b", "fan-c"]
    for name in names:
        facade.create_topic(name, queue_count=1)
        facade.create_group(f"g-{name}", consume_from="earliest")
        facade.subscribe(f"g-{name}", name)
    return names


def test_send_fanout_gives_every_topic_the_message_under_one_id(facade: Broker) -> None:
    a, b, c = _fanout_topics(facade)
    results = facade.send_fanout(OutgoingMessage(a, b"x", keys=["k1"]), [b, c])
    assert [r.topic for r in results] == [a, b, c]
    assert len({r.message_id for r in results}) == 1
    assert [r.queue_offset for r in results] == [0, 0, 0]
    assert len({r.commit_log_offset for r in results}) == 1  # stored once: one record
    views = {t: facade.receive(f"g-{t}", t, EVERYTHING, 32, 30_000) for t in (a, b, c)}
    for topic, got in views.items():
        assert [(v.topic, v.body, v.message_id, v.keys) for v in got] == [
            (topic, b"x", results[0].message_id, ["k1"])
        ]
    facade.ack(f"g-{a}", a, views[a][0].receipt_handle)  # settled in one queue only
    progress = {p.topic: p for p in facade.group_progress(f"g-{b}", b)}
    assert progress[b].inflight == 1


def test_every_reader_sees_a_fanout_once_in_each_topic(facade: Broker) -> None:
    a, b, c = _fanout_topics(facade)
    facade.send([OutgoingMessage(b, b"before", keys=["k1"])])
    (sent, in_b, _) = facade.send_fanout(OutgoingMessage(a, b"x", keys=["k1"]), [b, c])
    pulled = facade.pull(f"g-{b}", b, 0, 0, 10, EVERYTHING)
    assert [(m.topic, m.queue_offset, m.body) for m in pulled.messages] == [
        (b, 0, b"before"),
        (b, 1, b"x"),
    ]
    bulk = facade.bulk_read(f"g-{c}", c, 0, 0, 100, 1 << 20, EVERYTHING)
    assert [(m.topic, m.queue_offset, m.body) for m in bulk.messages] == [(c, 0, b"x")]
    by_id = facade.messages_by_id(sent.message_id)
    assert sorted((m.topic, m.body) for m in by_id) == [(a, b"x"), (b, b"x"), (c, b"x")]
    assert [m.topic for m in facade.messages_by_id(sent.message_id, b)] == [b]
    assert [m.body for m in facade.messages_by_key(b, "k1", 0, 2**63 - 1, 10)] == [b"x", b"before"]
    assert facade.message_at(b, 0, in_b.queue_offset).topic == b
    scanned = facade.scan(c, None, None, 0, 2**63 - 1, 10, EVERYTHING)
    assert [(m.topic, m.body) for m in scanned.messages] == [(c, b"x")]


def test_send_fanout_refuses_a_topic_named_twice_and_stores_nothing(facade: Broker) -> None:
    a, b, _ = _fanout_topics(facade)
    with pytest.raises(InvalidArgument):
        facade.send_fanout(OutgoingMessage(a, b"x"), [b, b])
    with pytest.raises(HalfmoonError):
        facade.send_fanout(OutgoingMessage(a, b"x"), [b, "no-such-topic!"])
    assert [s.max_offset for s in facade.topic_status(a)] == [0]
    assert [s.max_offset for s in facade.topic_status(b)] == [0]


def test_send_fanout_nowait_completes_when_durable(facade: Broker) -> None:
    a, b, c = _fanout_topics(facade)
    written = facade.send_fanout_nowait(OutgoingMessage(a, b"y"), [b, c]).write()
    assert written.durable.result(timeout=WAIT_S) is None
    assert [r.topic for r in written.result] == [a, b, c]
    assert bodies(facade, f"g-{c}", c) == [b"y"]


def test_a_half_message_fanout_is_a_half_message_per_topic(facade: Broker) -> None:
    facade.create_topic("payments", MessageType.TRANSACTION)
    facade.create_topic("refunds", MessageType.TRANSACTION)
    results = facade.send_fanout(half(b"h"), ["refunds"])
    assert [r.topic for r in results] == ["payments", "refunds"]
    assert all(r.transaction_id for r in results)
    assert len({r.transaction_id for r in results}) == 2  # each decided on its own


def test_a_delay_message_can_be_recalled_before_its_time(facade: Broker, clock: FakeClock) -> None:
    facade.create_topic("later", MessageType.DELAY, queue_count=1)
    due = clock.now_ms() + 60_000
    (sent,) = facade.send(
        [OutgoingMessage("later", b"d", message_type=MessageType.DELAY, delivery_timestamp=due)]
    )
    assert sent.recall_handle
    assert facade.recall("later", sent.recall_handle) == sent.message_id
    clock.advance(61_000)
    facade.tick()
    assert bodies(facade, "billing", "later") == []


# -- transactions ----------------------------------------------------------------------------------


def test_a_transaction_ends_durably_with_and_without_waiting(facade: Broker) -> None:
    facade.create_topic("payments", MessageType.TRANSACTION, queue_count=1)
    first, second = facade.send([half(b"one"), half(b"two")])
    assert bodies(facade, "billing", "payments") == []  # halves are invisible
    assert {t.transaction_id for t in facade.list_transactions("payments")} == {
        first.transaction_id,
        second.transaction_id,
    }
    answer = facade.end_transaction_nowait(
        "payments", first.message_id, first.transaction_id or "", "commit", "client"
    )
    # Decided at once in memory; from a network hop away, a write left to the answer.
    assert isinstance(answer, Written) is has_cheap_path(facade)
    written = answer.write()
    assert written.result.state is TxnState.COMMITTED and written.result.changed
    assert written.durable.result(timeout=WAIT_S) is None
    state = facade.end_transaction(
        "", "", second.transaction_id or "", "rollback", "operator", None
    )
    assert state is TxnState.ROLLED_BACK
    assert bodies(facade, "billing", "payments") == [b"one"]
    assert facade.list_transactions() == [] and facade.parked_transactions() == []
    assert facade.transaction_stats().pending == 0


def test_a_transaction_group_ends_all_its_members(facade: Broker) -> None:
    facade.create_topic("payments", MessageType.TRANSACTION, queue_count=1)
    facade.send([half(b"a", transaction_group="tg"), half(b"b", transaction_group="tg")])
    answer = facade.end_transaction_group_nowait("tg", "commit", "client")
    assert isinstance(answer, Pending)  # a group's members are read back: never on the caller
    written = answer.write()
    assert written.result == 2 and written.durable.result(timeout=WAIT_S) is None
    assert facade.end_transaction_group("tg", "commit") == 0  # repeated: nothing new
    assert bodies(facade, "billing", "payments") == [b"a", b"b"]


def test_the_check_sender_is_asked_about_an_open_transaction(
    facade: Broker, clock: FakeClock
) -> None:
    asked = threading.Event()

    class Sender:
        def send_checks(self, checks: list[object]) -> list[bool]:
            asked.set()
            return [True] * len(checks)

    facade.create_topic("payments", MessageType.TRANSACTION, queue_count=1)
    facade.set_check_sender(Sender())
    facade.send([half(b"open")])
    clock.advance(3_600_000)
    while facade.tick():  # a scan spread over ticks says so
        pass
    assert asked.is_set()
    facade.set_check_sender(None)


# -- pop -------------------------------------------------------------------------------------------


def test_receive_ack_change_invisible_and_dead_letter(facade: Broker, clock: FakeClock) -> None:
    facade.send([OutgoingMessage("orders", b"a", queue_id=0), OutgoingMessage("orders", b"b")])
    facade.subscribe("billing", "orders")
    got = {m.body: m for m in facade.receive("billing", "orders", EVERYTHING, 10, 10_000)}
    assert sorted(got) == [b"a", b"b"]
    assert facade.receive("billing", "orders", EVERYTHING, 10, 10_000) == []
    assert facade.next_wakeup_ms("billing", "orders") == clock.now_ms() + 10_000
    facade.ack("billing", "orders", got[b"a"].receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        facade.ack("billing", "orders", got[b"a"].receipt_handle + "x")
    renewed = facade.change_invisible_duration("billing", "orders", got[b"b"].receipt_handle, 1)
    assert renewed != got[b"b"].receipt_handle
    facade.forward_to_dead_letter("billing", "orders", renewed)
    facade.create_group("dlq-reader", consume_from="earliest")
    assert bodies(facade, "dlq-reader", dead_letter_topic("billing")) == [b"b"]
    progress = facade.group_progress("billing", "orders")
    assert sum(p.inflight for p in progress) == 0 and sum(p.lag for p in progress) == 0


def test_receive_and_ack_nowait_answer_written_at_once_or_pending_alike(
    facade: Broker, clock: FakeClock
) -> None:
    """The pop path's event-loop calls: Written when the broker can answer without blocking
    (in process), Pending from a network hop away; the same deliveries and acks either way,
    awaited on an event loop."""
    facade.send([OutgoingMessage("orders", b"a"), OutgoingMessage("orders", b"b")])
    facade.subscribe("billing", "orders")
    cheap = has_cheap_path(facade)

    async def received() -> tuple[bool, Received]:
        answer = facade.receive_nowait("billing", "orders", EVERYTHING, 10, 10_000)
        return isinstance(answer, Written), await answer

    at_once, got = asyncio.run(received())
    assert at_once is cheap
    assert sorted(v.body for v in got.views) == [b"a", b"b"]
    at_once, empty = asyncio.run(received())
    assert empty.views == [] and empty.next_wakeup_ms == clock.now_ms() + 10_000

    async def acked(handles: list[str]) -> tuple[bool, list[Exception | None]]:
        answer = facade.ack_nowait("billing", "orders", handles)
        return isinstance(answer, Written), await answer

    at_once, results = asyncio.run(acked([v.receipt_handle for v in got.views] + ["garbled"]))
    assert at_once is cheap
    assert results[:2] == [None, None] and isinstance(results[2], HalfmoonError)
    progress = facade.group_progress("billing", "orders")
    assert sum(p.inflight for p in progress) == 0


# -- pull and offsets ------------------------------------------------------------------------------


def test_pull_commit_and_query_offsets(facade: Broker, clock: FakeClock) -> None:
    facade.send([OutgoingMessage("orders", b"a", queue_id=1)])
    clock.advance(1_000)
    facade.send([OutgoingMessage("orders", b"b", queue_id=1)])
    pulled = facade.pull("billing", "orders", 1, 0, 10, EVERYTHING)
    assert [m.body for m in pulled.messages] == [b"a", b"b"] and pulled.next_offset == 2
    with pytest.raises(OffsetNotFound):
        facade.get_offset("billing", "orders", 1)
    facade.update_offset("billing", "orders", 1, 2)
    assert facade.get_offset("billing", "orders", 1) == 2
    assert facade.query_offset("orders", 1, "beginning") == 0
    assert facade.query_offset("orders", 1, "end") == 2
    assert facade.reset_offset("billing", "orders", 0) == {0: 0, 1: 0}
    assert facade.get_offset("billing", "orders", 1) == 0


def test_bulk_read_reads_a_range_in_one_answer(facade: Broker) -> None:
    facade.send([OutgoingMessage("orders", b"m%d" % i, queue_id=1) for i in range(5)])
    got = facade.bulk_read("billing", "orders", 1, 1, 100, 1 << 20, EVERYTHING, end_offset=4)
    assert [m.body for m in got.messages] == [b"m1", b"m2", b"m3"] and got.next_offset == 4
    assert [m.queue_id for m in got.messages] == [1, 1, 1]


# -- reading stored messages -----------------------------------------------------------------------


def test_operators_read_by_id_key_offset_and_scan(facade: Broker) -> None:
    sent = facade.send(
        [
            OutgoingMessage("orders", b"a", tag="x", keys=["k"], queue_id=0),
            OutgoingMessage("orders", b"b", tag="y", queue_id=0),
        ]
    )
    (by_id,) = facade.messages_by_id(sent[0].message_id)
    assert (by_id.body, by_id.topic) == (b"a", "orders")
    assert [m.body for m in facade.messages_by_id(sent[1].message_id, "orders")] == [b"b"]
    with pytest.raises(NotFound):
        facade.messages_by_id("no-such-id")
    with pytest.raises(TopicNotFound):
        facade.messages_by_id(sent[0].message_id, "elsewhere")
    assert [m.body for m in facade.messages_by_key("orders", "k", 0, 2**63 - 1, 10)] == [b"a"]
    assert facade.message_at("orders", 0, 1).body == b"b"
    with pytest.raises(NotFound):
        facade.message_at("orders", 0, 2)
    scanned = facade.scan("orders", None, None, 0, 2**63 - 1, 10, FilterSpec("TAG", "x"))
    assert [m.body for m in scanned.messages] == [b"a"]
    assert (scanned.matched, scanned.examined, scanned.tag_counts) == (1, 2, {"x": 1})
    assert scanned.next_offsets == {0: 2, 1: 0} and scanned.complete
    counted = facade.scan("orders", 0, 0, 0, 2**63 - 1, 1, EVERYTHING, with_messages=False)
    assert counted.messages == [] and counted.matched == 2
    assert bodies(facade, "billing", "orders") == [b"a", b"b"]  # reads moved nothing
