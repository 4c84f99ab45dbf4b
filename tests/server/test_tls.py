"""TLS on the gRPC endpoint and the admin API, with certificates the test makes itself.

The official Python client trusts the system roots; ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``
points it at the test CA (in a subprocess, so this process's grpc is untouched).
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from tests.server.conftest import ROOT, ServerProcess, wait_until

pytest.importorskip("cryptography")
from tests.server.certificates import CertificateAuthority  # noqa: E402 - needs cryptography

pytestmark = pytest.mark.slow

CLIENT = textwrap.dedent(
    """
    import sys
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    producer = Producer(ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5),
                        tls_enable=True)
    producer.startup()
    msg = Message()
    msg.topic = sys.argv[2]
    msg.body = b"over tls"
    print(producer.send(msg).message_id)
    producer.shutdown()
    """
)


def _tls_server(tmp_path: Path, ca: CertificateAuthority, *extra: str) -> ServerProcess:
    issued = ca.issue("server")
    return ServerProcess(
        tmp_path / "data",
        settings=(
            "tls.mode=enforcing",
            f"tls.cert={issued.cert}",
            f"tls.key={issued.key}",
            *extra,
        ),
    )


def _admin(server: ServerProcess, ca: CertificateAuthority, path: str) -> dict:
    context = ssl.create_default_context(cafile=str(ca.bundle))
    url = server.admin.replace("http://", "https://") + path
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return json.loads(response.read())


def test_official_python_client_sends_over_tls(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    server = _tls_server(tmp_path, ca).start()
    try:
        created = _admin(server, ca, "/v1/status")
        assert created
        topic = "tls-topic"
        context = ssl.create_default_context(cafile=str(ca.bundle))
        request = urllib.request.Request(
            server.admin.replace("http://", "https://") + "/v1/topics",
            data=json.dumps({"name": topic}).encode(),
            method="POST",
            headers={"content-type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=10, context=context).close()
        env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca.bundle), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, server.grpc, topic],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip(), done.stderr[-3000:]
        # A plaintext client gets nowhere on an enforcing endpoint.
        with grpc.insecure_channel(server.grpc) as plain, pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(plain).result(timeout=2)
        # The plain-HTTP admin API is gone too.
        with pytest.raises(OSError):
            urllib.request.urlopen(server.admin + "/v1/status", timeout=5)
    finally:
        server.stop()


def test_certificate_reload_on_sighup_keeps_open_connections(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    server = _tls_server(tmp_path, ca).start()
    try:
        roots = ca.bundle.read_bytes()
        channel = grpc.secure_channel(server.grpc, grpc.ssl_channel_credentials(roots))
        grpc.channel_ready_future(channel).result(timeout=10)
        # A new certificate from a new CA replaces the old files; SIGHUP re-reads them.
        (tmp_path / "next").mkdir()
        new_ca = CertificateAuthority(tmp_path / "next")
        fresh = new_ca.issue("server")
        issued_cert = Path(
            next(s for s in server.settings if s.startswith("tls.cert=")).split("=", 1)[1]
        )
        issued_key = Path(
            next(s for s in server.settings if s.startswith("tls.key=")).split("=", 1)[1]
        )
        issued_cert.write_bytes(fresh.cert.read_bytes())
        issued_key.write_bytes(fresh.key.read_bytes())
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: any("event=tls_reloaded" in line for line in server.lines), 10, "reload")
        # The open connection still carries calls (it was not dropped by the reload).
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answer = stub.QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name="reload-topic")), timeout=5
        )
        assert answer.HasField("status")  # an answer, not a transport error
        # New connections see the new certificate: the old CA no longer verifies it.
        old_roots = grpc.ssl_channel_credentials(roots)
        with (
            grpc.secure_channel(server.grpc, old_roots) as old,
            pytest.raises(grpc.FutureTimeoutError),
        ):
            grpc.channel_ready_future(old).result(timeout=3)
        new_roots = new_ca.bundle.read_bytes()
        with grpc.secure_channel(server.grpc, grpc.ssl_channel_credentials(new_roots)) as new:
            grpc.channel_ready_future(new).result(timeout=10)
        channel.close()
    finally:
        server.stop()


def test_halfmoon_client_over_tls_with_its_own_roots(tmp_path: Path) -> None:
    import asyncio

    from halfmoon.client import Message, Producer

    ca = CertificateAuthority(tmp_path)
    server = _tls_server(tmp_path, ca, "broker.auto_create_topics=true").start()

    async def send() -> str:
        options = {"tls": True, "tls_root_certificates": str(ca.bundle)}
        async with Producer(server.grpc, request_timeout=5, **options) as producer:
            return (await producer.send(Message("tls-own", b"hello"))).message_id

    try:
        assert asyncio.run(asyncio.wait_for(send(), 60))
    finally:
        server.stop()
