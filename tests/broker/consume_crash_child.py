"""Child of test_transactional_consume_crash: one consume-transform-produce commit, SIGKILLed at
a chosen step.

Usage: python -m tests.broker.consume_crash_child DATA_DIR META_DIR STEP SNAPSHOT_AFTER_RECEIVE

Sends ``INPUTS`` messages to ``in``, writes the consumption state, receives
them (and, with SNAPSHOT_AFTER_RECEIVE=1, writes the state again: the
deliveries are then in it), registers for each an output half message to
``out`` and an ack in transaction group ``g``, commits, and writes the state
once more. It kills itself with SIGKILL at STEP:

- ``registered``: before the commit;
- ``decided``: right after the group's commit record is written;
- ``members``: after the first batch of output messages is written;
- ``applied``: once the commit is applied in memory;
- ``state_written``: after the state files, before the commit marker;
- ``done``: after everything.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from halfmoon.broker import Broker, BrokerConfig
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transactions import TransactionConfig
from halfmoon.broker.transactions.oplog import PROPERTY_OP
from halfmoon.store import MessageStore, StoreConfig
from halfmoon.store.message import Message

INPUTS = 6
GROUP = "workers"
STEPS = ("registered", "decided", "members", "applied", "state_written", "done")


def open_broker(data_dir: Path, meta_dir: Path) -> tuple[MessageStore, Broker]:
    store = MessageStore(StoreConfig(data_dir=data_dir, segment_size=64 * 1024, flush="sync"))
    broker = Broker(store, meta_dir, BrokerConfig(), None, TransactionConfig(group_batch_size=2))
    return store, broker


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    data_dir, meta_dir, step = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    snapshot_after_receive = sys.argv[4] == "1"
    store, broker = open_broker(data_dir, meta_dir)
    broker.create_topic("in", MessageType.NORMAL, queue_count=2)
    broker.create_topic("out", MessageType.TRANSACTION, queue_count=2)
    broker.create_group(GROUP, consume_from="earliest")
    broker.send([OutgoingMessage("in", f"i{n}".encode()) for n in range(INPUTS)])

    def persist() -> None:
        broker.consuming.persist(broker._write_consumption_state)

    persist()
    received = broker.receive(GROUP, "in", FilterSpec(), INPUTS, 60_000)
    assert len(received) == INPUTS, received
    if snapshot_after_receive:
        persist()
    for message in received:
        broker.send(
            [
                OutgoingMessage(
                    "out",
                    b"o" + message.body,
                    message_type=MessageType.TRANSACTION,
                    producer_group="pg",
                    transaction_group="g",
                )
            ]
        )
        broker.transactional_ack("g", GROUP, "in", message.receipt_handle)
    if step == "registered":
        die()

    append = store.append

    def watched_append(messages: list[Message]):  # type: ignore[no-untyped-def]
        results = append(messages)
        if step == "decided" and any(
            m.properties.get(PROPERTY_OP) == "group_commit" for m in messages
        ):
            die()
        if step == "members" and any(m.prepared_transaction_offset for m in messages):
            die()
        return results

    store.append = watched_append  # type: ignore[method-assign]
    broker.end_transaction_group("g", "commit", consume_actions=INPUTS)
    if step == "applied":
        die()
    write_state = broker._write_consumption_state

    def state_then_die() -> None:
        write_state()
        if step == "state_written":
            die()

    broker.consuming.persist(state_then_die)
    die()  # "done"


if __name__ == "__main__":
    main()
