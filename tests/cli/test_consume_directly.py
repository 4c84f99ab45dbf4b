"""``halfmoon message get ID --group G --client C``: a connected consumer consumes a message again.

mqadmin's ``queryMsgByUniqueKey -g -d`` (consumeMessageDirectly): the server
sends ``VerifyMessageCommand`` on the client's telemetry stream and reports
the client's answer. A real ``halfmoon serve`` and real clients: halfmoon's
push consumer runs its listener, halfmoon's simple consumer answers
NOT_IMPLEMENTED (as RocketMQ's clients without a listener do), and the
official Python client, which ignores the command, times out with a clear
error.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from halfmoon.client import (
    ConsumeResult,
    Message,
    MessageSelector,
    MessageView,
    SyncProducer,
    SyncPushConsumer,
    SyncSimpleConsumer,
)
from tests.cli.test_cli import failed, ok, unique
from tests.server.conftest import ServerProcess, wait_until
from tests.server.test_official_node_client import node, scripts  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def only_client(server: ServerProcess, group: str) -> str:
    def clients() -> list[dict] | None:
        data = json.loads(ok(server.cli("consumer", "status", group, "--json")))
        return data["clients"] or None

    found = wait_until(clients, 15, f"a connected consumer of {group}")
    assert len(found) == 1, found  # type: ignore[arg-type]
    return str(found[0]["client_id"])  # type: ignore[index]


def sent(server: ServerProcess, topic: str, body: bytes) -> str:
    with SyncProducer(server.grpc, topics=[topic]) as producer:
        return producer.send(Message(topic, body)).message_id


def test_a_push_consumer_runs_its_listener_on_the_message_again(server):
    topic, group = unique("orders"), unique("billing")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    seen: list[tuple[str, bytes]] = []
    consumed = threading.Event()

    def listener(message: MessageView) -> ConsumeResult:
        seen.append((message.message_id, message.body))
        consumed.set()
        return ConsumeResult.LATER if message.body == b"refuse" else ConsumeResult.SUCCESS

    with SyncPushConsumer(
        server.grpc, group, {topic: MessageSelector.all()}, listener, consume_from="earliest"
    ) as consumer:
        client_id = consumer.client.client_id
        assert only_client(server, group) == client_id
        message_id = sent(server, topic, b"hello")
        assert consumed.wait(15)

        answer = json.loads(
            ok(
                server.cli(
                    "message", "get", message_id, "--group", group, "--client", client_id, "--json"
                )
            )
        )
        assert answer["consumed"] is True and answer["code"] == "OK"
        assert answer["topic"] == topic
        assert seen.count((message_id, b"hello")) == 2  # received once, consumed again once

        refused = sent(server, topic, b"refuse")
        wait_until(lambda: (refused, b"refuse") in seen, 15, "the second message consumed")
        text = ok(server.cli("message", "get", refused, "--group", group, "--client", client_id))
        assert text.strip() == (
            f"client {client_id} of group '{group}' did not consume it "
            "(FAILED_TO_CONSUME_MESSAGE): the listener answered LATER (or raised)"
        )


def test_clients_without_a_listener_and_unknown_clients_are_told_apart(server):
    topic, group = unique("orders"), unique("billing")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    message_id = sent(server, topic, b"x")
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}):
        client_id = only_client(server, group)
        answer = json.loads(
            ok(
                server.cli(
                    "message", "get", message_id, "--group", group, "--client", client_id, "--json"
                )
            )
        )
        assert answer["consumed"] is False and answer["code"] == "NOT_IMPLEMENTED"

        line = failed(
            server.cli("message", "get", message_id, "--group", group, "--client", "nobody")
        )
        assert "CLIENT_NOT_CONNECTED" in line
        other = unique("other")
        server.create_group(other)
        line = failed(
            server.cli("message", "get", message_id, "--group", other, "--client", client_id)
        )
        assert "CLIENT_NOT_CONNECTED" in line  # connected, but not a consumer of that group
    line = failed(server.cli("message", "get", message_id, "--group", group), 2)
    assert "--group and --client go together" in line


def test_the_official_python_client_ignores_the_command_and_the_call_times_out(server):
    topic, group = unique("orders"), unique("billing")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    message_id = sent(server, topic, b"x")
    consumer = SimpleConsumer(
        ClientConfiguration(server.grpc, Credentials(), request_timeout=5),
        group,
        {topic: FilterExpression()},
        await_duration=1,
    )
    consumer.startup()
    try:
        client_id = only_client(server, group)
        code, answer = server.admin_call(
            "POST",
            f"/v1/messages/{message_id}/consume",
            {"group": group, "client_id": client_id, "timeout_ms": 500},
        )
        assert code == 500, answer
        assert answer["error"]["code"] == "CLIENT_DID_NOT_ANSWER"  # type: ignore[index]
        assert "did not answer within 0.5 s" in answer["error"]["message"]  # type: ignore[index]
    finally:
        consumer.shutdown()


def test_the_official_node_client_answers_not_implemented(server, scripts):  # noqa: F811
    topic, group = unique("orders"), unique("billing")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    message_id = sent(server, topic, b"x")
    run = scripts(
        "push_slow_consume.js",
        {"endpoints": server.grpc, "group": group, "topic": topic, "expect": 1,
         "lingerMs": 30_000, "deadlineMs": 40_000},
    )  # fmt: skip
    client_id = only_client(server, group)  # the fixture kills the script at the end
    answer = json.loads(
        ok(
            server.cli(
                "message", "get", message_id, "--group", group, "--client", client_id, "--json"
            )
        )
    )
    # The Node client echoes the command with a NOT_IMPLEMENTED status.
    assert answer["consumed"] is False and answer["code"] == "NOT_IMPLEMENTED", run.name
