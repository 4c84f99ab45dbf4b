"""TLS everywhere in cluster mode, with real processes: etcd requiring client certificates,
brokers requiring cluster certificates (mutual TLS), proxies serving TLS to the clients.

Three CAs, as a deployment would keep them apart: etcd's, the internal
protocol's, and the one that signs the proxies' client-facing certificate.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from halfmoon.auth.config import EtcdTlsConfig, InternalTlsConfig
from halfmoon.cluster.coordination import etcd_tls
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_json import call_sync, parse_coordinator
from halfmoon.cluster.errors import CoordinatorUnavailable
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.connection import BrokerConnection
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.send.frames import HEADER, frame
from halfmoon.errors import HalfmoonError
from tests.cluster.cluster_server import ClusterServer, wait_until
from tests.cluster.etcd_server import EtcdTls
from tests.server import test_official_node_client as node_client

pytest.importorskip("cryptography")
from tests.server.certificates import CertificateAuthority, Issued  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
ROOT_DIR = Path(__file__).resolve().parents[2]
CLIENT = textwrap.dedent(
    """
    import sys, time
    from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message,
                          Producer, SimpleConsumer)
    endpoint, topic, group, ak, sk = sys.argv[1:6]
    config = ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=5)
    producer = Producer(config, tls_enable=True)
    producer.startup()
    msg = Message()
    msg.topic = topic
    msg.body = b"over tls, through a secured cluster"
    print("sent", producer.send(msg).message_id, flush=True)
    producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2,
                              tls_enable=True)
    consumer.startup()
    deadline = time.monotonic() + 20
    got = []
    while not got and time.monotonic() < deadline:
        got = consumer.receive(8, 15)
    for m in got:
        consumer.ack(m)
        print("received", m.message_id, flush=True)
    consumer.shutdown()
    """
)


@dataclass
class Pki:
    etcd_ca: CertificateAuthority
    internal_ca: CertificateAuthority
    edge_ca: CertificateAuthority
    etcd_client: Issued
    peer: Issued  # every broker and proxy's internal-protocol certificate


def _ca(directory: Path, name: str) -> CertificateAuthority:
    directory.mkdir(parents=True)
    return CertificateAuthority(directory, name)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("pki")
    etcd_ca = _ca(base / "etcd", "etcd CA")
    internal_ca = _ca(base / "internal", "internal CA")
    return Pki(
        etcd_ca,
        internal_ca,
        _ca(base / "edge", "edge CA"),
        etcd_ca.issue("halfmoon-etcd-client"),
        internal_ca.issue("halfmoon-peer"),
    )


@pytest.fixture(scope="module")
def cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    directory = tmp_path_factory.mktemp("secured-cluster")
    key = directory / "auth.key"
    key.write_text(os.urandom(32).hex())
    etcd_server = pki.etcd_ca.issue("etcd-server")
    probe = pki.etcd_ca.issue("probe")
    edge = pki.edge_ca.issue("proxy")
    server = ClusterServer(
        directory,
        etcd_tls=EtcdTls(
            pki.etcd_ca.bundle, etcd_server.cert, etcd_server.key, probe.cert, probe.key
        ),
        settings=(
            f"etcd.ca={pki.etcd_ca.bundle}",
            f"etcd.cert={pki.etcd_client.cert}",
            f"etcd.key={pki.etcd_client.key}",
            f"internal.ca={pki.internal_ca.bundle}",
            f"internal.cert={pki.peer.cert}",
            f"internal.key={pki.peer.key}",
            "tls.mode=enforcing",
            f"tls.cert={edge.cert}",
            f"tls.key={edge.key}",
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            f"auth.key_file={key}",
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    try:
        yield server
    finally:
        server.stop()


def cli(cluster: ClusterServer, pki: Pki, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        HALFMOON_ACCESS_KEY=ROOT[0],
        HALFMOON_SECRET_KEY=ROOT[1],
        HALFMOON_ADMIN_CA=str(pki.edge_ca.bundle),
    )
    admin = f"https://127.0.0.1:{cluster.admin_port}"
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *args, "--admin", admin],
        cwd=ROOT_DIR, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def test_the_official_client_over_tls_through_a_cluster_secured_end_to_end(
    cluster: ClusterServer, pki: Pki
) -> None:
    for args in (("topic", "create", "secured"), ("group", "create", "secured-group")):
        done = cli(cluster, pki, *args)
        assert done.returncode == 0, done.stderr
    env = {
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(pki.edge_ca.bundle),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, cluster.proxies[1].address, "secured", "secured-group",
         *ROOT],
        cwd=ROOT_DIR, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    sent = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("sent")]
    received = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("recei")]
    assert sent and received == sent, done.stdout


def test_a_broker_refuses_callers_without_a_cluster_certificate(
    cluster: ClusterServer, pki: Pki, tmp_path: Path
) -> None:
    stranger_ca = _ca(tmp_path / "stranger", "stranger CA")
    stranger = stranger_ca.issue("stranger")
    # A certificate of another CA (it trusts the broker, the broker does not trust it).
    strangers = InternalTls(InternalTlsConfig(pki.internal_ca.bundle, stranger.cert, stranger.key))
    peers = InternalTls(InternalTlsConfig(pki.internal_ca.bundle, pki.peer.cert, pki.peer.key))
    for broker in cluster.brokers:
        # Plaintext: the handshake never happens, nothing is called.
        with pytest.raises(HalfmoonError):
            BrokerConnection(broker.address, timeout_s=2, tls=PLAINTEXT).hello()
        with pytest.raises(HalfmoonError):
            BrokerConnection(broker.address, timeout_s=2, tls=strangers).hello()
        # A cluster certificate: answered.
        connection = BrokerConnection(broker.address, timeout_s=10, tls=peers)
        assert connection.hello()["broker"] == broker.name


def _send_listener_hello(host: str, port: int, context: ssl.SSLContext | None) -> object:
    """The hello answer of a broker's send listener, over TLS when ``context`` is given."""
    with socket.create_connection((host, port), timeout=5) as raw:
        sock = context.wrap_socket(raw, server_hostname=host) if context else raw
        sock.sendall(frame(wire.encode({"version": wire.version_token(), "peer": "test"})))
        data = b""
        while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack(data[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return wire.decode(data[HEADER.size :])


def test_a_brokers_send_listener_refuses_callers_without_a_cluster_certificate(
    cluster: ClusterServer, pki: Pki, tmp_path: Path
) -> None:
    stranger = _ca(tmp_path / "stranger", "stranger CA").issue("stranger")
    for broker in cluster.brokers:
        assert broker.send_port is not None  # the proxies' sends go here, over TLS
        host = broker.address.rpartition(":")[0]
        # Plaintext: the TLS listener never reads a frame.
        with pytest.raises((ConnectionError, OSError)):
            _send_listener_hello(host, broker.send_port, None)
        # A certificate of another CA: the handshake fails.
        context = ssl.create_default_context(cafile=str(pki.internal_ca.bundle))
        context.load_cert_chain(str(stranger.cert), str(stranger.key))
        with pytest.raises((ConnectionError, OSError)):
            _send_listener_hello(host, broker.send_port, context)
        # A cluster certificate: answered.
        context = ssl.create_default_context(cafile=str(pki.internal_ca.bundle))
        context.load_cert_chain(str(pki.peer.cert), str(pki.peer.key))
        answer = _send_listener_hello(host, broker.send_port, context)
        assert isinstance(answer, dict) and answer["broker"] == broker.name


def test_etcd_answers_only_callers_with_a_client_certificate(
    cluster: ClusterServer, pki: Pki
) -> None:
    endpoints = parse_coordinator(cluster.etcd.url)
    request = ("/kv/range", {"key": "AA=="})
    with pytest.raises(CoordinatorUnavailable):  # plain HTTP to a TLS port
        call_sync(endpoints, *request, timeout=3, tls=etcd_tls.PLAIN)
    no_certificate = etcd_tls.EtcdTls(EtcdTlsConfig(ca=pki.etcd_ca.bundle))
    with pytest.raises(CoordinatorUnavailable):
        call_sync(endpoints, *request, timeout=3, tls=no_certificate)
    client_tls = etcd_tls.EtcdTls(
        EtcdTlsConfig(pki.etcd_ca.bundle, pki.etcd_client.cert, pki.etcd_client.key)
    )
    assert "header" in call_sync(endpoints, *request, timeout=5, tls=client_tls)

    async def watched() -> bytes:
        async with EtcdClient.from_url(cluster.etcd.url, tls=client_tls) as client:
            _, revision = await client.get_prefix("/tls-test/")
            await client.put("/tls-test/k", b"v")
            async for batch in client.watch_prefix("/tls-test/", revision + 1):
                if batch.events:
                    return batch.events[0].kv.value
        raise AssertionError("the watch ended")

    assert asyncio.run(watched()) == b"v"


def _served_certificate(address: str, pki: Pki, *, alpn: bool = True) -> str:
    """The common name in the certificate the broker at ``address`` serves now."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(pki.internal_ca.bundle))
    context.load_cert_chain(str(pki.peer.cert), str(pki.peer.key))
    if alpn:  # gRPC's port; the send listener speaks no HTTP/2
        context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        subject = dict(item[0] for item in tls.getpeercert()["subject"])  # type: ignore[index]
    return str(subject["commonName"])


def test_a_broker_reloads_its_certificate_on_sighup(cluster: ClusterServer, pki: Pki) -> None:
    broker = cluster.brokers[0]
    send_address = f"{broker.address.rpartition(':')[0]}:{broker.send_port}"
    assert _served_certificate(broker.address, pki) == "halfmoon-peer"
    assert _served_certificate(send_address, pki, alpn=False) == "halfmoon-peer"
    renewed = pki.internal_ca.issue("halfmoon-peer-renewed")
    # Swap the files in place (as a certificate manager would), then SIGHUP.
    pki.peer.cert.write_bytes(renewed.cert.read_bytes())
    pki.peer.key.write_bytes(renewed.key.read_bytes())
    seen = len(broker.output)
    assert broker.process is not None
    broker.process.send_signal(signal.SIGHUP)
    wait_until(
        lambda: any("event=internal_tls_reloaded" in line for line in broker.output[seen:]),
        10,
        "the broker's reload",
    )
    assert _served_certificate(broker.address, pki) == "halfmoon-peer-renewed"
    assert _served_certificate(send_address, pki, alpn=False) == "halfmoon-peer-renewed"
    assert broker.process.poll() is None
    # The proxies' connections, opened before, still carry calls (a topic is created
    # through the brokers and listed).
    done = cli(cluster, pki, "topic", "create", f"after-reload-{int(time.time())}")
    assert done.returncode == 0, done.stderr


def test_a_proxy_reloads_its_certificates_on_sighup_and_keeps_serving(
    cluster: ClusterServer, pki: Pki
) -> None:
    proxy = cluster.proxies[1]
    seen = len(proxy.lines)
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGHUP)
    events = ("event=tls_reloaded", "event=etcd_tls_reloaded", "event=internal_tls_reloaded")
    wait_until(
        lambda: all(any(e in line for line in proxy.lines[seen:]) for e in events),
        10,
        "the proxy's reloads",
    )
    assert proxy.alive()
    done = cli(cluster, pki, "topic", "list")
    assert done.returncode == 0, done.stderr


def test_the_cli_reaches_etcd_over_tls_with_the_environment(
    cluster: ClusterServer, pki: Pki
) -> None:
    command = [sys.executable, "-m", "halfmoon", "cluster", "list", "--json",
               "--coordinator", cluster.etcd.url, "--cluster", cluster.cluster]  # fmt: skip
    plain = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_ETCD_")}
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, env=plain)
    assert refused.returncode != 0 and "etcd" in refused.stderr, refused.stderr
    secured = dict(
        plain,
        HALFMOON_ETCD_CA=str(pki.etcd_ca.bundle),
        HALFMOON_ETCD_CERT=str(pki.etcd_client.cert),
        HALFMOON_ETCD_KEY=str(pki.etcd_client.key),
    )
    listed = subprocess.run(command, capture_output=True, text=True, timeout=60, env=secured)
    assert listed.returncode == 0, listed.stderr
    assert all(broker.name in listed.stdout for broker in cluster.brokers), listed.stdout


node = node_client.node
scripts = node_client.scripts


def test_the_node_client_over_tls_through_a_secured_cluster(
    cluster: ClusterServer, pki: Pki, scripts: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = cli(cluster, pki, "topic", "create", "secured-node")
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(pki.edge_ca.bundle))
    spec = {
        "endpoints": cluster.proxies[1].address,
        "topic": "secured-node",
        "accessKey": ROOT[0],
        "accessSecret": ROOT[1],
        "messages": [{"body": "hello"}],
        "startupTimeoutMs": 10000,
        "sslEnabled": True,
    }
    run = scripts("produce.js", spec).finish(60)
    assert run.returncode == 0 and len(run.events("sent")) == 1, run.explain()
