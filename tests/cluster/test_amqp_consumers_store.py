"""The etcd record of every worker's AMQP consumers, on a real etcd, instances standing for
proxy workers: exclusive consumers decided in one transaction (of many racing, one wins), a
dead worker's consumers gone with its lease and its auto-delete queue claimed by exactly
one survivor, x-expires claimed only once nobody used the queue, consumers recorded again
under a new lease (or let go when the queue was taken meanwhile), and nothing decided with
etcd unreachable."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from urllib.parse import quote

import pytest

from halfmoon.amqp.cluster_consumers import ConsumersUnknown, Deletion, Refusal
from halfmoon.amqp.topology import Queue
from halfmoon.cluster.coordination.amqp_consumers import EtcdClusterConsumers, consumers_prefix
from halfmoon.cluster.coordination.etcd import EtcdClient
from tests.cluster.etcd_server import EtcdServer
from tests.waiting import until

DEADLINE_S = 30.0


@asynccontextmanager
async def worker(
    url: str, cluster: str, name: str, ttl_s: int = 30, lease: Callable[[], int] | None = None
) -> AsyncIterator[tuple[EtcdClusterConsumers, EtcdClient, int]]:
    """One worker's record (its own etcd client and lease), following the directories."""
    async with EtcdClient.from_url(url) as client:
        granted = await client.grant_lease(ttl_s)
        consumers = EtcdClusterConsumers(client, cluster, name, lease or (lambda: granted))
        await consumers.start()
        try:
            yield consumers, client, granted
        finally:
            await consumers.stop()
            await client.revoke_lease(granted)


async def _changed(revision: Awaitable[int], before: int) -> bool:
    return await revision != before


def queue(name: str, **arguments: object) -> Queue:
    auto_delete = bool(arguments.pop("auto_delete", False))
    return Queue(name, f"%{name}", durable=False, auto_delete=auto_delete, arguments=arguments)


def test_of_workers_racing_for_an_exclusive_consumer_one_wins(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with (
            worker(etcd.url, cluster_name, "p/1") as (a, _, _),
            worker(etcd.url, cluster_name, "p/2") as (b, _, _),
            worker(etcd.url, cluster_name, "p/3") as (c, _, _),
        ):
            for n in range(10):
                raced = queue(f"raced-{n}")
                outcomes = await asyncio.gather(
                    *(w.attach(f"{i}-c", raced, exclusive=True) for i, w in enumerate((a, b, c)))
                )
                assert sorted(outcomes, key=str) == [
                    None, Refusal.EXCLUSIVE, Refusal.EXCLUSIVE
                ], outcomes  # fmt: skip
                assert await b.count(raced.stored) == 1
            # A shared consumer is refused while one holds it, and welcome once it went.
            held = queue("held")
            assert await a.attach("x", held, exclusive=True) is None
            assert await b.attach("s", held, exclusive=False) is Refusal.EXCLUSIVE
            await a.detach("x")
            assert await b.attach("s", held, exclusive=False) is None
            assert await c.attach("s2", held, exclusive=False) is None
            assert await a.attach("x2", held, exclusive=True) is Refusal.EXCLUSIVE
            assert await a.count(held.stored) == 2

    asyncio.run(scenario())


def test_a_dead_workers_auto_delete_queue_is_claimed_by_one_survivor(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        passing = queue("passing", auto_delete=True)
        async with (
            worker(etcd.url, cluster_name, "p/1") as (a, _, _),
            worker(etcd.url, cluster_name, "p/2") as (b, _, _),
            EtcdClient.from_url(etcd.url) as dying_client,
        ):
            short = await dying_client.grant_lease(1)  # never renewed: the worker is dead
            dying = EtcdClusterConsumers(dying_client, cluster_name, "p/3", lambda: short)
            assert await dying.attach("c", passing, exclusive=False) is None
            await a.created(passing.stored)  # declared at this moment elsewhere: armed stays
            assert not await a.claim_deletion(passing, Deletion.AUTO_DELETE)  # it has one
            await until(
                lambda: (
                    a.due(passing) is Deletion.AUTO_DELETE
                    and b.due(passing) is Deletion.AUTO_DELETE
                ),
                DEADLINE_S,
                "the dead worker's consumer to end with its lease",
            )
            claims = await asyncio.gather(
                a.claim_deletion(passing, Deletion.AUTO_DELETE),
                b.claim_deletion(passing, Deletion.AUTO_DELETE),
            )
            assert sorted(claims) == [False, True]
            # While one deletes it, no consumer comes.
            assert await a.attach("late", passing, exclusive=False) is Refusal.DELETING
            await a.deleted(passing.stored)
            assert await b.count(passing.stored) == 0
            # Never consumed from: never due.
            fresh = queue("fresh", auto_delete=True)
            await a.created(fresh.stored)
            assert a.due(fresh) is None

    asyncio.run(scenario())


def test_x_expires_is_claimed_only_when_nobody_used_the_queue(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        # Refreshed every 0.5 s, so taken for unused after 2.5 s without a use.
        lapsing = queue("lapsing", **{"x-expires": 2000})
        async with (
            worker(etcd.url, cluster_name, "p/1") as (a, _, _),
            worker(etcd.url, cluster_name, "p/2") as (b, client, _),
        ):
            used_key = f"{consumers_prefix(cluster_name)}{quote(lapsing.stored, safe='')}/used"

            async def used_revision() -> int:
                kv = await client.get(used_key)
                return kv.mod_revision if kv is not None else 0

            await until(lambda: a.following and b.following, DEADLINE_S, "the listings")
            assert a.due(lapsing) is None  # first heard of now: its clock starts
            # B uses it every 0.5 s for two seconds: A never finds it due meanwhile.
            for _ in range(4):
                b.used(lapsing)
                await asyncio.sleep(0.5)  # the scenario: uses spaced under x-expires
                assert a.due(lapsing) is None
            await until(lambda: a.due(lapsing), DEADLINE_S, "A to take the queue for unused")
            # A use through B since: A's claim fails, whether A heard of it by now (then
            # it is not due) or not (etcd's `used` changed since A last heard of it).
            before = await used_revision()
            await asyncio.sleep(0.5)  # the scenario: past B's refresh period, written at once
            b.used(lapsing)
            await until(lambda: _changed(used_revision(), before), DEADLINE_S, "B's write")
            assert not await a.claim_deletion(lapsing, Deletion.EXPIRED)
            await until(lambda: a.due(lapsing), DEADLINE_S, "A to take it for unused again")
            await until(lambda: b.due(lapsing), DEADLINE_S, "B to take it for unused too")
            claims = await asyncio.gather(
                a.claim_deletion(lapsing, Deletion.EXPIRED),
                b.claim_deletion(lapsing, Deletion.EXPIRED),
            )
            assert sorted(claims) == [False, True]  # one party deletes it

    asyncio.run(scenario())


def test_consumers_are_recorded_again_under_a_new_lease(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        leases: list[int] = []
        lost: list[str] = []
        async with (
            EtcdClient.from_url(etcd.url) as client,
            worker(etcd.url, cluster_name, "p/2") as (other, _, _),
        ):
            leases.append(await client.grant_lease(30))
            me = EtcdClusterConsumers(client, cluster_name, "p/1", lambda: leases[-1])
            me.on_lost = lost.append
            await me.start()
            try:
                kept, taken = queue("kept"), queue("taken")
                assert await me.attach("k", kept, exclusive=False) is None
                assert await me.attach("t", taken, exclusive=False) is None
                await client.revoke_lease(leases[0])  # lapsed: etcd dropped both keys
                assert await other.count(kept.stored) == 0
                assert await other.attach("x", taken, exclusive=True) is None
                leases.append(await client.grant_lease(30))
                await until(lambda: lost == ["t"], DEADLINE_S, "the taken queue's consumer lost")
                await until(lambda: other.count(kept.stored), DEADLINE_S, "k recorded again")
                assert await other.count(taken.stored) == 1  # the exclusive one only
            finally:
                await me.stop()
                await client.revoke_lease(leases[-1])

    asyncio.run(scenario())


def test_an_exclusive_consumer_moves_to_a_new_lease_while_the_old_one_holds(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        lost: list[str] = []
        async with (
            EtcdClient.from_url(etcd.url) as client,
            worker(etcd.url, cluster_name, "p/2") as (other, _, _),
        ):
            leases = [await client.grant_lease(30)]
            me = EtcdClusterConsumers(client, cluster_name, "p/1", lambda: leases[-1])
            me.on_lost = lost.append
            await me.start()
            try:
                own = queue("own")
                assert await me.attach("e", own, exclusive=True) is None
                # A new lease before the old one lapsed (the session directory grants one
                # after any failed renewal): the consumer's keys move to it.
                leases.append(await client.grant_lease(30))
                key = f"{consumers_prefix(cluster_name)}{quote(own.stored, safe='')}/c/e"

                async def moved() -> bool:
                    kv = await client.get(key)
                    return kv is not None and kv.lease == leases[-1]

                await until(moved, DEADLINE_S, "the consumer's key under the new lease")
                await client.revoke_lease(leases[0])
                assert await other.count(own.stored) == 1
                assert await other.attach("s", own, exclusive=False) is Refusal.EXCLUSIVE
                assert lost == []
            finally:
                await me.stop()
                await client.revoke_lease(leases[-1])

    asyncio.run(scenario())


def test_a_cancel_while_etcd_is_away_is_recorded_when_it_is_back(
    own_etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        gone = queue("gone", auto_delete=True)
        async with worker(own_etcd.url, cluster_name, "p/1") as (me, client, _):
            assert await me.attach("c", gone, exclusive=True) is None
            own_etcd.stop()
            await me.detach("c")  # not recorded yet: the queue still counts as in use
            assert not await me.claim_deletion(gone, Deletion.AUTO_DELETE)
            own_etcd.restart()
            await until(lambda: _changed(me.count(gone.stored), 1), DEADLINE_S, "the key deleted")
            assert await client.get(f"{consumers_prefix(cluster_name)}%25gone/x") is None
            assert await me.claim_deletion(gone, Deletion.AUTO_DELETE)

    asyncio.run(scenario())


def test_with_etcd_unreachable_nothing_is_decided(cluster_name: str) -> None:
    async def scenario() -> None:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        async with EtcdClient.from_url(f"etcd://127.0.0.1:{port}", timeout=1) as client:
            away = EtcdClusterConsumers(client, cluster_name, "p/1", lambda: 1)
            unused = queue("unused", auto_delete=True, **{"x-expires": 1})
            with pytest.raises(ConsumersUnknown):
                await away.attach("c", unused, exclusive=True)
            with pytest.raises(ConsumersUnknown):
                await away.attach("c", unused, exclusive=False)
            with pytest.raises(ConsumersUnknown):
                await away.count(unused.stored)
            assert away.due(unused) is None  # never listed: nothing heard
            assert not await away.claim_deletion(unused, Deletion.AUTO_DELETE)
            assert not await away.claim_deletion(unused, Deletion.EXPIRED)

    asyncio.run(scenario())


def test_what_a_deletion_cut_short_left_is_cleared_once_no_queue_of_its_name_is_known(
    etcd: EtcdServer, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halfmoon.cluster.coordination import amqp_consumers

    def directory(q: Queue) -> str:
        return f"{consumers_prefix(cluster_name)}{quote(q.stored, safe='')}/"

    async def scenario() -> None:
        gone, held, kept = queue("gone"), queue("held"), queue("kept")
        async with (
            worker(etcd.url, cluster_name, "p/1") as (a, client, _),
            worker(etcd.url, cluster_name, "p/2") as (b, _, _),
        ):
            await until(lambda: a.following and b.following, DEADLINE_S, "the listings")
            # A worker died after deleting these queues, before their keys: what is left
            # is the unleased part (a consumer's key of `held` is another worker's, live).
            for q in (gone, held, kept):
                await client.put(directory(q) + "armed", b"1")
                await client.put(directory(q) + "used", b"1")
            assert await b.attach("c", held, exclusive=False) is None

            async def keys(q: Queue) -> int:
                return await client.count_prefix(directory(q))

            async def heard_all() -> bool:
                await a.clear_leftovers(lambda stored: True)  # all known: nothing goes
                return all(s in a._heard for s in (gone.stored, held.stored, kept.stored))

            await until(heard_all, DEADLINE_S, "A to hear of the three directories")
            # Unknown for less than the grace period: left alone.
            await a.clear_leftovers(lambda stored: False)
            assert await keys(gone) == 2
            monkeypatch.setattr(amqp_consumers, "LEFTOVER_AFTER_S", 0.0)

            async def cleared() -> bool:
                await a.clear_leftovers(lambda stored: stored == kept.stored)
                return await keys(gone) == 0

            await until(cleared, DEADLINE_S, "the left keys of `gone` to be cleared")
            assert await keys(kept) == 2  # a queue this worker knows keeps its keys
            assert await keys(held) == 3  # one with a consumer anywhere keeps them too

    asyncio.run(scenario())
