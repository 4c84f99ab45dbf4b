"""``BrokerPool.follow_view``: how soon a broker listed in etcd but not answering is tried again.

The view is a stand-in whose waits end at once (as if their time had passed), so the test
reads the pool's schedule of retries instead of timing it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from halfmoon.cluster.internal.wire import BrokerUnavailable
from halfmoon.cluster.proxy.broker_pool import FIRST_RETRY_S, RECONNECT_S, BrokerPool
from tests.cluster.test_fencing import FakeRemote, FakeView


class InstantView(FakeView):
    """Each wait returns at once: satisfied if the condition holds, else timed out."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.on_wait: Callable[[InstantView], None] = lambda view: None

    async def wait_for(self, condition: Callable[[Any], bool], timeout: float) -> None:
        self.waits.append(timeout)
        self.on_wait(self)
        await asyncio.sleep(0)
        if not condition(self):
            raise TimeoutError


def test_a_new_master_not_answering_yet_is_retried_within_milliseconds_then_less_often() -> None:
    view = InstantView()
    attempts: list[str] = []
    answering_after = 6  # the new master's service is registered at its 7th attempt

    def connect(endpoint: str, epoch: int | None) -> Any:
        attempts.append(endpoint)
        if endpoint == "new:1" and attempts.count("new:1") <= answering_after:
            raise BrokerUnavailable("UNIMPLEMENTED: Method not found!")
        return FakeRemote(endpoint, epoch)

    async def run() -> list[float]:
        pool = BrokerPool(view, None, asyncio.get_running_loop(), connect=connect)  # type: ignore[arg-type]
        view.brokers = {"g1": {"endpoint": "old:1", "member": "b0", "epoch": 1}}
        changed_at: list[int] = []

        def on_wait(v: InstantView) -> None:
            if len(v.waits) == 2:  # connected to the old master: the group fails over
                v.brokers = {"g1": {"endpoint": "new:1", "member": "b1", "epoch": 2}}
                changed_at.append(len(v.waits))
            if pool.is_connected("g1") and pool.broker("g1").endpoint == "new:1":  # type: ignore[attr-defined]
                task.cancel()

        view.on_wait = on_wait
        task = asyncio.create_task(pool.follow_view())
        with contextlib.suppress(asyncio.CancelledError):  # cancelled once it connected
            await asyncio.wait_for(task, 10)
        return view.waits[changed_at[0] :]

    retries = asyncio.run(run())
    assert attempts.count("new:1") == answering_after + 1
    expected = [min(FIRST_RETRY_S * 2**i, RECONNECT_S) for i in range(answering_after)]
    assert retries[:answering_after] == expected, retries
    assert retries[0] == FIRST_RETRY_S < RECONNECT_S
