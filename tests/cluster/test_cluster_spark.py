"""The Spark connector against a real cluster (etcd, two brokers, two proxies), local Spark.

The source reads a topic whose queues live on both brokers: every message
exactly once, each row naming the cluster-wide queue it was sent to. The
exactly-once sink writes into a topic spread over both brokers: its data
group spans them (a cross-broker transaction group) and every row appears
exactly once, with no half message left pending on either broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.client import Message, SyncProducer
from halfmoon.spark.wire import Wire
from tests.cluster.cluster_server import ClusterServer
from tests.spark.conftest import MARKER_TOPIC, read_topic

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path_factory.mktemp("spark-cluster")).start()
    server.create_topic(MARKER_TOPIC, message_type="transaction", queues=1)
    try:
        yield server
    finally:
        if server.alive():
            server.stop()


class _OneProxy:
    """The cluster as the connector sees it: one proxy's ``host:port`` (``endpoint`` option)."""

    def __init__(self, cluster: ClusterServer) -> None:
        self.grpc = cluster.address


def _owners(cluster: ClusterServer, topic: str) -> dict[int, str]:
    code, body = cluster.admin_call("GET", f"/v1/topics/{topic}/route")
    assert code == 200, body
    return {q["queue_id"]: q["broker"] for q in body["queues"]}  # type: ignore[index]


def test_source_reads_every_message_once_from_both_brokers(spark, cluster) -> None:
    cluster.create_topic("spread-in", queues=4)
    owners = _owners(cluster, "spread-in")
    assert sorted(owners.values()) == ["broker-a", "broker-a", "broker-b", "broker-b"], owners
    with SyncProducer(cluster.grpc) as producer:
        sent = producer.send_batch([Message("spread-in", f"m-{i}".encode()) for i in range(80)])

    rows = read_topic(spark, _OneProxy(cluster), "spread-in")
    assert sorted(r.message_id for r in rows) == sorted(r.message_id for r in sent)
    assert {owners[r.queue_id] for r in rows} == {"broker-a", "broker-b"}
    # Each row names the queue its message is stored in: reading only that queue finds it.
    for queue_id in owners:
        only = read_topic(spark, _OneProxy(cluster), "spread-in", queues=str(queue_id))
        assert only and {r.queue_id for r in only} == {queue_id}
        assert {r.message_id for r in only} == {
            r.message_id for r in rows if r.queue_id == queue_id
        }
        offsets = sorted(r.queue_offset for r in only)
        assert offsets == list(range(len(only))), "a queue's offsets are its broker queue's"


def test_bulk_read_through_a_proxy_reads_each_queue_from_its_broker(cluster) -> None:
    cluster.create_topic("spread-bulk", message_type="mixed", queues=4)
    owners = _owners(cluster, "spread-bulk")
    with SyncProducer(cluster.grpc) as producer:
        sent = producer.send_batch(
            [Message("spread-bulk", f"b-{i}".encode(), tag=f"t{i % 2}") for i in range(40)]
        )
    proxy = Wire(cluster.address)
    proxy.send_halves([Message("spread-bulk", b"pending")], "bulk-pending")  # never committed
    by_queue: dict[int, list[str]] = {}
    for queue in proxy.queues("spread-bulk"):
        answer = proxy.bulk_read("halfmoon-spark", queue, 0, None, 1000, 1 << 20)
        assert answer.queue_id == queue.queue_id and answer.next_offset == answer.count
        assert answer.columns.get("queue_offset", []) == list(range(answer.count))
        by_queue[queue.queue_id] = answer.columns.get("message_id", [])
        odd = proxy.bulk_read("halfmoon-spark", queue, 0, None, 1000, 1 << 20, ("TAG", "t1"))
        assert set(odd.columns.get("tag", [])) <= {"t1"}
    assert sorted(i for ids in by_queue.values() for i in ids) == sorted(r.message_id for r in sent)
    assert {owners[q] for q, ids in by_queue.items() if ids} == {"broker-a", "broker-b"}


def test_exactly_once_sink_commits_one_group_across_both_brokers(
    spark,
    cluster,
    tmp_path: Path,
) -> None:
    cluster.create_topic("copy-in", queues=4)
    cluster.create_topic("copy-out", message_type="transaction", queues=4)
    assert set(_owners(cluster, "copy-out").values()) == {"broker-a", "broker-b"}
    with SyncProducer(cluster.grpc) as producer:
        sent = producer.send_batch([Message("copy-in", f"row-{i}".encode()) for i in range(120)])

    endpoint = cluster.address
    stream = (
        spark.readStream.format("halfmoon").option("endpoint", endpoint)
        .option("topic", "copy-in").option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "70").load()
    )  # fmt: skip
    query = (
        stream.selectExpr("body", "array(message_id) AS keys")
        .writeStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("admin", cluster.admin)
        .option("topic", "copy-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [70, 50]

    owners = _owners(cluster, "copy-out")
    rows = read_topic(spark, _OneProxy(cluster), "copy-out")
    assert sorted(r.body.decode() for r in rows) == sorted(f"row-{i}" for i in range(120))
    assert sorted(r.keys[0] for r in rows) == sorted(r.message_id for r in sent)
    # Each batch's group put rows on both brokers and committed them all.
    assert {owners[r.queue_id] for r in rows} == {"broker-a", "broker-b"}
    code, body = cluster.admin_call("GET", "/v1/transactions?topic=copy-out")
    assert code == 200 and body["transactions"] == [], body  # type: ignore[index]
