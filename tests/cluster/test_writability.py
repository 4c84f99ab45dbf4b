"""A proxy keeps every broker's writability fresh, so sends are planned on the event loop
(``BrokerPool.keep_writability_fresh``), not only for the broker last sent to."""

from __future__ import annotations

import asyncio
from typing import Any

from halfmoon.cluster.proxy import broker_pool
from halfmoon.cluster.proxy.broker_pool import BrokerPool
from tests.cluster.test_fencing import FakeRemote, FakeView
from tests.waiting import until


class WritableRemote(FakeRemote):
    def __init__(self, endpoint: str, epoch: int | None) -> None:
        super().__init__(endpoint, epoch)
        self.writable = True
        self.asked = 0

    def suspect(self) -> bool:
        return False

    def writable_within(self, timeout_s: float) -> bool:
        self.asked += 1
        return self.writable


def test_every_connected_broker_stays_known_to_the_event_loop() -> None:
    async def scenario() -> None:
        view = FakeView()
        opened: dict[str, WritableRemote] = {}

        def connect(endpoint: str, epoch: int | None) -> Any:
            opened[endpoint] = WritableRemote(endpoint, epoch)
            return opened[endpoint]

        pool = BrokerPool(view, None, asyncio.get_running_loop(), connect=connect)  # type: ignore[arg-type]
        view.brokers = {"broker-a": {"endpoint": "h:1"}, "broker-b": {"endpoint": "h:2"}}
        pool.sync_connections()
        assert pool.writable_known("broker-a") is None  # nobody asked yet
        fresh = asyncio.create_task(pool.keep_writability_fresh())
        try:
            names = ("broker-a", "broker-b")
            await until(lambda: all(pool.writable_known(n) for n in names), 5, "both brokers asked")
            # Longer than an answer lives: still known, asked again meanwhile.
            asked = opened["h:2"].asked
            await asyncio.sleep(broker_pool.WRITABLE_TTL_S * 1.5)  # past an answer's life
            assert all(pool.writable_known(n) for n in names)
            assert opened["h:2"].asked > asked
            # A broker drained (write-perm --wipe) is seen within the refresh interval.
            opened["h:2"].writable = False
            await until(lambda: pool.writable_known("broker-b") is False, 5, "the drain seen")
            assert pool.writable_known("broker-a") is True
        finally:
            fresh.cancel()

    asyncio.run(scenario())
