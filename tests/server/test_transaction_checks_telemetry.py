"""TelemetryCheckSender: which producer stream a transaction check goes to."""

from __future__ import annotations

import asyncio
import itertools
import time

from rocketmq.grpc_protocol import definition_pb2

from halfmoon.broker.message import MessageType, MessageView
from halfmoon.broker.transactions.check import CheckRequest
from halfmoon.server.check_sender import TelemetryCheckSender
from halfmoon.server.telemetry import ClientRegistry

PRODUCER = definition_pb2.ClientType.PRODUCER


def view(topic: str = "orders") -> MessageView:
    return MessageView(
        topic=topic,
        queue_id=0,
        queue_offset=0,
        message_id="m1",
        body=b"x",
        tag=None,
        keys=[],
        properties={},
        message_type=MessageType.TRANSACTION,
        message_group=None,
        delivery_timestamp=None,
        born_timestamp=0,
        born_host="",
        store_timestamp=0,
        store_host="",
        commit_log_offset=0,
    )


async def scenario(body) -> None:
    registry = ClientRegistry()
    registry.bind_loop(asyncio.get_running_loop())
    outboxes = {}
    for client_id, group in (("a", "pg"), ("b", "pg"), ("c", "other")):
        registry.touch(client_id, client_type=PRODUCER, group=group)
        _, outboxes[client_id] = registry.open_stream(client_id)
        registry.note_topic(client_id, "orders")
    sender = TelemetryCheckSender(registry, alive_within=30.0)
    ids = itertools.count(1)

    async def check(group: str | None, topic: str = "orders") -> bool:
        # A new transaction each time: a second check of one still outstanding is not sent.
        return await asyncio.to_thread(
            sender.send_check, group, topic, view(topic), f"T{next(ids)}"
        )

    await body(registry, outboxes, check)


def taken(outbox: asyncio.Queue) -> int:
    n = 0
    while not outbox.empty():
        command = outbox.get_nowait()
        assert command.recover_orphaned_transaction_command.transaction_id.startswith("T")
        assert (
            command.recover_orphaned_transaction_command.message.system_properties.message_id
            == "m1"
        )
        n += 1
    return n


def test_round_robin_over_the_producer_group_then_the_topic() -> None:
    async def body(registry, outboxes, check) -> None:
        for _ in range(4):
            assert await check("pg")
        assert (taken(outboxes["a"]), taken(outboxes["b"]), taken(outboxes["c"])) == (2, 2, 0)
        # No producer group named (the official clients): any producer of the topic.
        for _ in range(3):
            assert await check(None)
        assert taken(outboxes["a"]) + taken(outboxes["b"]) + taken(outboxes["c"]) == 3
        # A group with no live producer falls back to the topic's producers.
        assert await check("gone")

    asyncio.run(scenario(body))


def test_dead_streams_are_skipped_and_none_live_is_not_sent() -> None:
    async def body(registry, outboxes, check) -> None:
        registry.get("a").last_seen = time.monotonic() - 120  # silent for two minutes: gone
        registry.close_stream(registry.get("b"), outboxes["b"])  # stream ended
        for _ in range(3):
            assert await check("pg")  # falls back to c, the only live producer of the topic
        assert (taken(outboxes["a"]), taken(outboxes["b"]), taken(outboxes["c"])) == (0, 0, 3)
        registry.remove("c")
        assert not await check("pg")
        assert not await check(None, topic="unknown-topic")

    asyncio.run(scenario(body))


def test_a_batch_goes_in_one_hop_and_says_which_checks_were_taken() -> None:
    async def body(registry, outboxes, check) -> None:
        sender = TelemetryCheckSender(registry, alive_within=30.0)
        registry.remove("c")
        batch = [
            CheckRequest("pg", "orders", view("orders"), "T1"),
            CheckRequest(
                None, "unknown-topic", view("unknown-topic"), "T2"
            ),  # nobody publishes there
            CheckRequest("pg", "orders", view("orders"), "T3"),
            CheckRequest(None, "orders", view("orders"), "T4"),
        ]
        assert await asyncio.to_thread(sender.send_checks, batch) == [True, False, True, True]
        assert taken(outboxes["a"]) + taken(outboxes["b"]) == 3
        assert await asyncio.to_thread(sender.send_checks, []) == []

    asyncio.run(scenario(body))


def test_no_event_loop_means_nothing_was_taken() -> None:
    sender = TelemetryCheckSender(ClientRegistry())  # not serving: no loop bound
    assert sender.send_checks([CheckRequest("pg", "orders", view(), "T1")]) == [False]


def test_a_check_command_is_the_half_message_as_wire_message_builds_it() -> None:
    # check_command writes the wire message in place; what the producer reads is unchanged.
    from halfmoon.server.check_sender import check_command, recover_orphaned_transaction_command
    from halfmoon.server.convert import wire_message

    plain = view()
    full = MessageView(
        topic="ns1%orders",
        queue_id=3,
        queue_offset=17,
        message_id="01ABCDEF",
        body=b"x" * 1024,
        tag="tagA",
        keys=["k1", "k2"],
        properties={"a": "1", "b": "2"},
        message_type=MessageType.TRANSACTION,
        message_group="g1",
        delivery_timestamp=1_700_000_005_000,
        born_timestamp=1_700_000_000_123,
        born_host="10.0.0.1:1",
        store_timestamp=1_700_000_000_124,
        store_host="10.0.0.2:8081",
        commit_log_offset=99,
        transaction_id="T42",
        priority=2,
    )
    for v in (plain, full):
        built = check_command(v, "T42").SerializeToString(deterministic=True)
        expected = recover_orphaned_transaction_command(wire_message(v), "T42")
        assert built == expected.SerializeToString(deterministic=True)
