"""A check-answered commit on a sync-flush store reaches its topic and wakes its consumers.

The failure this guards against: the producer's checker answered COMMIT,
EndTransaction was acknowledged (the real message durable), yet the message
was not readable from its queue and no long poll was woken until some later
append's fsync. The store's fsync had run while the commit's append was
between its write and its dispatch (see tests/store/test_sync_visibility.py);
under load it happened with the check scan's own op append beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from halfmoon.broker import Broker, FakeClock
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.check import CheckRequest
from tests.store.test_sync_visibility import WAIT_S, fsync_inside_next_append


class Producers:
    """A CheckSender whose one live producer takes every check."""

    def __init__(self) -> None:
        self.checks: list[CheckRequest] = []

    def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
        self.checks.extend(checks)
        return [True] * len(checks)


def test_commit_answered_to_a_check_is_visible_and_announced_once_acknowledged(
    real_broker: Callable[..., Broker], clock: FakeClock
) -> None:
    broker = real_broker()
    broker.create_topic("orders", MessageType.TRANSACTION, queue_count=1)
    arrived = threading.Event()
    broker.add_arrival_listener(
        lambda topic, queue_id: arrived.set() if topic == "orders" else None
    )
    producers = Producers()
    broker.set_check_sender(producers)
    (sent,) = broker.send(
        [
            OutgoingMessage(
                "orders", b"paid", message_type=MessageType.TRANSACTION, producer_group="pg"
            )
        ]
    )

    config = broker.transactions.config
    clock.advance(max(config.timeout_ms, config.check_interval_ms) + 1)
    broker.tick()  # the check scan asks the producer
    (check,) = producers.checks
    assert check.transaction_id == sent.transaction_id

    with fsync_inside_next_append(broker.store):  # the commit's append is the next one
        written = broker.end_transaction_nowait(
            "orders", check.message.message_id, check.transaction_id, "commit", "check"
        )
    result = written.result
    assert result.state is TxnState.COMMITTED and result.changed
    assert written.durable.result(timeout=WAIT_S) is None  # EndTransaction answers OK now

    got = broker.pull("c", "orders", 0, 0, 10, FilterSpec()).messages
    assert [m.body for m in got] == [b"paid"]
    assert arrived.wait(WAIT_S), "no consumer of the topic was told of the commit"
    assert broker.list_transactions() == []
