"""A transaction group spanning two brokers, decided by an ``EndTransaction`` (the RocketMQ 5
wire, ``hm-group:<id>``) through a ``halfmoon proxy`` in front of the broker that does not
coordinate the group: the decision reaches the coordinator and commits every member."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.cluster.etcd_server import EtcdServer
from tests.cluster.test_txn_checks_through_proxies import SecondProxy
from tests.cluster.test_txn_group_crashes import (
    BROKERS,
    MEMBERS_PER_BROKER,
    TOPIC,
    Cluster,
    all_visible,
    group_coordinated_by,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdServer, cluster_name: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, etcd, cluster_name, BROKERS)
    try:
        for name in BROKERS:
            made.start(name)
        yield made
    finally:
        made.close()


def test_end_transaction_through_a_participants_proxy_commits_everywhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    proxy = SecondProxy(tmp_path / "proxy", cluster.processes["broker-b"].address).start()
    try:
        with grpc.insecure_channel(proxy.grpc) as channel:
            answer = service_pb2_grpc.MessagingServiceStub(channel).EndTransaction(
                svc.EndTransactionRequest(
                    topic=pb.Resource(name=TOPIC),
                    transaction_id=f"hm-group:{group}",
                    resolution=pb.TransactionResolution.COMMIT,
                    source=pb.TransactionSource.SOURCE_CLIENT,
                ),
                timeout=30,
            )
        assert answer.status.code == pb.Code.OK, answer.status
    finally:
        proxy.kill()
    assert cluster.state(group) == all_visible(cluster, group)
    assert sum(visible for visible, _ in cluster.state(group).values()) == 2 * MEMBERS_PER_BROKER
