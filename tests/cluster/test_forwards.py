"""The forwards RemoteBroker makes from the facade's declarations (cluster/internal/forwards.py)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from halfmoon.broker.config import DEFAULT_QUEUE_COUNT
from halfmoon.broker.facade import Administration, Broker, Messaging, Transactions, operations
from halfmoon.broker.facade_types import ALREADY_DURABLE, Pending
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.groups import DEFAULT_MAX_DELIVERY_ATTEMPTS
from halfmoon.broker.message import MessageType
from halfmoon.broker.transactions import DecisionSource
from halfmoon.cluster.internal.forwards import forward, forward_pending
from halfmoon.cluster.internal.remote_broker import RemoteBroker


class Recorder:
    """Stands in for the connection: what each forward would send."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], dict[str, Any] | None]] = []

    def _call(self, operation: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> Any:
        self.calls.append((operation, args, kwargs))
        return "answer"

    create_topic = forward(Administration.create_topic)
    update_config = forward(Administration.update_config)
    create_group = forward(Administration.create_group)
    update_group = forward(Administration.update_group)
    seek_group = forward(Messaging.seek_group)
    sync_lite_subscription = forward(Messaging.sync_lite_subscription)
    receive = forward(Messaging.receive)
    end_transaction_group_nowait = forward_pending(Transactions.end_transaction_group_nowait)


def _forwarded() -> list[str]:
    """RemoteBroker's methods made by ``forward`` (the rest are written out)."""
    return sorted(
        name
        for name, value in vars(RemoteBroker).items()
        if inspect.isfunction(value) and value.__qualname__.startswith("forward(")
    )


def test_most_operations_are_forwarded_and_each_carries_its_declaration() -> None:
    names = _forwarded()
    assert len(names) >= 50
    declared = operations(Broker)
    for name in names:
        made = vars(RemoteBroker)[name]
        assert made.__name__ == name
        assert made.__doc__ == declared[name].__doc__ and made.__doc__
        assert inspect.signature(made) == inspect.signature(declared[name]), name


def test_positional_parameters_go_as_args_with_their_defaults_filled_in() -> None:
    recorder = Recorder()
    assert recorder.create_topic("orders", brokers=("b1", "b2")) == "answer"
    assert recorder.calls == [
        (
            "create_topic",
            ["orders", MessageType.NORMAL, DEFAULT_QUEUE_COUNT, "rw", ["b1", "b2"]],
            {},
        )
    ]


def test_a_call_by_position_gets_the_defaults_of_what_it_leaves_out() -> None:
    recorder = Recorder()
    everything = FilterSpec()
    recorder.receive("billing", "orders", everything, 32, 30_000)
    recorder.receive("billing", "orders", everything, 32, 30_000, "c1", 2)
    recorder.receive("billing", "orders", everything, 32, invisible_ms=5, queue_id=1)
    assert [args for _, args, _ in recorder.calls] == [
        ["billing", "orders", everything, 32, 30_000, "", None, ""],
        ["billing", "orders", everything, 32, 30_000, "c1", 2, ""],
        ["billing", "orders", everything, 32, 5, "", 1, ""],
    ]
    with pytest.raises(TypeError):
        recorder.receive("billing", "orders", everything, 32)
    with pytest.raises(TypeError):
        recorder.receive("billing", "orders", everything, 32, 5, "c1", 2, "h", 3)
    assert len(recorder.calls) == 3


def test_a_nowait_operation_is_a_pending_call_whose_answer_is_already_durable() -> None:
    recorder = Recorder()
    answer = recorder.end_transaction_group_nowait("g1", "commit")
    assert isinstance(answer, Pending) and recorder.calls == []  # nothing crossed yet
    written = answer.write()
    assert written.result == "answer" and written.durable is ALREADY_DURABLE
    assert recorder.calls == [
        ("end_transaction_group_nowait", ["g1", "commit", DecisionSource.CLIENT, None], {})
    ]
    assert RemoteBroker.end_transaction_nowait.__qualname__.startswith("forward(")


def test_sequences_go_as_lists_and_mappings_as_dicts() -> None:
    recorder = Recorder()
    recorder.update_config(_Settings({"max_body_size": 8}))
    recorder.seek_group("billing", "orders", _Settings({0: 5}))
    recorder.sync_lite_subscription("c1", "billing", "orders", "add", ("a", "b"))
    sent = [args for _, args, _ in recorder.calls]
    assert sent[0] == [{"max_body_size": 8}] and type(sent[0][0]) is dict
    assert type(sent[1][2]) is dict
    assert sent[2][4] == ["a", "b"] and sent[2][5] is None


def test_keyword_only_and_double_star_parameters_go_as_kwargs() -> None:
    recorder = Recorder()
    recorder.create_group("billing", fifo=True)
    recorder.update_group("billing", fifo=False, broadcast=True)
    (_, args, kwargs), (_, args2, kwargs2) = recorder.calls
    assert args == ["billing"]
    assert kwargs is not None and kwargs["fifo"] is True
    assert kwargs["max_delivery_attempts"] == DEFAULT_MAX_DELIVERY_ATTEMPTS
    assert (args2, kwargs2) == (["billing"], {"fifo": False, "broadcast": True})


def test_a_call_that_does_not_fit_the_declaration_fails_before_anything_is_sent() -> None:
    recorder = Recorder()
    with pytest.raises(TypeError):
        recorder.create_topic("orders", no_such_parameter=1)
    with pytest.raises(TypeError):
        recorder.create_group("billing", True)
    assert recorder.calls == []


class _Settings:
    """A mapping that is not a dict (the wire would not carry it as one)."""

    def __init__(self, items: dict[Any, Any]) -> None:
        self._items = items

    def keys(self) -> Any:
        return self._items.keys()

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]
