"""The metrics an on-call engineer reads first, through a real ``halfmoon serve`` and through
a ``halfmoon proxy`` in front of a ``halfmoon broker`` process: each is scraped before and
after something happens, and must have moved."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.client import (
    ClientConfig,
    Message,
    MessageSelector,
    MessageView,
    Producer,
    SimpleConsumer,
    TransactionProducer,
    TransactionResolution,
)
from tests.cluster.cluster_server import ClusterServer
from tests.cluster.proxied_server import ProxiedServer
from tests.server.conftest import ServerProcess, unique

SETTINGS = (
    "broker.min_receive_invisible_ms=1s",
    "transaction.timeout_ms=1s",
    "transaction.check_interval_ms=1s",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(server: ServerProcess) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(server.admin + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name, labels, value = match.groups()
        samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v
        for n, have, v in samples
        if n == name and all(have.get(k) == w for k, w in labels.items())
    )


@pytest.fixture(scope="module", params=["serve", "proxy"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    kind = ProxiedServer if request.param == "proxy" else ServerProcess
    proc = kind(tmp_path_factory.mktemp("metrics-data"), settings=SETTINGS).start()
    try:
        yield proc
    finally:
        proc.stop()


def run(coro: object, timeout: float = 60) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


async def receive_some(
    consumer: SimpleConsumer, want: int, within: float = 20.0, invisible_s: int = 1
) -> list[MessageView]:
    got: list[MessageView] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(got) < want and loop.time() < deadline:
        got.extend(await consumer.receive(32, invisible_s, wait=0.5))
    return got


def test_rates_latencies_redeliveries_and_dead_letters(server: ServerProcess, tmp_path: Path):
    rates_latencies_redeliveries_and_dead_letters(server, server.grpc)


def test_a_cluster_proxy_reports_every_broker_counters(tmp_path: Path):
    """Through a proxy of a real cluster (etcd, two brokers): the brokers' counted families,
    summed over both (the topic's queues are spread over them), each sample naming its
    broker."""
    cluster = ClusterServer(tmp_path / "cluster", settings=SETTINGS).start()
    try:
        samples = rates_latencies_redeliveries_and_dead_letters(cluster, cluster.proxies[0].address)
        counted = ("halfmoon_topic_messages_in_total", "halfmoon_group_messages_out_total")
        brokers = [labels.get("broker") for name, labels, _ in samples if name in counted]
        assert brokers and set(brokers) <= {"broker-a", "broker-b"}, brokers
    finally:
        cluster.stop()


def rates_latencies_redeliveries_and_dead_letters(
    server: ServerProcess, endpoint: str
) -> list[tuple[str, dict[str, str], float]]:
    """Send, receive and ack, let messages expire into redelivery and then the dead-letter
    topic; the counters must have moved by exactly that much. The scrape after."""
    topic, group, doomed = unique("rates"), unique("readers"), unique("doomed")
    server.create_topic(topic, queues=2)
    server.create_group(group)
    server.create_group(doomed, max_delivery_attempts=2)
    before = scrape(server)
    config = ClientConfig(endpoint, request_timeout=5.0)

    async def scenario() -> None:
        async with Producer(config) as producer:
            for i in range(3):
                await producer.send(Message(topic, f"m{i}".encode()))
            during = scrape(server)
            assert value(during, "halfmoon_clients", kind="PRODUCER", language="PYTHON") >= 1
        async with SimpleConsumer(config, group, {topic: MessageSelector.all()}) as consumer:
            got = await receive_some(consumer, 3)
            assert len(got) == 3
            for message in got:
                await consumer.ack(message)
        async with SimpleConsumer(config, doomed, {topic: MessageSelector.all()}) as consumer:
            first = await receive_some(consumer, 3)  # not acked: back after 1 s
            assert len(first) == 3
            again = await receive_some(consumer, 3, within=30)  # the second and last attempt
            assert len(again) == 3 and all(m.delivery_attempt == 2 for m in again)
            await receive_some(consumer, 1, within=3)  # past the last attempt: dead-lettered

    run(scenario(), timeout=120)
    after = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("halfmoon_topic_messages_in_total", topic=topic) == 3
    assert moved("halfmoon_group_messages_out_total", group=group, topic=topic) == 3
    assert moved("halfmoon_group_messages_acked_total", group=group, topic=topic) == 3
    assert moved("halfmoon_group_messages_out_total", group=doomed, topic=topic) == 6
    assert moved("halfmoon_group_messages_redelivered_total", group=doomed, topic=topic) == 3
    assert moved("halfmoon_dead_letters_total", group=doomed) == 3
    assert moved("halfmoon_end_to_end_latency_seconds_count", group=group) == 3
    assert moved("halfmoon_end_to_end_latency_seconds_bucket", group=group, le="+Inf") == 3
    assert moved("halfmoon_end_to_end_latency_seconds_sum", group=group) > 0
    assert moved("halfmoon_grpc_request_duration_seconds_count", method="SendMessage") >= 3
    if type(server) is ServerProcess:  # a proxy holds no data directory
        assert value(after, "halfmoon_disk_free_bytes") > 0
        free = value(after, "halfmoon_disk_free_bytes")
        assert value(after, "halfmoon_disk_total_bytes") >= free
    return after


class _CommitOnCheck:
    def __init__(self) -> None:
        self.checked = asyncio.Event()

    def execute_local_transaction(self, message: Message, arg: object) -> TransactionResolution:
        return TransactionResolution.UNKNOWN

    def check_local_transaction(self, message: MessageView) -> TransactionResolution:
        if message.body == b"undecided":  # stays pending: its age grows
            return TransactionResolution.UNKNOWN
        self.checked.set()
        return TransactionResolution.COMMIT


def test_transactions_pending_age_decisions_and_check_backs(server: ServerProcess):
    topic = unique("txn")
    server.create_topic(topic, message_type="transaction", queues=1)
    before = scrape(server)
    listener = _CommitOnCheck()

    async def scenario() -> None:
        async with TransactionProducer(server.grpc, unique("pg"), listener) as producer:
            rolled = producer.begin()
            await rolled.send(Message(topic, b"rolled back"))
            await rolled.rollback()
            await producer.begin().send(Message(topic, b"left to the check-back"))
            await producer.begin().send(Message(topic, b"undecided"))
            assert value(scrape(server), "halfmoon_transactions_pending") >= 2
            await asyncio.wait_for(listener.checked.wait(), 30)
            commits = value(before, "halfmoon_transaction_decisions_total", outcome="commit")
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                now = scrape(server)
                decided = value(now, "halfmoon_transaction_decisions_total", outcome="commit")
                if decided > commits:
                    break
                assert asyncio.get_running_loop().time() < deadline, "the checked commit"
                await asyncio.sleep(0.1)
            assert value(now, "halfmoon_transactions_pending") >= 1  # the undecided one
            assert value(now, "halfmoon_transactions_oldest_pending_age_seconds") >= 1.0

    run(scenario())
    after = scrape(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("halfmoon_transaction_decisions_total", outcome="rollback") == 1
    assert moved("halfmoon_transaction_decisions_total", outcome="commit") == 1
    assert moved("halfmoon_transaction_checks_sent_total") >= 1
    assert moved("halfmoon_transaction_checks_answered_total") >= 1
    assert value(after, "halfmoon_transactions_parked") == 0


def test_amqp_connections_count_as_clients(tmp_path: Path):
    import pika  # type: ignore[import-untyped]

    server = ServerProcess(tmp_path / "data").start()
    try:
        host, port = server.amqp_address.rsplit(":", 1)
        connection = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        try:
            samples = scrape(server)
        finally:
            connection.close()
        amqp = [
            labels
            for name, labels, v in samples
            if name == "halfmoon_clients" and labels["kind"] == "AMQP" and v == 1
        ]
        assert len(amqp) == 1, samples
        assert amqp[0]["version"].endswith(pika.__version__), amqp
        assert amqp[0]["language"].startswith("Python"), amqp
    finally:
        server.stop()
