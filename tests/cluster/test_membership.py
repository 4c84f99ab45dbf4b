"""Membership under leases, with real member processes: register, SIGKILL, expire, restart."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import pytest

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_tls import PLAIN
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.coordination.membership import Membership
from halfmoon.cluster.coordination.registration import register_member
from halfmoon.cluster.errors import BadClusterName, CoordinatorUnavailable, MemberNameTaken
from halfmoon.process_start import process_started_ms
from tests.cluster.etcd_server import EtcdServer, free_port
from tests.cluster.member_process import TTL, Member
from tests.waiting import until, wait_until


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        member.close()


def entry(etcd: EtcdServer, cluster: str, name: str) -> dict | None:  # type: ignore[type-arg]
    async def read() -> dict | None:  # type: ignore[type-arg]
        async with EtcdClient.from_url(etcd.url) as client:
            kv = await client.get(ClusterKeys(cluster).broker(name))
            return None if kv is None else {**kv.json(), "lease": kv.lease}

    return asyncio.run(read())


def test_a_killed_member_disappears_when_its_lease_expires(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))
    registered = entry(etcd, cluster_name, "b1")
    assert registered is not None and registered["endpoint"] == "127.0.0.1:1001"
    members[0].kill()
    assert entry(etcd, cluster_name, "b1") is not None, (
        "the entry outlives the process until its TTL"
    )
    wait_until(
        lambda: entry(etcd, cluster_name, "b1") is None, TTL + 5, "b1's lease to expire", 0.1
    )


def test_a_clean_stop_deregisters_at_once(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    async def long_lived() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            member = Membership(client, cluster_name, "proxy", "p1", "127.0.0.1:2", ttl_s=60)
            await member.start()
            assert await client.get(member.key) is not None
            started = time.monotonic()
            await member.stop()
            assert await client.get(member.key) is None
            assert time.monotonic() - started < 2, "deregistration must not wait for the TTL"

    asyncio.run(long_lived())
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))
    assert members[0].terminate() == "deregistered"
    assert entry(etcd, cluster_name, "b1") is None


def test_a_restarted_member_takes_its_entry_over_cleanly(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))
    first = entry(etcd, cluster_name, "b1")
    assert first is not None
    members[0].kill()
    # Restarted before the old lease expired: registers at once, under a new lease.
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))
    second = entry(etcd, cluster_name, "b1")
    assert second is not None and second["instance"] != first["instance"]
    assert second["lease"] != first["lease"]

    async def old_lease_ttl() -> int:
        async with EtcdClient.from_url(etcd.url) as client:
            return await client.keep_alive(first["lease"])

    assert asyncio.run(old_lease_ttl()) == 0, (
        "the predecessor's lease is revoked, not left to expire"
    )
    time.sleep(TTL + 1)  # past the old lease's TTL: the new entry must still be there
    third = entry(etcd, cluster_name, "b1")
    assert third is not None and third["instance"] == second["instance"]


def test_a_second_process_cannot_take_a_live_members_name(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))

    async def impostor() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            member = Membership(client, cluster_name, "broker", "b1", "127.0.0.1:9999", ttl_s=TTL)
            with pytest.raises(MemberNameTaken) as caught:
                await member.start()
            assert caught.value.code == "MEMBER_NAME_TAKEN"

    asyncio.run(impostor())
    assert entry(etcd, cluster_name, "b1")["endpoint"] == "127.0.0.1:1001"  # type: ignore[index]


def test_a_predecessor_lease_expiring_during_registration_is_not_a_name_clash(
    etcd: EtcdServer, cluster_name: str
) -> None:
    """The restarted member reads its crashed predecessor's key, then that lease expires
    before the member writes: the key moved, but nobody else holds the name."""

    class ExpiringBetweenReadAndWrite(EtcdClient):
        expired = False

        async def get(self, key: str):  # type: ignore[no-untyped-def]
            kv = await super().get(key)
            if kv is not None and kv.lease and not self.expired:
                self.expired = True
                await self.revoke_lease(kv.lease)  # what etcd does when the TTL runs out
            return kv

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            crashed = Membership(client, cluster_name, "broker", "b1", "127.0.0.1:1", ttl_s=TTL)
            await crashed._register()  # registered, then "killed": never renewed nor revoked
        async with ExpiringBetweenReadAndWrite.from_url(etcd.url) as client:
            restarted = Membership(client, cluster_name, "broker", "b1", "127.0.0.1:1", ttl_s=TTL)
            await restarted.start()
            assert client.expired
            assert restarted.registered
            await restarted.stop()

    asyncio.run(scenario())


def test_a_member_whose_lease_was_lost_registers_again(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            member = Membership(client, cluster_name, "broker", "b1", "127.0.0.1:1", ttl_s=TTL)
            await member.start()
            lost = member.lease
            await client.revoke_lease(lost)  # as if etcd had expired it while we were away
            assert await client.get(member.key) is None
            kv = await until(lambda: client.get(member.key), 5, "the member to register again")
            assert kv.lease == member.lease != lost
            assert json.loads(kv.value)["instance"] == member.instance
            await member.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("name", ["", "a/b", "../x", "-lead", "x" * 65, "sp ace"])
def test_bad_member_names_are_refused(name: str) -> None:
    with pytest.raises(BadClusterName):
        Membership(None, "c", "broker", name, "127.0.0.1:1")  # type: ignore[arg-type]


def test_a_synchronous_process_registers_in_the_background(
    etcd: EtcdServer, cluster_name: str
) -> None:
    deregister = register_member(
        etcd.url,
        cluster_name,
        "broker",
        "b1",
        "127.0.0.1:7",
        {"data_dir": "/d"},
        ttl_s=TTL,
        tls=PLAIN,
    )
    try:
        # Past several TTLs with this thread asleep: the lease is renewed in the background.
        time.sleep(TTL * 2)
        registered = entry(etcd, cluster_name, "b1")
        assert registered is not None and registered["data_dir"] == "/d"
    finally:
        deregister()
    assert entry(etcd, cluster_name, "b1") is None
    deregister()  # a second call does nothing
    threads = [t.name for t in threading.enumerate()]
    assert not any(n.startswith("halfmoon-membership-") for n in threads)


def test_a_failed_background_registration_raises_and_leaves_no_thread(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))
    with pytest.raises(MemberNameTaken):
        register_member(etcd.url, cluster_name, "broker", "b1", "127.0.0.1:9", ttl_s=TTL, tls=PLAIN)
    with pytest.raises(CoordinatorUnavailable):
        register_member(
            f"etcd://127.0.0.1:{free_port()}", cluster_name, "broker", "b2", "x:1", tls=PLAIN
        )
    threads = [t.name for t in threading.enumerate()]
    assert not any(n.startswith("halfmoon-membership-") for n in threads)


def test_membership_survives_an_etcd_crash_longer_than_its_ttl(
    own_etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(own_etcd.url, timeout=1) as client:
            member = Membership(client, cluster_name, "broker", "b1", "127.0.0.1:1", ttl_s=TTL)
            await member.start()
            own_etcd.kill()
            await until(lambda: not member.registered, 10, "a failed renewal to clear it")
            await asyncio.sleep(TTL + 1)  # down for longer than the lease's TTL
            await asyncio.to_thread(own_etcd.restart)
            await until(lambda: member.registered, 10, "the member to come back after etcd")
            kv = await until(lambda: client.get(member.key), 10, "the member's entry")
            assert json.loads(kv.value)["instance"] == member.instance
            await member.stop()
            assert await client.get(member.key) is None

    asyncio.run(scenario())


def test_changing_facts_are_republished_under_the_same_lease(
    etcd: EtcdServer, cluster_name: str
) -> None:
    reads = iter(range(1, 1000))

    def facts() -> dict[str, int]:
        count = next(reads)
        if count == 2:
            raise OSError("disk gone for a moment")  # logged; the last facts stay
        return {"reads": count}

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            member = Membership(
                client, cluster_name, "broker", "b1", "127.0.0.1:1", ttl_s=TTL,
                facts_source=facts, facts_every_s=0.1,
            )  # fmt: skip
            await member.start()
            first = await client.get(member.key)
            assert first is not None and json.loads(first.value)["reads"] == 1

            async def published_reads() -> int:
                kv = await client.get(member.key)
                assert kv is not None and kv.lease == first.lease  # same lease, same entry
                return int(json.loads(kv.value)["reads"])

            async def republished() -> bool:
                return await published_reads() >= 3

            await until(republished, 10, "the facts to be republished")
            # Rewritten, but the process started when it did: UPTIME counts from that.
            last = await client.get(member.key)
            assert last is not None
            assert (
                json.loads(last.value)["registered_ms"] > json.loads(first.value)["registered_ms"]
            )
            assert json.loads(last.value)["started_ms"] == process_started_ms()
            assert process_started_ms() <= json.loads(first.value)["registered_ms"]
            await member.stop()

    asyncio.run(scenario())
