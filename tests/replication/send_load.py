"""Official-client producers sending to a broker group without pause, for failover tests.

Each of ``threads`` producers sends ``body-N`` messages to ``orders`` through
the group's proxy until stopped, one at a time. What was acknowledged (and
when), what failed and why are kept for the test's checks.
"""

from __future__ import annotations

import collections
import threading
import time
from types import TracebackType

from tests.replication.group_cluster import GroupCluster
from tests.replication.test_group_replication import message, producer


class SendLoad:
    def __init__(self, group: GroupCluster, threads: int) -> None:
        self.acked: set[str] = set()
        self.failed: set[str] = set()  # refused or timed out: not acknowledged
        self.acked_at: list[float] = []  # monotonic time of each acknowledgement
        self.errors: collections.Counter[str] = collections.Counter()
        self._group = group
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._counter = iter(range(10**9))
        self._threads = [threading.Thread(target=self._send_forever) for _ in range(threads)]

    def __enter__(self) -> SendLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        print("send errors:", self.errors.most_common(5))

    def _send_forever(self) -> None:
        client = producer(self._group, "orders")
        try:
            while not self._stop.is_set():
                with self._lock:
                    i = next(self._counter)
                body = f"body-{i}"
                try:
                    client.send(message("orders", i))
                except Exception as error:  # noqa: BLE001 - refused or timed out: not acknowledged
                    with self._lock:
                        self.errors[type(error).__name__ + str(error)[:200]] += 1
                        self.failed.add(body)
                    time.sleep(0.05)  # not synchronization: keeps a refused sender from spinning
                    continue
                with self._lock:
                    self.acked.add(body)
                    self.acked_at.append(time.monotonic())
        finally:
            client.shutdown()
