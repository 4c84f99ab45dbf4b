"""The AMQP topology in the definitions (``halfmoon definitions``), on real servers through pika.

Exchanges, queues and bindings declared through pika on one server are exported in
RabbitMQ's shape and imported through the CLI into a fresh server, where pika finds them
and a publish routes as on the first. A second import changes nothing; a document that
breaks an AMQP declare rule changes nothing at all and names the entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

AMQP = ("server.amqp_listen=127.0.0.1:0",)


def connect(server: ServerProcess, vhost: str = "%2F") -> pika.BlockingConnection:
    assert server.amqp_address, server.log_tail()
    return pika.BlockingConnection(
        pika.URLParameters(f"amqp://guest:guest@{server.amqp_address}/{vhost}")
    )


def started(path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(path, settings=AMQP).start()
    try:
        yield server
    finally:
        if server.alive():
            server.stop()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from started(tmp_path / "target")


@pytest.fixture
def source(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from started(tmp_path / "source")


def declare_shop(server: ServerProcess) -> None:
    with connect(server) as connection:
        channel = connection.channel()
        channel.exchange_declare("orders", "topic", durable=True)
        channel.exchange_declare("orders.audit", "fanout", durable=True, internal=True)
        channel.exchange_declare("scratch", "direct", durable=False)  # not exported
        channel.queue_declare(
            "billing.q", durable=True, arguments={"x-message-ttl": 60000, "x-max-priority": 5}
        )
        channel.queue_declare("audit.q", durable=True)
        channel.queue_bind("billing.q", "orders", routing_key="order.*")
        channel.exchange_bind("orders.audit", "orders", routing_key="#")
        channel.queue_bind("audit.q", "orders.audit")
    with connect(server, "shop") as connection:
        connection.channel().queue_declare("returns", durable=True)


def run_cli(server: ServerProcess, *args: str) -> str:
    done = server.cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_topology_goes_to_a_fresh_server_and_routes_there(
    source: ServerProcess, target: ServerProcess, tmp_path: Path
) -> None:
    declare_shop(source)
    exported = tmp_path / "definitions.json"
    run_cli(source, "definitions", "export", str(exported))
    document = json.loads(exported.read_text())

    assert document["vhosts"] == [{"name": "/"}, {"name": "shop"}]
    assert [(e["vhost"], e["name"], e["type"]) for e in document["exchanges"]] == [
        ("/", "orders", "topic"),
        ("/", "orders.audit", "fanout"),
    ]
    assert document["exchanges"][1]["internal"] is True
    billing = next(q for q in document["queues"] if q["name"] == "billing.q")
    assert billing == {
        "name": "billing.q", "vhost": "/", "durable": True, "auto_delete": False,
        "arguments": {"x-message-ttl": 60000, "x-max-priority": 5},
    }  # fmt: skip
    assert {(q["vhost"], q["name"]) for q in document["queues"]} == {
        ("/", "audit.q"), ("/", "billing.q"), ("shop", "returns"),
    }  # fmt: skip
    assert sorted(
        (b["source"], b["destination_type"], b["destination"], b["routing_key"])
        for b in document["bindings"]
    ) == [
        ("orders", "exchange", "orders.audit", "#"),
        ("orders", "queue", "billing.q", "order.*"),
        ("orders.audit", "queue", "audit.q", "audit.q"),  # pika binds by the queue name
    ]
    # A queue's own topic and group are its entry's, not topics and groups of their own.
    assert document["topics"] == [] and document["groups"] == []

    answer = json.loads(run_cli(target, "definitions", "import", str(exported), "--json"))
    assert sorted(answer["created"]["queues"]) == ["audit.q", "billing.q", "shop:returns"]
    assert sorted(answer["created"]["exchanges"]) == ["orders", "orders.audit"]
    assert len(answer["created"]["bindings"]) == 3

    with connect(target) as connection:
        channel = connection.channel()
        channel.exchange_declare("orders", "topic", durable=True, passive=True)
        channel.queue_declare("billing.q", passive=True)
        channel.basic_publish("orders", "order.created", b"order 7")
        for queue in ("billing.q", "audit.q"):  # direct, and through the exchange binding
            got = None
            for _ in range(50):
                _, _, got = channel.basic_get(queue, auto_ack=True)
                if got is not None:
                    break
                connection.sleep(0.1)
            assert got == b"order 7", queue
    with connect(target, "shop") as connection:
        connection.channel().queue_declare("returns", passive=True)

    again = json.loads(run_cli(target, "definitions", "import", str(exported), "--json"))
    assert all(not names for names in again["created"].values()), again["created"]
    assert sorted(again["unchanged"]["queues"]) == ["audit.q", "billing.q", "shop:returns"]
    moved = json.loads(run_cli(target, "definitions", "export", "--json"))
    for kind in ("vhosts", "exchanges", "queues", "bindings", "topics", "groups"):
        assert moved[kind] == document[kind], kind


def bad(server: ServerProcess, document: dict) -> str:
    code, answer = server.admin_call("POST", "/v1/definitions", document)
    assert code == 400 and answer["error"]["code"] == "INVALID_DEFINITIONS", (code, answer)
    return answer["error"]["message"]


def test_an_import_that_breaks_a_declare_rule_changes_nothing(target: ServerProcess) -> None:
    with connect(target) as connection:
        connection.channel().exchange_declare("orders", "topic", durable=True)
    good = {"name": "billing", "vhost": "/", "durable": True, "arguments": {}}
    base = {"halfmoon_definitions": 1, "queues": [good], "topics": [{"name": "plain"}]}

    reserved = {**base, "exchanges": [{"name": "amq.custom", "vhost": "/", "type": "direct"}]}
    assert "reserved prefix 'amq.*'" in bad(target, reserved)
    redeclared = {**base, "exchanges": [{"name": "orders", "vhost": "/", "type": "fanout"}]}
    assert "inequivalent arg for exchange 'orders'" in bad(target, redeclared)
    unknown_type = {**base, "exchanges": [{"name": "x", "vhost": "/", "type": "random"}]}
    assert "unknown exchange type 'random'" in bad(target, unknown_type)
    dangling = {
        **base,
        "bindings": [{"source": "orders", "vhost": "/", "destination": "nowhere",
                      "destination_type": "queue", "routing_key": "k"}],
    }  # fmt: skip
    assert "no queue 'nowhere'" in bad(target, dangling)
    bad_argument = {**base, "queues": [{**good, "arguments": {"x-max-priority": 1000}}]}
    assert "x-max-priority" in bad(target, bad_argument)
    assert "bindings[0]" in bad(target, {**dangling, "queues": []})

    # None of those documents left anything: not the queue, not the plain topic before it.
    with connect(target) as connection:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("billing", passive=True)
        assert refused.value.reply_code == 404
    code, _ = target.admin_call("GET", "/v1/topics/plain")
    assert code == 404

    # A dry run plans the queue and declares nothing.
    code, answer = target.admin_call("POST", "/v1/definitions?dry_run=true", base)
    assert code == 200 and answer["applied"] is False and answer["created"]["queues"] == ["billing"]
    with connect(target) as connection, pytest.raises(pika.exceptions.ChannelClosedByBroker):
        connection.channel().queue_declare("billing", passive=True)

    # The same document without its broken entry applies, queue included.
    code, answer = target.admin_call("POST", "/v1/definitions", base)
    assert code == 200 and answer["created"]["queues"] == ["billing"], answer
    with connect(target) as connection:
        connection.channel().queue_declare("billing", passive=True)
