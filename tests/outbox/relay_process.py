"""A relay process for the crash and concurrency tests.

    python -m tests.outbox.relay_process DB_URL PREFIX OUT_FILE [--workers N] [--batch N] [--delay
S]

Publishes to a file target: one ``O_APPEND`` write per message (atomic, and
in the kernel before ``publish`` returns, so a SIGKILL loses no line), so the
file's line order is the order in which all processes published. ``--delay``
is the time one publish takes, to make a kill land in the middle of a batch.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Sequence

from halfmoon.outbox import Outbox, OutboxRecord, PublishTarget, Relay


class FileTarget(PublishTarget):
    name = "file"

    def __init__(self, path: str, delay: float = 0.0) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.delay = delay

    def publish(self, records: Sequence[OutboxRecord]) -> list[BaseException | None]:
        for record in records:
            if self.delay:
                time.sleep(self.delay)  # the publish's own duration, not synchronisation
            os.write(
                self.fd,
                f"{record.message_id} {record.aggregate_id} {record.payload.decode()} "
                f"{os.getpid()}\n".encode(),
            )
        return [None] * len(records)


def read_lines(path: str) -> list[tuple[str, str, int, int]]:
    """(message id, aggregate, sequence, pid) per published line, in publish order."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [
            (m, a, int(s), int(p)) for m, a, s, p in (line.split() for line in f if line.strip())
        ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("prefix")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=60.0)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    relay = Relay(
        Outbox(args.db, table_prefix=args.prefix),
        FileTarget(args.out, args.delay),
        workers=args.workers,
        batch_size=args.batch,
        poll_interval=0.05,
        lease_seconds=args.lease,
        sent_retention=None,
    )
    relay.start()
    print("relay ready", flush=True)
    stop.wait()
    relay.stop()


if __name__ == "__main__":
    main()
