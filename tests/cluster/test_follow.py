"""Following an etcd prefix (the loop under the view, the auth follower and the command
relay), against a real etcd: list, then every change after it, and afresh after a failure."""

from __future__ import annotations

import asyncio

from halfmoon.cluster.coordination.etcd import EtcdClient, KeyValue, WatchBatch
from halfmoon.cluster.coordination.follow import follow_prefix
from tests.cluster.etcd_server import EtcdServer


def test_a_listing_then_each_change_after_it_and_afresh_after_a_failure(
    etcd: EtcdServer, cluster_name: str
) -> None:
    prefix = f"/follow-test/{cluster_name}/"

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            await client.put(prefix + "a", b"1")
            listings: list[tuple[list[str], int]] = []
            changes: list[tuple[str, str]] = []
            lost: list[BaseException] = []
            heard = 0
            event = asyncio.Event()

            async def listed(kvs: list[KeyValue], revision: int) -> None:
                listings.append(([kv.key for kv in kvs], revision))
                if len(listings) == 1:
                    raise RuntimeError("a reader's bug")  # must not stop the follower
                event.set()

            async def changed(batch: WatchBatch) -> None:
                changes.extend((e.kind, e.kv.key) for e in batch.events)
                event.set()

            async def on_lost(error: BaseException) -> None:
                lost.append(error)

            def on_heard() -> None:
                nonlocal heard
                heard += 1

            follower = asyncio.create_task(
                follow_prefix(
                    client,
                    prefix,
                    what="test",
                    listed=listed,
                    changed=changed,
                    lost=on_lost,
                    heard=on_heard,
                    retry_s=0.05,
                )
            )
            try:
                async with asyncio.timeout(10):
                    while len(listings) < 2:
                        await event.wait()
                        event.clear()
                assert [type(e) for e in lost] == [RuntimeError]
                assert listings[1][0] == [prefix + "a"]
                await client.put(prefix + "b", b"2")  # after the listing: a change
                await client.put("/follow-test-elsewhere", b"x")  # outside the prefix
                await client.delete(prefix + "a")
                async with asyncio.timeout(10):
                    while len(changes) < 2:
                        await event.wait()
                        event.clear()
                assert changes == [("PUT", prefix + "b"), ("DELETE", prefix + "a")]
                assert heard >= 3  # two listings and at least one watch answer
            finally:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)

    asyncio.run(scenario())
