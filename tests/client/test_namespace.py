"""halfmoon's own client with a namespace: same names, separate tenants (as the official
clients)."""

from __future__ import annotations

from halfmoon.client import Message, MessageSelector, Producer, SimpleConsumer
from tests.client.conftest import ServerProcess, run, unique


def test_clients_in_different_namespaces_do_not_share_topics(server: ServerProcess) -> None:
    topic, group = unique("ns-orders"), unique("ns-g")
    for namespace in ("red", "blue"):
        server.create_topic(f"{namespace}%{topic}")
        server.create_group(f"{namespace}%{group}")

    async def scenario() -> None:
        async with (
            Producer(server.grpc, namespace="red") as red,
            Producer(server.grpc, namespace="blue") as blue,
            SimpleConsumer(
                server.grpc, group, {topic: MessageSelector.by_tag("*")}, namespace="blue"
            ) as consumer,
        ):
            await red.send(Message(topic, b"red"))
            await blue.send(Message(topic, b"blue"))
            got = await consumer.receive(10, 20, wait=3)
            assert [m.body for m in got] == [b"blue"]
            assert got[0].topic == topic
            await consumer.ack(got[0])
            assert await consumer.receive(10, 20, wait=0.5) == []

    run(scenario())
