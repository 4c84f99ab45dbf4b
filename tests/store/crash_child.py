"""Child process of test_crash: appends with sync flush from several threads until killed.

Usage: python -m tests.store.crash_child DATA_DIR ROUND THREADS
Prints "ready" once open, then one line "ack <commit_log_offset> <id>" per
durable append (after the fsync covering it), flushed at once.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path

from halfmoon.store import Message, MessageStore, StoreConfig


def body_for(message_id: str) -> bytes:
    seed = hashlib.sha256(message_id.encode()).digest()
    return seed * (1 + int.from_bytes(seed[:2], "big") % 40)


def main() -> None:
    data_dir, round_number, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = MessageStore(
        StoreConfig(data_dir=data_dir, segment_size=256 * 1024, flush="sync", max_body_size=8192)
    )
    out = sys.stdout
    lock = threading.Lock()
    out.write("ready\n")
    out.flush()

    def writer(worker: int) -> None:
        n = 0
        while True:
            message_id = f"r{round_number}-w{worker}-{n}"
            n += 1
            message = Message(
                topic="crash",
                body=body_for(message_id),
                queue_id=worker % 4,
                properties={"UNIQ_KEY": message_id},
            )
            [result] = store.put([message])
            with lock:
                out.write(f"ack {result.commit_log_offset} {message_id}\n")
                out.flush()

    for worker in range(threads):
        threading.Thread(target=writer, args=(worker,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
