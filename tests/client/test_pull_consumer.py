"""PullConsumer against a real server: poll/seek/commit, and group rebalancing as members come and
go."""

from __future__ import annotations

import pytest

from halfmoon.client import Message, Producer
from halfmoon.client.allocation import allocate_average, allocate_consistent_hash
from halfmoon.client.membership import MEMBERS_TOPIC
from halfmoon.client.pull_consumer import PullConsumer
from halfmoon.client.selector import MessageSelector
from tests.client.conftest import ServerProcess, eventually, run, unique


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
            await eventually(
                lambda: _partitioned(consumers, 6), 10, "one member owning all six queues"
            )
            for _ in range(2):
                joiner = PullConsumer(
                    server.grpc, group, subs, consume_from="earliest", membership_interval=0.3
                )
                await joiner.start()
                consumers.append(joiner)
                await eventually(
                    lambda: _partitioned(consumers, 6),
                    10,
                    f"{len(consumers)} members sharing six queues",
                )
            assert all(len(share) == 2 for share in _owned(consumers))
            leaver = consumers.pop(1)
            await leaver.close()
            await eventually(
                lambda: _partitioned(consumers, 6), 10, "two members covering the leaver's queues"
            )
            assert sorted(len(share) for share in _owned(consumers)) == [3, 3]
        finally:
            for consumer in consumers:
                await consumer.close()

    run(scenario(), timeout=60)
