"""Child process of test_fanout: appends fanouts (one record, ten queues) with sync flush
from several threads until killed.

Usage: python -m tests.store.fanout_child DATA_DIR ROUND THREADS
Prints "ready" once open, then one line "ack <commit_log_offset> <id>" per durable fanout
(after the fsync covering it), flushed at once. Every fourth append is a plain one to the
first queue alone, so fanout and single-queue records interleave in the log and the queue.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from halfmoon.store import Message, MessageStore, StoreConfig
from tests.store.crash_child import body_for

QUEUES = [f"fan{i}" for i in range(10)]


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
            message = Message(QUEUES[0], body_for(message_id), properties={"UNIQ_KEY": message_id})
            if n % 4:
                results = store.append_fanout(message, [(q, 0) for q in QUEUES[1:]])
            else:
                results = store.append([message])
            store.wait_durable(results[0].end_offset)
            with lock:
                out.write(f"ack {results[0].commit_log_offset} {message_id}\n")
                out.flush()

    for worker in range(threads):
        threading.Thread(target=writer, args=(worker,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
