"""One transaction spanning two transaction topics, consumed by two push consumers.

Guards the reported "t1 messages never arrive" case: every committed message
must reach exactly the group subscribed to its topic, once, labelled with its
own topic and without half-message bookkeeping properties.
"""

from __future__ import annotations

from halfmoon.client import (
    ConsumeResult,
    Message,
    MessageSelector,
    MessageView,
    PushConsumer,
    TransactionProducer,
)
from tests.client.conftest import run, unique
from tests.server.conftest import ServerProcess
from tests.waiting import until

ROUNDS = 30


def test_one_transaction_across_two_topics_reaches_each_group_once(server: ServerProcess) -> None:
    topic_a, topic_b = unique("txa"), unique("txb")
    group_a, group_b = unique("txa-g"), unique("txb-g")
    for topic in (topic_a, topic_b):
        server.create_topic(topic, message_type="transaction")
    server.create_group(group_a)
    server.create_group(group_b)

    deliveries: list[MessageView] = []

    def shared_listener(message: MessageView) -> ConsumeResult:
        deliveries.append(message)
        return ConsumeResult.SUCCESS

    async def scenario() -> None:
        async with (
            TransactionProducer(server.grpc, unique("pg"), topics=[topic_a, topic_b]) as producer,
            PushConsumer(server.grpc, group_a, {topic_a: MessageSelector.all()}, shared_listener),
            PushConsumer(server.grpc, group_b, {topic_b: MessageSelector.all()}, shared_listener),
        ):
            for i in range(ROUNDS):
                txn = producer.begin()
                await txn.send(Message(topic_a, b"a%d" % i))
                await txn.send(Message(topic_b, b"b%d" % i))
                await txn.commit()
            await until(lambda: len(deliveries) >= 2 * ROUNDS, 30, f"{2 * ROUNDS} deliveries")

    run(scenario())

    expected = {(topic_a, b"a%d" % i) for i in range(ROUNDS)} | {
        (topic_b, b"b%d" % i) for i in range(ROUNDS)
    }
    delivered = [(m.topic, m.body) for m in deliveries]
    assert sorted(delivered) == sorted(expected), (
        "each committed message exactly once, under its own topic"
    )
    assert len({m.message_id for m in deliveries}) == 2 * ROUNDS
    for message in deliveries:
        assert message.message_type == "TRANSACTION"
        assert not any(
            key.startswith(("REAL_", "TRAN_", "__halfmoon")) for key in message.properties
        ), message.properties
