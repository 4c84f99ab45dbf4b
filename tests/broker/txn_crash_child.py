"""Child process of test_transaction_crash: transactions on a real store until SIGKILLed.

Usage: python -m tests.broker.txn_crash_child DATA_DIR META_DIR ROUND SEED

Prints "ready" once open. Two threads work at once:
- singles: send a half message (body ``c:``/``r:``/``p:`` + id: the intent to
  commit, roll back or leave pending), then end it as intended; prints
  ``C <id>`` / ``R <id>`` once the decision is acknowledged (durable);
- groups: send 3 to 40 half members of a fresh group (body ``gc:`` / ``gr:``
  + id), prints ``GI <group> <id,id,...>`` once all are durable, then ends the
  group as intended and prints ``GC <group>`` / ``GR <group>``.
Every line is flushed at once. Commit appends pause 2 ms after writing (see
``slow_commit_append``) to widen the window in which a group commit is half done.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

from halfmoon.broker import Broker, BrokerConfig
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transactions import TransactionConfig
from halfmoon.store import MessageStore, StoreConfig

TOPIC = "orders"
QUEUES = 4


def open_broker(data_dir: Path, meta_dir: Path) -> tuple[MessageStore, Broker]:
    store = MessageStore(StoreConfig(data_dir=data_dir, segment_size=64 * 1024, flush="sync"))
    broker = Broker(
        store,
        meta_dir,
        BrokerConfig(),
        None,
        TransactionConfig(group_batch_size=4, snapshot_interval_ms=50),
    )
    return store, broker


def main() -> None:
    data_dir, meta_dir = Path(sys.argv[1]), Path(sys.argv[2])
    round_number, seed = int(sys.argv[3]), int(sys.argv[4])
    store, broker = open_broker(data_dir, meta_dir)
    append = store.append

    def slow_commit_append(messages):  # type: ignore[no-untyped-def]
        # Commits (records carrying a half offset) pause after being written, so a kill
        # often lands in the middle of a group commit: some members written, others not.
        results = append(messages)
        if any(m.prepared_transaction_offset for m in messages):
            time.sleep(0.002)  # the window a kill is meant to land in
        return results

    store.append = slow_commit_append  # type: ignore[method-assign]
    if broker.topics.find(TOPIC) is None:
        broker.create_topic(TOPIC, MessageType.TRANSACTION, queue_count=QUEUES)
    out = sys.stdout
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            out.write(line + "\n")
            out.flush()

    def half(message_id: str, body: str, group: str | None = None) -> OutgoingMessage:
        return OutgoingMessage(
            TOPIC, body.encode(), message_id=message_id, message_type=MessageType.TRANSACTION,
            producer_group="pg", transaction_group=group,
        )  # fmt: skip

    def singles() -> None:
        rng = random.Random(seed)
        n = 0
        while True:
            n += 1
            message_id = f"s{round_number}-{n}"
            intent = rng.choice("ccccrrp")
            (result,) = broker.send([half(message_id, f"{intent}:{message_id}")])
            store.wait_durable(result.end_offset)
            if intent == "p":
                continue
            resolution = "commit" if intent == "c" else "rollback"
            broker.end_transaction(TOPIC, message_id, result.transaction_id, resolution, "client")
            say(f"{intent.upper()} {message_id}")

    def groups() -> None:
        rng = random.Random(seed + 1)
        n = 0
        while True:
            n += 1
            group = f"g{round_number}-{n}"
            intent = rng.choice("ccr")
            ids = [f"{group}-m{i}" for i in range(rng.randint(3, 40))]
            for start in range(0, len(ids), 7):
                results = broker.send(
                    [half(i, f"g{intent}:{i}", group) for i in ids[start : start + 7]]
                )
                store.wait_durable(results[-1].end_offset)
            say(f"GI {group} {','.join(ids)}")
            broker.end_transaction_group(group, "commit" if intent == "c" else "rollback")
            say(f"G{intent.upper()} {group}")

    def ticker() -> None:
        while True:
            broker.tick()
            threading.Event().wait(0.01)

    say("ready")
    for work in (singles, groups, ticker):
        threading.Thread(target=work, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
