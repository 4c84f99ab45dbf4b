"""``halfmoon consumer ...`` and ``halfmoon group update`` against a real ``halfmoon serve``.

Connected clients live in the gRPC server, so these tests run the whole
server as a subprocess and connect real consumers with ``halfmoon.client``.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from halfmoon.client import ClientError, Message, MessageSelector, SyncProducer, SyncSimpleConsumer
from tests.cli.test_cli import failed, failed_json, ok, table, unique
from tests.server.conftest import ServerProcess, wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return server.cli(*args)


def send(server: ServerProcess, topic: str, count: int, tag: str = "a") -> None:
    for i in range(count):
        code, answer = server.admin_call(
            "POST", f"/v1/topics/{topic}/messages", {"body": f"m{i}", "tag": tag}
        )
        assert code == 201, answer


def topic_and_group(server: ServerProcess) -> tuple[str, str]:
    topic, group = unique("orders"), unique("billing")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    return topic, group


def connected(server: ServerProcess, group: str, count: int = 1) -> list[dict]:
    def clients() -> list[dict] | None:
        data = json.loads(ok(cli(server, "consumer", "status", group, "--json")))
        return data["clients"] if len(data["clients"]) >= count else None

    return wait_until(clients, 15, f"{count} connected consumer(s) of {group}")  # type: ignore[return-value]


def test_status_shows_who_is_connected_and_what_they_subscribe(server):
    topic, group = topic_and_group(server)
    assert (
        ok(cli(server, "consumer", "status", group))
        == f"no consumer of group '{group}' is connected\n"
    )
    with SyncSimpleConsumer(
        server.grpc, group, {topic: MessageSelector.by_tag("a || b")}
    ) as consumer:
        clients = connected(server, group)
        assert [c["client_id"] for c in clients] == [consumer.client.client_id]
        assert clients[0]["client_type"] == "SIMPLE_CONSUMER"
        assert clients[0]["subscriptions"] == [
            {"topic": topic, "filter_type": "tag", "filter": "a || b"}
        ]
        rows = table(ok(cli(server, "consumer", "status", group)))
        assert rows[0][:3] == ["CLIENT", "ID", "TYPE"]
        assert rows[1][:2] == [consumer.client.client_id, "simple"]
        assert f"{topic}(a" in rows[1]


def test_progress_shows_lag_per_queue_clients_and_rate(server):
    topic, group = topic_and_group(server)
    send(server, topic, 6)
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        received = []
        deadline = time.monotonic() + 15
        while len(received) < 2 and time.monotonic() < deadline:
            received += consumer.receive(2 - len(received), 60, wait=2)
        assert len(received) == 2
        for message in received:
            consumer.ack(message)
        connected(server, group)

        out = ok(cli(server, "consumer", "progress", group))
        sections = out.strip().split("\n\n")
        assert table(sections[0])[0][:3] == ["TOPIC", "QUEUE", "BROKER"]
        assert table(sections[0])[1] == [topic, "0", "6", "2", "4", "4", "0", "0"]  # all 4 ready
        assert table(sections[1])[1][0] == consumer.client.client_id
        tps_line, lag_line = sections[2].splitlines()
        # 2 messages in the last 60 s (a minute boundary in between prorates it a little)
        assert tps_line.startswith("consume TPS: 0.0") and float(tps_line.split()[-1]) > 0
        assert lag_line == "total lag: 4"

        data = json.loads(
            ok(cli(server, "consumer", "progress", group, "--topic", topic, "--json"))
        )
        assert data["total_lag"] == 4 and 0.02 < data["consume_tps"] <= 0.034
        assert [(q["committed_offset"], q["max_offset"], q["lag"]) for q in data["queues"]] == [
            (2, 6, 4)
        ]
        assert [c["client_id"] for c in data["clients"]] == [consumer.client.client_id]


def test_reset_offset_to_a_time_replays_or_skips(server):
    topic, group = topic_and_group(server)
    before = int(time.time() * 1000) - 1000
    send(server, topic, 3)
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 3 and time.monotonic() < deadline:
            got += consumer.receive(3, 60, wait=2)
        for message in got:
            consumer.ack(message)
    assert len(got) == 3

    out = ok(
        cli(server, "consumer", "reset-offset", group, "--topic", topic, "--time", str(before))
    )
    assert out.startswith(f"reset group '{group}' in '{topic}' to ")
    assert table(out.split("\n\n")[1]) == [["QUEUE", "NEW", "OFFSET"], ["0", "0"]]
    data = json.loads(ok(cli(server, "consumer", "progress", group, "--json")))
    assert data["total_lag"] == 3

    data = json.loads(
        ok(
            cli(
                server,
                "consumer",
                "reset-offset",
                group,
                "--topic",
                topic,
                "--time",
                "now",
                "--json",
            )
        )
    )
    assert data["queues"] == [{"queue_id": 0, "offset": 3}]
    assert json.loads(ok(cli(server, "consumer", "progress", group, "--json")))["total_lag"] == 0


def test_consumer_errors_are_one_line(server):
    topic, group = topic_and_group(server)
    for action in ("progress", "status"):
        assert failed(cli(server, "consumer", action, "ghost")).endswith(
            "(CONSUMER_GROUP_NOT_FOUND)"
        )
    line = failed(
        cli(server, "consumer", "reset-offset", "ghost", "--topic", topic, "--time", "now")
    )
    assert line.endswith("(CONSUMER_GROUP_NOT_FOUND)")
    error = failed_json(
        cli(server, "consumer", "reset-offset", group, "--topic", "nope", "--time", "now", "--json")
    )
    assert error["code"] == "TOPIC_NOT_FOUND"
    assert "bad time 'soon'" in failed(
        cli(server, "consumer", "reset-offset", group, "--topic", topic, "--time", "soon"), status=2
    )
    assert "required: --time" in failed(
        cli(server, "consumer", "reset-offset", group, "--topic", topic), status=2
    )


def test_group_update_changes_what_consumers_get(server):
    topic, group = topic_and_group(server)
    out = ok(
        cli(
            server,
            "group",
            "update",
            group,
            "--disable",
            "--broadcast",
            "--max-attempts",
            "4",
            "--from",
            "latest",
        )
    )
    assert out == (
        f"updated group '{group}' (consuming disabled, from latest, broadcast, max attempts 4, "
        "fifo off)\n"
    )
    code, answer = server.admin_call("GET", f"/v1/groups/{group}")
    assert (answer["consume_enabled"], answer["broadcast"], answer["max_delivery_attempts"]) == (
        False,
        True,
        4,
    )
    send(server, topic, 1)
    consumer = SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()})
    with pytest.raises(ClientError), consumer:  # the broker refuses a disabled group
        consumer.receive(1, 30, wait=1)

    data = json.loads(
        ok(
            cli(
                server,
                "group",
                "update",
                group,
                "--enable",
                "--clustering",
                "--from",
                "earliest",
                "--json",
            )
        )
    )
    assert (data["consume_enabled"], data["broadcast"], data["consume_from"]) == (
        True,
        False,
        "earliest",
    )
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        got = wait_until(
            lambda: consumer.receive(1, 30, wait=1), 15, "the message once consuming is enabled"
        )
    assert [m.body for m in got] == [b"m0"]  # type: ignore[union-attr]

    assert "nothing to update" in failed(cli(server, "group", "update", group), status=2)
    assert "not allowed with argument" in failed(
        cli(server, "group", "update", group, "--enable", "--disable"), status=2
    )
    assert failed(cli(server, "group", "update", "ghost", "--enable")).endswith(
        "(CONSUMER_GROUP_NOT_FOUND)"
    )


def test_producer_status_lists_producers_connected_to_a_topic(server):
    topic = unique("orders")
    server.create_topic(topic, queues=1)
    assert (
        ok(cli(server, "producer", "status", topic))
        == f"no producer connected now has sent to '{topic}'\n"
    )
    with SyncProducer(server.grpc, topics=[topic]) as producer:
        producer.send(Message(topic, b"hello"))
        client_id = producer.client.client_id

        def listed() -> list[dict] | None:
            data = json.loads(ok(cli(server, "producer", "status", topic, "--json")))
            return data["clients"] or None

        clients = wait_until(listed, 15, f"a producer of {topic}")
        assert [c["client_id"] for c in clients] == [client_id]  # type: ignore[union-attr]
        assert clients[0]["client_type"] == "PRODUCER"  # type: ignore[index]
        rows = table(ok(cli(server, "producer", "status", topic)))
        assert rows[0][:3] == ["CLIENT", "ID", "GROUP"]
        assert rows[1][0] == client_id
        other = json.loads(
            ok(cli(server, "producer", "status", topic, "--group", "nobody", "--json"))
        )
        assert other["clients"] == []  # --group narrows to one producer group
    failed(cli(server, "producer", "status", unique("missing")))


def test_producer_list_shows_every_connected_producer_with_what_it_sends(server):
    first, second = unique("orders"), unique("invoices")
    server.create_topic(first, queues=1)
    server.create_topic(second, queues=1)
    with (
        SyncProducer(server.grpc, topics=[first]) as one,
        SyncProducer(server.grpc, topics=[second]) as other,
    ):
        one.send(Message(first, b"a"))
        one.send(Message(first, b"b"))
        other.send(Message(second, b"c"))
        ours = {one.client.client_id: first, other.client.client_id: second}

        def listed() -> dict[str, dict] | None:
            data = json.loads(ok(cli(server, "producer", "list", "--json")))
            assert data["registry"] is True
            found = {c["client_id"]: c for c in data["clients"] if c["client_id"] in ours}
            sent = {c.get("messages_sent") for c in found.values()}
            return found if len(found) == 2 and 0 not in sent and None not in sent else None

        found = wait_until(listed, 15, "both producers listed with what they sent")
        for client_id, topic in ours.items():
            assert found[client_id]["publishes"] == [topic]  # type: ignore[index]
        assert found[one.client.client_id]["messages_sent"] == 2  # type: ignore[index]
        rows = table(ok(cli(server, "producer", "list")))
        assert rows[0][:3] == ["CLIENT", "ID", "GROUP"] and rows[0][-2:] == ["SENT", "RATE/S"]
        by_id = {row[0]: row for row in rows[1:]}
        assert by_id[one.client.client_id][-3:-1] == [first, "2"]
        assert by_id[other.client.client_id][-3:-1] == [second, "1"]
    # closed: they leave the list (the registry drops a session when its stream ends)
    wait_until(
        lambda: (
            not {
                c["client_id"]
                for c in json.loads(ok(cli(server, "producer", "list", "--json")))["clients"]
            }
            & set(ours)
        ),
        15,
        "closed producers gone from the list",
    )


def test_group_peek_consumes_nothing_and_purge_skips_one_groups_backlog(server):
    topic, group = topic_and_group(server)
    other = unique("bystander")
    server.create_group(other)
    send(server, topic, 3, tag="t")
    out = ok(cli(server, "group", "peek", group, "--topic", topic))
    assert out.startswith(f"3 message(s) of '{topic}' not yet consumed by '{group}'"), out
    rows = table(out.split("\n\n", 1)[1])
    assert len(rows) == 4 and rows[1][-1] == "m0", rows  # a header and three messages
    again = json.loads(
        ok(cli(server, "group", "peek", group, "--topic", topic, "--limit", "2", "--json"))
    )
    assert again["backlog"] == 3 and len(again["messages"]) == 2  # peeking moved nothing
    out = ok(cli(server, "group", "purge", group, "--topic", topic))
    assert out == f"purged 3 message(s) of '{topic}' for group '{group}'\n"
    assert (
        json.loads(ok(cli(server, "group", "peek", group, "--topic", topic, "--json")))["backlog"]
        == 0
    )
    kept = json.loads(ok(cli(server, "group", "peek", other, "--topic", topic, "--json")))
    assert kept["backlog"] == 3
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        assert consumer.receive(3, 30, wait=1) == []  # purged: the group gets none of them
    line = failed(cli(server, "group", "purge", group, "--topic", "no-such-topic"))
    assert "TOPIC_NOT_FOUND" in line, line
