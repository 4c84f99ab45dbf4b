"""PullConsumer against a real server: poll/seek/commit, and group rebalancing as members come and
go. Each scenario runs against ``halfmoon serve`` and against a cluster (etcd, two brokers, two
proxies): queues, offsets and commits address (broker, queue, offset) there."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from halfmoon.client import Message, Producer
from halfmoon.client.allocation import allocate_average, allocate_consistent_hash
from halfmoon.client.membership import MEMBERS_TOPIC
from halfmoon.client.pull_consumer import PullConsumer
from halfmoon.client.selector import MessageSelector
from tests.client.conftest import ServerProcess, run, unique
from tests.cluster.cluster_server import ClusterServer
from tests.waiting import until


@pytest.fixture(scope="module", params=["local", "cluster"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    kind = {"local": ServerProcess, "cluster": ClusterServer}[request.param]
    proc = kind(tmp_path_factory.mktemp(f"halfmoon-pull-{request.param}")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.mark.parametrize("strategy", [allocate_average, allocate_consistent_hash])
def test_allocation_covers_every_queue_exactly_once(strategy) -> None:
    queues = [f"t/b@{i}" for i in range(8)]
    for n in range(1, 6):
        members = [f"m{i}" for i in range(n)]
        shares = [strategy(queues, members, m) for m in members]
        flat = [q for share in shares for q in share]
        assert sorted(flat) == sorted(queues)


def test_consistent_hash_moves_few_queues_when_a_member_joins() -> None:
    queues = [f"t/b@{i}" for i in range(64)]
    before = {
        q: m for m in ("a", "b", "c") for q in allocate_consistent_hash(queues, ["a", "b", "c"], m)
    }
    after = {
        q: m
        for m in ("a", "b", "c", "d")
        for q in allocate_consistent_hash(queues, ["a", "b", "c", "d"], m)
    }
    moved = [q for q in queues if before[q] != after[q]]
    assert all(after[q] == "d" for q in moved) and len(moved) < 32


def test_poll_seek_commit(server: ServerProcess) -> None:
    topic, group = unique("pull"), unique("pull-g")
    server.create_topic(topic, queues=1)
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc) as producer,
            PullConsumer(
                server.grpc, group, consume_from="earliest", auto_commit=False
            ) as consumer,
        ):
            for i in range(10):
                await producer.send(Message(topic, f"m{i}".encode()))
            [queue] = await consumer.fetch_queues(topic)
            await consumer.assign([queue])
            got = []
            while len(got) < 10:
                got.extend(await consumer.poll(2.0))
            assert [m.body for m in got] == [f"m{i}".encode() for i in range(10)]
            assert consumer.position(queue) == 10
            assert await consumer.committed(queue) is None
            await consumer.commit()
            assert await consumer.committed(queue) == 10
            await consumer.seek(queue, 3)
            again = await consumer.poll(2.0)
            assert again[0].body == b"m3"
            await consumer.seek_to_end(queue)
            assert await consumer.poll(0.2) == []

    run(scenario())


def _owned(consumers: list[PullConsumer]) -> list[list[str]]:
    return [sorted(f"{q.topic}/{q.key}" for q in c.assignment()) for c in consumers]


def _partitioned(consumers: list[PullConsumer], total: int) -> bool:
    owned = _owned(consumers)
    flat = [q for share in owned for q in share]
    return len(flat) == total and len(set(flat)) == total and all(owned)


def _shared_evenly(consumers: list[PullConsumer], total: int) -> bool:
    """Partitioned, and as evenly as the average allocation shares: the state once every member
    has the same view (while views differ a partition can be uneven for a moment)."""
    sizes = sorted(len(share) for share in _owned(consumers))
    return _partitioned(consumers, total) and sizes[-1] - sizes[0] <= 1


def test_rebalance_when_members_join_and_leave(server: ServerProcess) -> None:
    topic, group = unique("rebal"), unique("rebal-g")
    server.create_topic(topic, queues=6)
    server.create_group(group)
    server.create_topic(MEMBERS_TOPIC, queues=1)  # one module server: created once here

    async def scenario() -> None:
        subs = {topic: MessageSelector.all()}
        first = PullConsumer(
            server.grpc, group, subs, consume_from="earliest", membership_interval=0.3
        )
        await first.start()
        consumers = [first]
        try:
            await until(lambda: _partitioned(consumers, 6), 10, "one member owning all six queues")
            for _ in range(2):
                joiner = PullConsumer(
                    server.grpc, group, subs, consume_from="earliest", membership_interval=0.3
                )
                await joiner.start()
                consumers.append(joiner)
                await until(
                    lambda: _shared_evenly(consumers, 6),
                    10,
                    f"{len(consumers)} members sharing six queues evenly",
                )
            assert all(len(share) == 2 for share in _owned(consumers))
            leaver = consumers.pop(1)
            await leaver.close()
            await until(
                lambda: _shared_evenly(consumers, 6), 10, "two members covering the leaver's queues"
            )
            assert sorted(len(share) for share in _owned(consumers)) == [3, 3]
        finally:
            for consumer in consumers:
                await consumer.close()

    run(scenario(), timeout=60)


# -- reading through halfmoon.v1.BulkRead ------------------------------------------------------


def _bulk_reads(server: ServerProcess) -> float:
    """How many BulkRead calls the server answered with OK (its Prometheus counter)."""
    with urllib.request.urlopen(server.admin + "/metrics", timeout=10) as response:
        text = response.read().decode()
    counter = 'halfmoon_grpc_requests_total{method="BulkRead",code="OK"}'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(counter)
    )


def test_poll_reads_through_bulk_read_many_messages_per_call(server: ServerProcess) -> None:
    topic, group = unique("bulk-pull"), unique("bulk-pull-g")
    server.create_topic(topic, message_type="mixed", queues=1)
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc) as producer,
            PullConsumer(
                server.grpc, group, consume_from="earliest", auto_commit=False, batch_size=4096
            ) as consumer,
        ):
            for start in range(0, 3000, 500):
                await producer.send_batch(
                    [
                        Message(topic, b"%d" % i, tag="odd" if i % 2 else "even")
                        for i in range(start, start + 500)
                    ]
                )
            [queue] = await consumer.fetch_queues(topic)
            await consumer.assign([queue])
            calls_before = _bulk_reads(server)
            first = await consumer.poll(2.0)
            # One call, more than PullMessage's 1024 at a time.
            assert len(first) == 3000 and _bulk_reads(server) == calls_before + 1
            assert [m.queue_offset for m in first] == list(range(3000))
            assert first[5].body == b"5" and first[5].tag == "odd" and first[5].queue_id == 0
            assert first[5].message_type == "NORMAL" and first[5].delivery_attempt == 1
            assert consumer.position(queue) == 3000

            # An empty poll long-polls and wakes for the next message.
            waiting = asyncio.ensure_future(consumer.poll(10.0))
            await producer.send(Message(topic, b"late"))
            assert [m.body for m in await waiting] == [b"late"]

    run(scenario())


def test_a_subscription_filter_applies_to_bulk_reads(server: ServerProcess) -> None:
    topic, group = unique("bulk-sub"), unique("bulk-sub-g")
    server.create_topic(topic, queues=1)
    server.create_group(group)

    async def scenario() -> None:
        async with Producer(server.grpc) as producer:
            await producer.send_batch(
                [Message(topic, b"%d" % i, tag="odd" if i % 2 else "even") for i in range(40)]
            )
        async with PullConsumer(
            server.grpc,
            group,
            {topic: MessageSelector.by_tag("odd")},
            consume_from="earliest",
            auto_commit=False,
            membership_interval=0.2,
        ) as consumer:
            got = []
            while len(got) < 20:
                got.extend(await consumer.poll(2.0))
            assert [m.body for m in got] == [b"%d" % i for i in range(1, 40, 2)]

    run(scenario())


def test_without_bulk_read_on_the_server_poll_falls_back_to_pull_message() -> None:
    from halfmoon.broker.broker import Broker
    from halfmoon.config import ServerConfig
    from halfmoon.server.grpc_service import MessagingServicer
    from halfmoon.server.handlers import messaging_handler
    from halfmoon.server.longpoll import ArrivalNotifier
    from halfmoon.server.telemetry import ClientRegistry
    from halfmoon.store.memory import MemoryStore

    async def scenario() -> None:
        # A server with MessagingService only (as Apache RocketMQ, or an older halfmoon).
        store = MemoryStore()
        broker = Broker(store, None)
        broker.create_topic("old", queue_count=1)
        registry = ClientRegistry()
        registry.bind_loop(asyncio.get_running_loop())
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        broker.add_arrival_listener(notifier.on_arrival)
        grpc_server = grpc.aio.server()
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        servicer = MessagingServicer(
            broker, ServerConfig(), registry, notifier, advertised=("127.0.0.1", port)
        )
        grpc_server.add_generic_rpc_handlers((messaging_handler(servicer),))
        await grpc_server.start()
        endpoint = f"127.0.0.1:{port}"
        try:
            async with (
                Producer(endpoint) as producer,
                PullConsumer(endpoint, "old-g", consume_from="earliest", auto_commit=False) as c,
            ):
                await producer.send_batch([Message("old", b"%d" % i) for i in range(5)])
                [queue] = await c.fetch_queues("old")
                await c.assign([queue])
                got = []
                while len(got) < 5:
                    got.extend(await c.poll(2.0))
                assert [m.body for m in got] == [b"%d" % i for i in range(5)]
                assert c._no_bulk_read == {endpoint}
        finally:
            registry.close_all()
            await grpc_server.stop(0)
            broker.close()
            store.close()

    run(scenario())
