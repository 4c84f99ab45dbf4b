"""The epoch check of a proxy's requests to a member of a broker group (fencing.py), and how
the internal service applies it to sends: a refused request stores nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from halfmoon.broker.facade import Written
from halfmoon.broker.message import OutgoingMessage
from halfmoon.cluster.errors import EpochStale, MasterDeposed
from halfmoon.cluster.internal import fencing
from halfmoon.cluster.internal.fencing import group_epoch
from halfmoon.cluster.internal.internal_service import InternalService
from halfmoon.cluster.internal.wire import MalformedRequest
from halfmoon.cluster.proxy.broker_pool import BrokerPool


def refusal(sent: int, current: int | None, deposed: bool = False) -> Any:
    return fencing.epoch_refusal(sent, current, deposed=deposed, group="g1", member="b0")


def test_a_request_for_the_masters_own_epoch_is_served() -> None:
    assert refusal(3, 3) is None


def test_an_older_epoch_is_refused_as_stale_with_a_code_clients_retry() -> None:
    error = refusal(2, 3)
    assert isinstance(error, EpochStale)
    assert error.code == "EPOCH_STALE" and error.protocol_code == "HA_NOT_AVAILABLE"
    assert "epoch 2" in error.message and "epoch 3" in error.message


@pytest.mark.parametrize(
    ("sent", "current", "deposed"),
    [(4, 3, False), (3, 3, True), (2, 3, True), (1, None, False)],
    ids=["newer-epoch", "deposed", "deposed-and-older", "not-master"],
)
def test_a_newer_epoch_or_a_deposed_master_is_refused_as_deposed(
    sent: int, current: int | None, deposed: bool
) -> None:
    error = refusal(sent, current, deposed)
    assert isinstance(error, MasterDeposed)
    assert error.code == "MASTER_DEPOSED" and error.protocol_code == "HA_NOT_AVAILABLE"


def test_the_epoch_a_request_names_is_a_positive_integer_or_absent() -> None:
    assert fencing.parse_epoch(None) is None
    assert fencing.parse_epoch(7) == 7
    assert fencing.parse_epoch(fencing.header_value(12)) == 12
    for bad in (0, -1, "0", "-3", "x", "1.5", "", True, 2.0, "١"):
        with pytest.raises(MalformedRequest):
            fencing.parse_epoch(bad)


def test_only_a_broker_groups_routing_entry_names_an_epoch() -> None:
    assert group_epoch({"endpoint": "h:1", "member": "b0", "epoch": 4}) == 4
    assert group_epoch({"endpoint": "h:1", "epoch": 4}) is None  # a standalone broker
    assert group_epoch({"endpoint": "h:1", "member": "b0"}) is None
    assert group_epoch({"endpoint": "h:1", "member": "b0", "epoch": "4"}) is None


class FakeBroker:
    """What InternalService needs of a broker, recording sends."""

    def __init__(self) -> None:
        self.sent: list[list[OutgoingMessage]] = []

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        pass

    def set_check_sender(self, sender: object) -> None:
        pass

    def set_lite_unsubscribe_notifier(self, notifier: object) -> None:
        pass

    def send_nowait(self, messages: list[OutgoingMessage]) -> Written[list[str]]:
        self.sent.append(list(messages))
        done: Future[None] = Future()
        done.set_result(None)
        return Written([m.message_id for m in messages], done)


def master_fence(current: int) -> Callable[[int], None]:
    def fence(sent: int) -> None:
        error = refusal(sent, current)
        if error is not None:
            raise error

    return fence


BATCHES = [
    [OutgoingMessage("orders", b"a", message_id="m1")],
    [OutgoingMessage("orders", b"b", message_id="m2")],
]


@pytest.mark.parametrize("sent", [1, 3])
def test_a_send_meant_for_another_epoch_stores_no_batch(sent: int) -> None:
    broker = FakeBroker()
    service = InternalService(broker, "g1", fence=master_fence(2))  # type: ignore[arg-type]
    answers, durable = service.store_batches(BATCHES, sent)
    assert broker.sent == [] and durable == []
    expected = EpochStale if sent < 2 else MasterDeposed
    assert len(answers) == 2 and all(isinstance(a, expected) for a in answers)
    with pytest.raises(expected):
        service.check_epoch(sent)


def test_a_send_for_the_masters_epoch_or_naming_none_is_stored() -> None:
    broker = FakeBroker()
    service = InternalService(broker, "g1", fence=master_fence(2))  # type: ignore[arg-type]
    assert service.store_batches(BATCHES, 2)[0] == [["m1"], ["m2"]]
    assert service.store_batches(BATCHES, None)[0] == [["m1"], ["m2"]]
    assert len(broker.sent) == 2


def test_a_broker_outside_a_group_checks_no_epoch() -> None:
    broker = FakeBroker()
    service = InternalService(broker, "b", fence=None)  # type: ignore[arg-type]
    assert service.store_batches(BATCHES, 9)[0] == [["m1"], ["m2"]]
    service.check_epoch(9)


class FakeRemote:
    """What the pool calls on a connection it opens."""

    def __init__(self, endpoint: str, epoch: int | None) -> None:
        self.endpoint = endpoint
        self.epoch = epoch
        self.closed = threading.Event()

    def watch_arrivals(self, topics: object) -> None:
        pass

    def close(self) -> None:
        self.closed.set()


class FakeView:
    def __init__(self) -> None:
        self.brokers: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, Any] = {}
        self.topics: dict[str, Any] = {}
        self.group_keys: dict[str, Any] = {}


def test_the_pool_connects_to_a_groups_master_for_the_epoch_its_routing_entry_names() -> None:
    view = FakeView()
    opened: list[FakeRemote] = []

    def connect(endpoint: str, epoch: int | None) -> Any:
        opened.append(FakeRemote(endpoint, epoch))
        return opened[-1]

    pool = BrokerPool(view, None, None, connect=connect)  # type: ignore[arg-type]
    view.brokers = {
        "g1": {"endpoint": "h:1", "member": "b0", "epoch": 1},
        "solo": {"endpoint": "h:9"},
    }
    pool.sync_connections()
    assert sorted((r.endpoint, r.epoch) for r in opened) == [("h:1", 1), ("h:9", None)]
    # A master restarted in place takes office in a new epoch at the same endpoint: the
    # connection for epoch 1 is closed and one for epoch 2 opened.
    view.brokers["g1"] = {"endpoint": "h:1", "member": "b0", "epoch": 2}
    pool.sync_connections()
    assert [(r.endpoint, r.epoch) for r in opened[2:]] == [("h:1", 2)]
    first = next(r for r in opened if r.epoch == 1)
    assert first.closed.wait(5)
    assert pool.broker("g1") is opened[2]  # type: ignore[comparison-overlap]
    pool.sync_connections()  # nothing changed: nothing reopened
    assert len(opened) == 3
