"""A proxy with ``--workers 2`` and authentication on: every worker holds the users from etcd,
and SIGHUP reaches the workers through the supervisor (which keeps running)."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.auth import signature
from tests.cluster.cluster_server import ClusterServer, wait_until

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    directory: Path = tmp_path_factory.mktemp("workers-auth")
    key = directory / "auth.key"
    key.write_text(secrets.token_hex(32))
    server = ClusterServer(
        directory,
        brokers=1,
        workers=2,
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root", f"auth.key_file={key}"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    try:
        yield server
    finally:
        server.stop()


def _route(address: str, topic: str, secret: str) -> pb.Status:
    stamp = signature.utc_stamp()
    header = signature.authorization_header(ROOT[0], secret, stamp)
    metadata = [("x-mq-date-time", stamp), ("authorization", header)]
    with grpc.insecure_channel(address) as channel:  # a new connection: any worker may take it
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = svc.QueryRouteRequest(topic=pb.Resource(name=topic))
        return stub.QueryRoute(request, metadata=metadata, timeout=5).status


def test_every_worker_authenticates_and_sighup_reaches_them(cluster: ClusterServer) -> None:
    cluster.create_topic("workers-topic")
    for _ in range(8):  # connections spread over the workers by the kernel
        assert _route(cluster.address, "workers-topic", ROOT[1]).code == pb.Code.OK
        assert _route(cluster.address, "workers-topic", "wrong-secret").code == pb.Code.UNAUTHORIZED
    seen = len(cluster.lines)
    assert cluster.proc is not None
    cluster.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: sum("event=etcd_tls_reloaded" in line for line in cluster.lines[seen:]) >= 2,
        10,
        "both workers' reloads",
    )
    assert cluster.alive()  # the supervisor passed SIGHUP on rather than die of it
    assert _route(cluster.address, "workers-topic", ROOT[1]).code == pb.Code.OK
