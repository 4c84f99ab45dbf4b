"""A real cluster (etcd, two brokers, two proxies) routing by etcd placement, and its failures.

Each failure is a SIGKILL of a real process: a proxy, a broker, etcd. The
official RocketMQ Python client is the client throughout, given both proxies'
endpoints.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.coordination.placement import ClusterTopic
from tests.cluster.cluster_server import ClusterProxy, ClusterServer, wait_until
from tests.server.conftest import ROOT, unique


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    """A cluster of the test's own, for tests that kill its parts."""
    server = ClusterServer(tmp_path / "cluster", broker_lease_ttl=2).start()  # leases expire
    try:
        yield server
    finally:
        server.kill()


def config(server: ClusterServer) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials(), request_timeout=5)


def message(topic: str, body: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    return msg


def route(server: ClusterServer, proxy: int, topic: str) -> tuple[int, object]:
    return server.proxies[proxy].admin_call("GET", f"/v1/topics/{topic}/route")


def receive_bodies(consumer: SimpleConsumer, count: int, timeout: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.receive(32, 15):
            got.append(msg.body.decode())
            consumer.ack(msg)
    return got


def cli(server: ClusterServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def broker_state(server: ClusterServer, name: str) -> str | None:
    """A broker's state in ``cluster list`` (live, gone, ...), None when not listed."""
    listing = cli(server, "cluster", "list", "--coordinator", server.own_etcd.url,
                  "--cluster", server.cluster, "--json").stdout  # fmt: skip
    states = {b["name"]: b["state"] for b in json.loads(listing)["brokers"]}
    return states.get(name)


def started(client: Producer | SimpleConsumer) -> Producer | SimpleConsumer:
    client.startup()
    return client


# -- routing -----------------------------------------------------------------------------------


def test_topic_created_through_one_proxy_is_routable_through_the_other_within_a_second(
    cluster: ClusterServer,
) -> None:
    topic = unique("spread")
    cluster.create_topic(topic, "normal", queues=4)
    created = time.monotonic()
    placed = [q.broker for q in sorted(placement(cluster, topic).queues, key=lambda q: q.queue_id)]
    # Spread over both brokers, two queues each, alternating (round-robin). A proxy that has
    # not seen etcd's record yet lays the topic out from the brokers instead, in broker order
    # (a, a, b, b): routing as etcd placed it is routing from the watched record.
    assert sorted(placed) == ["broker-a", "broker-a", "broker-b", "broker-b"], placed
    assert placed[0] != placed[1], placed

    def routed_as_placed() -> bool:
        status, body = route(cluster, 1, topic)
        return status == 200 and [q["broker"] for q in body["queues"]] == placed  # type: ignore[index]

    wait_until(routed_as_placed, 1.0, "the other proxy routing the topic as etcd placed it")
    assert time.monotonic() - created < 1.0
    _, body = route(cluster, 1, topic)
    assert [q["queue_id"] for q in body["queues"]] == [0, 1, 2, 3]  # type: ignore[index]


def test_pinned_topic_lives_on_the_named_broker_only(cluster: ClusterServer) -> None:
    topic = unique("pinned")
    done = cli(cluster, "topic", "create", topic, "--queues", "3", "--brokers", "broker-b",
               "--admin", cluster.proxies[1].admin)  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, body = route(cluster, 0, topic)
    assert {q["broker"] for q in body["queues"]} == {"broker-b"}  # type: ignore[index]
    unknown = cli(cluster, "topic", "create", unique("nowhere"), "--brokers", "broker-z",
                  "--admin", cluster.admin)  # fmt: skip
    assert unknown.returncode != 0 and "NO_LIVE_BROKERS" in unknown.stderr, unknown.stderr


def test_messages_spread_over_both_brokers_and_acks_find_their_broker(
    cluster: ClusterServer,
) -> None:
    topic, group = unique("both"), unique("both-g")
    cluster.create_topic(topic, "normal", queues=4)
    cluster.create_group(group)
    producer = started(Producer(config(cluster)))
    consumer = started(
        SimpleConsumer(config(cluster), group, {topic: FilterExpression()}, await_duration=2)
    )
    try:
        sent = {f"m{i}" for i in range(40)}
        for body in sorted(sent):
            producer.send(message(topic, body))
        assert set(receive_bodies(consumer, 40, 30)) == sent
    finally:
        producer.shutdown()
        consumer.shutdown()
    _, progress = cluster.proxies[1].admin_call("GET", f"/v1/groups/{group}/progress")
    rows = [q for q in progress["queues"] if q["topic"] == topic]  # type: ignore[index]
    # Both brokers got messages, and every one of them was acknowledged. (Not necessarily
    # every queue: on a busy machine a send that misses its deadline makes the client try
    # another queue, and a proxy steers sends away from a broker found slow for a moment.)
    shown = ", ".join(f"q{q['queue_id']}={q['committed_offset']}/{q['max_offset']}" for q in rows)
    assert sorted(q["queue_id"] for q in rows) == [0, 1, 2, 3], shown
    assert all(q["lag"] == 0 for q in rows), shown
    assert sum(q["max_offset"] for q in rows) == 40, shown
    code, route = cluster.admin_call("GET", f"/v1/topics/{topic}/route")
    assert code == 200, route
    owner = {q["queue_id"]: q["broker"] for q in route["queues"]}  # type: ignore[index]
    assert {owner[q["queue_id"]] for q in rows if q["max_offset"] > 0} == set(owner.values()), (
        shown,
        owner,
    )


def test_clone_offset_copies_each_queues_offset_on_every_broker(cluster: ClusterServer) -> None:
    topic, source, target = unique("clone"), unique("clone-src"), unique("clone-dst")
    cluster.create_topic(topic, "normal", queues=4)
    cluster.create_group(source)
    cluster.create_group(target)
    producer = started(Producer(config(cluster)))
    consumer = started(
        SimpleConsumer(config(cluster), source, {topic: FilterExpression()}, await_duration=2)
    )
    try:
        for i in range(16):
            producer.send(message(topic, f"m{i}"))
        assert len(receive_bodies(consumer, 16, 30)) == 16
    finally:
        producer.shutdown()
        consumer.shutdown()

    def committed(group: str) -> dict[int, int]:
        _, body = cluster.admin_call("GET", f"/v1/groups/{group}/progress?topic={topic}")
        return {q["queue_id"]: q["committed_offset"] for q in body["queues"]}  # type: ignore[index]

    wait_until(lambda: sum(committed(source).values()) == 16, 10, "the source's acks committed")
    done = cli(cluster, "consumer", "clone-offset", source, "--to", target, "--topic", topic,
               "--json", "--admin", cluster.proxies[1].admin)  # fmt: skip
    assert done.returncode == 0, done.stderr
    cloned = committed(target)
    assert cloned == committed(source), cloned
    _, body = route(cluster, 0, topic)
    owners = {q["queue_id"]: q["broker"] for q in body["queues"]}  # type: ignore[index]
    # Queues of both brokers carried offsets over.
    assert {owners[q] for q, offset in cloned.items() if offset > 0} == {"broker-a", "broker-b"}


def test_a_proxy_with_two_workers_serves_from_both_on_one_port(
    cluster: ClusterServer, tmp_path: Path
) -> None:
    proxy = ClusterProxy(
        tmp_path / "workers", cluster.own_etcd, cluster.cluster, workers=2,
        settings=cluster.settings,
    ).start()  # fmt: skip
    try:
        # Both workers come up on the same port (SO_REUSEPORT); the parent registers once.
        wait_until(lambda: sum("halfmoon ready" in line for line in proxy.lines) == 2, 30,
                   "both workers ready")  # fmt: skip
        assert proxy.proc is not None
        workers = _children(proxy.proc.pid)
        assert len(workers) == 2, workers
        listed = json.loads(
            cli(cluster, "cluster", "list", "--json", "--admin", proxy.admin).stdout
        )
        assert [p["endpoint"] for p in listed["proxies"]].count(proxy.address) == 1
        topic, group = unique("workers"), unique("workers-g")
        proxy.create_topic(topic, "normal", queues=4)
        proxy.create_group(group)
        endpoints = ClientConfiguration(proxy.address, Credentials(), request_timeout=5)
        producers = [started(Producer(endpoints)) for _ in range(4)]  # several connections
        try:
            for i, producer in enumerate(producers):
                for j in range(5):
                    producer.send(message(topic, f"p{i}-{j}"))
        finally:
            for producer in producers:
                producer.shutdown()
        consumer = started(
            SimpleConsumer(endpoints, group, {topic: FilterExpression()}, await_duration=2)
        )
        try:
            assert len(set(receive_bodies(consumer, 20, 30))) == 20
        finally:
            consumer.shutdown()
    finally:
        assert proxy.stop() == 0, proxy.log_tail()
    assert all(not Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived its parent"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


# -- admin through any proxy -------------------------------------------------------------------


def test_cluster_list_through_a_proxy_shows_every_broker_and_proxy(cluster: ClusterServer) -> None:
    done = cli(cluster, "cluster", "list", "--json", "--admin", cluster.proxies[1].admin)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert sorted(b["name"] for b in answer["brokers"]) == ["broker-a", "broker-b"]
    assert sorted(p["endpoint"] for p in answer["proxies"]) == sorted(
        p.address for p in cluster.proxies
    )
    assert all(b["state"] == "live" for b in answer["brokers"]), answer


def test_status_addresses_one_member_broker_through_a_proxy(cluster: ClusterServer) -> None:
    for name in ("broker-a", "broker-b"):
        done = cli(cluster, "status", "--broker", name, "--json", "--admin", cluster.admin)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["name"] == name
    missing = cli(cluster, "status", "--broker", "broker-z", "--admin", cluster.admin)
    assert missing.returncode != 0 and "BROKER_UNAVAILABLE" in missing.stderr, missing.stderr


def test_wiping_write_perm_drains_one_broker_while_the_other_takes_the_sends(
    cluster: ClusterServer,
) -> None:
    topic, group = unique("drain"), unique("drain-g")
    cluster.create_topic(topic, "normal", queues=4)
    cluster.create_group(group)
    wipe = cli(cluster, "cluster", "write-perm", "--wipe", "--broker", "broker-a",
               "--admin", cluster.proxies[1].admin)  # fmt: skip
    assert wipe.returncode == 0, wipe.stderr
    try:

        def perms() -> dict[str, str]:
            return {q["broker"]: q["perm"] for q in route(cluster, 0, topic)[1]["queues"]}  # type: ignore[index]

        # Every proxy asks each broker's writability four times a second: the other proxy
        # routes the drained broker's queues read-only within a moment.
        wait_until(lambda: perms() == {"broker-a": "r", "broker-b": "rw"}, 5, "the drain routed")
        producer = started(Producer(config(cluster)))
        try:
            for i in range(12):
                producer.send(message(topic, f"m{i}"))
        finally:
            producer.shutdown()
    finally:
        add = cli(cluster, "cluster", "write-perm", "--add", "--broker", "broker-a",
                  "--admin", cluster.admin)  # fmt: skip
        assert add.returncode == 0, add.stderr
    _, body = cluster.admin_call("GET", f"/v1/topics/{topic}/status")
    owners = {q["queue_id"]: q["broker"] for q in route(cluster, 0, topic)[1]["queues"]}  # type: ignore[index]
    stored = {owners[q["queue_id"]]: 0 for q in body["queues"]}  # type: ignore[index]
    for q in body["queues"]:  # type: ignore[index]
        stored[owners[q["queue_id"]]] += q["max_offset"]
    assert stored == {"broker-a": 0, "broker-b": 12}, body


def placement(server: ClusterServer, topic: str) -> ClusterTopic:
    """``topic``'s record in etcd."""

    async def main() -> ClusterTopic:
        async with EtcdClient.from_url(server.own_etcd.url) as client:
            found = await ClusterMetadata(client, server.cluster).get_topic(topic)
            assert found is not None, topic
            return found

    return asyncio.run(main())


def forget_in_etcd(server: ClusterServer, topic: str) -> None:
    """Delete ``topic``'s record from etcd only: its brokers still hold it, nothing routes it."""

    async def main() -> None:
        async with EtcdClient.from_url(server.own_etcd.url) as client:
            assert await ClusterMetadata(client, server.cluster).delete_topic(topic)

    asyncio.run(main())


def test_clean_unused_deletes_the_topics_brokers_hold_that_etcd_does_not_route(
    cluster: ClusterServer,
) -> None:
    kept, orphan = unique("kept"), unique("orphan")
    cluster.create_topic(kept, "normal", queues=4)
    cluster.create_topic(orphan, "normal", queues=4)
    forget_in_etcd(cluster, orphan)
    expected = [{"broker": "broker-a", "topic": orphan}, {"broker": "broker-b", "topic": orphan}]

    dry = cli(cluster, "topic", "clean-unused", "--dry-run", "--json", "--admin", cluster.admin)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"deleted": False, "topics": expected}
    _, listing = cluster.admin_call("GET", "/v1/topics")
    assert orphan in {t["name"] for t in listing["topics"]}  # type: ignore[index]  # kept by dry run

    done = cli(cluster, "topic", "clean-unused", "--json", "--admin", cluster.proxies[1].admin)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"deleted": True, "topics": expected}
    _, listing = cluster.admin_call("GET", "/v1/topics")
    names = {t["name"] for t in listing["topics"]}  # type: ignore[index]
    assert orphan not in names and kept in names
    again = cli(cluster, "topic", "clean-unused", "--admin", cluster.admin)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "no broker holds a topic etcd does not route"
    # The routed topic and the brokers' own topics are untouched.
    status, body = route(cluster, 1, kept)
    assert status == 200 and {q["broker"] for q in body["queues"]} == {"broker-a", "broker-b"}  # type: ignore[index]


# -- failures ----------------------------------------------------------------------------------


def test_a_killed_proxy_leaves_clients_carrying_on_through_the_other(
    own_cluster: ClusterServer,
) -> None:
    topic, group = unique("proxy-kill"), unique("proxy-kill-g")
    own_cluster.create_topic(topic, "normal", queues=4)
    own_cluster.create_group(group)
    producer = started(Producer(config(own_cluster)))
    try:
        for i in range(10):
            producer.send(message(topic, f"before-{i}"))
        own_cluster.kill_proxy(0)  # SIGKILL
        for i in range(10):
            producer.send(message(topic, f"after-{i}"))
    finally:
        producer.shutdown()
    consumer = started(
        SimpleConsumer(config(own_cluster), group, {topic: FilterExpression()}, await_duration=2)
    )
    try:
        got = receive_bodies(consumer, 20, 30)
    finally:
        consumer.shutdown()
    assert sorted(got) == sorted(
        [f"before-{i}" for i in range(10)] + [f"after-{i}" for i in range(10)]
    )


def test_a_killed_broker_stops_only_its_queues_and_loses_nothing_acknowledged(
    own_cluster: ClusterServer,
) -> None:
    topic, group = unique("broker-kill"), unique("broker-kill-g")
    own_cluster.create_topic(topic, "normal", queues=4)
    own_cluster.create_group(group)
    producer = started(Producer(config(own_cluster)))
    acknowledged: list[str] = []
    try:
        for i in range(20):
            producer.send(message(topic, f"before-{i}"))
            acknowledged.append(f"before-{i}")
        own_cluster.brokers[0].kill()  # SIGKILL broker-a
        # Once its lease is gone the proxies stop routing to it; sends go to broker-b.
        # (It stays listed, as gone: it owns queues.)
        wait_until(
            lambda: broker_state(own_cluster, "broker-a") != "live", 15,
            "broker-a's lease to expire",
        )  # fmt: skip
        for i in range(20):
            producer.send(message(topic, f"during-{i}"))
            acknowledged.append(f"during-{i}")
    finally:
        producer.shutdown()
    consumer = started(
        SimpleConsumer(config(own_cluster), group, {topic: FilterExpression()}, await_duration=2)
    )
    try:
        # broker-b keeps serving its queues while broker-a is down.
        during = receive_bodies(consumer, 20 + 10, 15)
        assert {b for b in during if b.startswith("during-")} == {f"during-{i}" for i in range(20)}
        own_cluster.restart_broker(0)
        rest = receive_bodies(consumer, len(acknowledged) - len(during), 30)
    finally:
        consumer.shutdown()
    assert sorted(during + rest) == sorted(acknowledged)


def test_a_broker_killed_before_its_lease_expires_is_avoided_at_once(tmp_path: Path) -> None:
    """A SIGKILLed broker still listed in etcd (a long lease): connections to it are refused,
    so the proxies fail its calls fast (a code the client retries), send elsewhere and read
    from the other broker, without waiting out a call's deadline or the lease."""
    cluster = ClusterServer(tmp_path / "cluster", broker_lease_ttl=60).start()
    topic, group, fifo = unique("fast-fail"), unique("fast-fail-g"), unique("fast-fail-fifo")
    try:
        cluster.create_topic(topic, "normal", queues=4)
        cluster.create_topic(fifo, "fifo", queues=4)
        cluster.create_group(group)
        _, routed = route(cluster, 0, fifo)
        on_a = [q["queue_id"] for q in routed["queues"] if q["broker"] == "broker-a"]
        producer = started(Producer(config(cluster)))
        acknowledged: list[str] = []
        try:
            for i in range(10):
                producer.send(message(topic, f"before-{i}"))
                acknowledged.append(f"before-{i}")
            cluster.brokers[0].kill()  # SIGKILL broker-a; its lease lives on for a minute
            killed = time.monotonic()
            for i in range(20):
                started_at = time.monotonic()
                producer.send(message(topic, f"during-{i}"))
                acknowledged.append(f"during-{i}")
                assert time.monotonic() - started_at < 3, f"send {i} waited for the dead broker"
            # A message group whose queue is on broker-a cannot move: refused quickly.
            pinned = message(fifo, "pinned")
            pinned.message_group = next(
                g for g in (f"g{n}" for n in range(1000)) if zlib.crc32(g.encode()) % 4 in on_a
            )
            refused_at = time.monotonic()
            with pytest.raises(Exception):  # noqa: B017 - the client's exception, any class
                producer.send(pinned)
            assert time.monotonic() - refused_at < 5
        finally:
            producer.shutdown()
        consumer = started(
            SimpleConsumer(config(cluster), group, {topic: FilterExpression()}, await_duration=2)
        )
        try:
            during = receive_bodies(consumer, 20, 10)
        finally:
            consumer.shutdown()
        assert {b for b in during if b.startswith("during-")} == {f"during-{i}" for i in range(20)}
        assert time.monotonic() - killed < 30
        assert broker_state(cluster, "broker-a") == "live"  # all while its lease lived on
        cluster.restart_broker(0)
        consumer = started(
            SimpleConsumer(config(cluster), group, {topic: FilterExpression()}, await_duration=2)
        )
        try:
            rest = receive_bodies(consumer, len(acknowledged) - len(during), 30)
        finally:
            consumer.shutdown()
        assert sorted(during + rest) == sorted(acknowledged)
    finally:
        cluster.kill()


def test_proxies_and_brokers_serve_through_an_etcd_restart_and_resync(
    own_cluster: ClusterServer,
) -> None:
    topic, group = unique("etcd-kill"), unique("etcd-kill-g")
    own_cluster.create_topic(topic, "normal", queues=4)
    own_cluster.create_group(group)
    producer = started(Producer(config(own_cluster)))
    consumer = started(
        SimpleConsumer(config(own_cluster), group, {topic: FilterExpression()}, await_duration=2)
    )
    try:
        own_cluster.own_etcd.kill()  # SIGKILL
        for i in range(20):
            producer.send(message(topic, f"m{i}"))
        assert sorted(receive_bodies(consumer, 20, 30)) == sorted(f"m{i}" for i in range(20))
        own_cluster.own_etcd.restart()
        # Resynced: a topic created through one proxy is routable through the other.
        later = unique("after-etcd")
        wait_until(
            lambda: own_cluster.admin_call(
                "POST", "/v1/topics", {"name": later, "queue_count": 2}
            )[0] in (201, 409),
            20, "a topic created after etcd came back",
        )  # fmt: skip
        wait_until(lambda: route(own_cluster, 1, later)[0] == 200, 5, "its route on proxy 2")
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_a_cluster_proxy_refuses_an_open_listener_without_auth_and_auth_without_its_key() -> None:
    base = ("proxy", "--cluster", "c", "--coordinator", "etcd://127.0.0.1:1",
            "--admin-listen", "127.0.0.1:0")  # fmt: skip
    exposed = subprocess.run(
        [sys.executable, "-m", "halfmoon", *base, "--listen", "0.0.0.0:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert exposed.returncode != 0 and "INSECURE_LISTEN" in exposed.stderr, exposed.stderr
    with_auth = subprocess.run(
        [sys.executable, "-m", "halfmoon", *base, "--listen", "127.0.0.1:0",
         "--set", "auth.enabled=true"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    # Authentication on a cluster proxy needs the key that seals the secrets kept in etcd.
    assert with_auth.returncode != 0 and "ILLEGAL_CONFIG" in with_auth.stderr, with_auth.stderr
    assert "auth.key_file" in with_auth.stderr, with_auth.stderr
