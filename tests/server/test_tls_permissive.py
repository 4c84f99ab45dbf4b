"""``tls.mode=permissive``: plaintext and TLS clients on one gRPC port and one admin port.

One ``halfmoon serve`` with authentication on and a certificate the test
makes. Clients reach it directly (source 127.0.0.1) or through a relay whose
connections come from 127.0.0.2, so source-IP rules and the audit log can
show which address the broker believed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.client import Credentials, Message, Producer
from halfmoon.errors import HalfmoonError
from tests.server.conftest import ROOT, ServerProcess, wait_until
from tests.server.source_relay import SourceRelay

pytest.importorskip("cryptography")
from tests.server.certificates import CertificateAuthority, Issued  # noqa: E402

pytestmark = pytest.mark.slow

SUPER = ("root", "root-secret-key")
ALICE = ("alice", "alice-secret-key")  # may Pub on perm-* from 127.0.0.2 only

OFFICIAL_CLIENT = textwrap.dedent(
    """
    import sys
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    endpoint, topic, tls, ak, sk = sys.argv[1:6]
    config = ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=5)
    producer = Producer(config, tls_enable=tls == "tls")
    producer.startup()
    msg = Message()
    msg.topic = topic
    msg.body = b"one port, two ways"
    print(producer.send(msg).message_id)
    producer.shutdown()
    """
)


@dataclass
class Permissive:
    server: ServerProcess
    ca: CertificateAuthority
    issued: Issued


@pytest.fixture(scope="module")
def permissive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Permissive]:
    directory = tmp_path_factory.mktemp("halfmoon-permissive")
    ca = CertificateAuthority(directory)
    issued = ca.issue("server")
    server = ServerProcess(
        directory / "data",
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "broker.auto_create_topics=true",
            "tls.mode=permissive",
            f"tls.cert={issued.cert}",
            f"tls.key={issued.key}",
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": SUPER[1]},
        credentials=SUPER,
    ).start()
    try:
        # admin_call speaks plain HTTP: the admin port is permissive as well.
        user = {"access_key": ALICE[0], "secret_key": ALICE[1]}
        assert server.admin_call("POST", "/v1/users", user)[0] == 201
        policies = [{"resource": "Topic:perm-*", "actions": ["Pub"], "source_ips": ["127.0.0.2"]}]
        acl = {"subject": "User:alice", "policies": policies}
        assert server.admin_call("POST", "/v1/acls", acl)[0] == 201
        yield Permissive(server, ca, issued)
    finally:
        assert server.stop() == 0, server.log_tail()


def send(endpoint: str, topic: str, user: tuple[str, str], ca: Path | None) -> str:
    """One message with halfmoon's client, over TLS when ``ca`` is given."""
    options: dict[str, object] = {"credentials": Credentials(*user)}
    if ca is not None:
        options.update(tls=True, tls_root_certificates=str(ca))

    async def go() -> str:
        async with Producer(endpoint, request_timeout=5, **options) as producer:  # type: ignore[arg-type]
            return (await producer.send(Message(topic, b"hello"))).message_id

    return asyncio.run(asyncio.wait_for(go(), 60))


def denials(server: ServerProcess, since: int) -> list[str]:
    return [line for line in server.lines[since:] if "event=access_denied" in line]


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_official_python_client_both_ways_on_one_port(permissive: Permissive, tls: bool) -> None:
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(permissive.ca.bundle), "PATH": "/usr/bin:/bin"}
    args = [permissive.server.grpc, "perm-official", "tls" if tls else "plain", *SUPER]
    done = subprocess.run(
        [sys.executable, "-c", OFFICIAL_CLIENT, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]


def test_source_ip_rules_see_the_real_client(permissive: Permissive) -> None:
    server, ca = permissive.server, permissive.ca.bundle
    relay = SourceRelay(("127.0.0.1", server.grpc_port))
    try:
        # From 127.0.0.2 alice may Pub, over TLS and in plaintext alike: the broker saw
        # 127.0.0.2 although gRPC itself was reached from the front's loopback relay.
        assert send(relay.address, "perm-ip", ALICE, ca)
        assert send(relay.address, "perm-ip", ALICE, None)
        seen = len(server.lines)
        with pytest.raises(HalfmoonError, match="Pub on Topic:other"):
            send(relay.address, "other", ALICE, ca)
        wait_until(lambda: denials(server, seen), 10, "the audit line")
        assert "peer=127.0.0.2" in denials(server, seen)[0]
    finally:
        relay.close()
    # From 127.0.0.1 the same request is refused, and the audit log says where it came from.
    for ca_or_plain in (ca, None):
        seen = len(server.lines)
        with pytest.raises(HalfmoonError, match="Pub on Topic:perm-ip"):
            send(server.grpc, "perm-ip", ALICE, ca_or_plain)
        wait_until(lambda seen=seen: denials(server, seen), 10, "the audit line")
        assert "peer=127.0.0.1 " in denials(server, seen)[0], denials(server, seen)


def _get(url: str, context: ssl.SSLContext | None = None, token: str = "") -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"authorization": token} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_admin_api_over_http_and_https_on_one_port(permissive: Permissive) -> None:
    server = permissive.server
    https = server.admin.replace("http://", "https://")
    context = ssl.create_default_context(cafile=str(permissive.ca.bundle))
    token = "Bearer " + ":".join(SUPER)
    for base, ctx in ((server.admin, None), (https, context)):
        assert _get(base + "/healthz", ctx)[0] == 200
        code, body = _get(base + "/v1/topics", ctx, token)
        assert code == 200, body
        assert _get(base + "/v1/topics", ctx)[0] == 401
    # A client that does not trust the certificate gets no answer over HTTPS.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(https + "/healthz", timeout=10, context=ssl.create_default_context())
    # The admin API sees its clients' own addresses too.
    _, admin_port = server.admin.rsplit(":", 1)
    relay = SourceRelay(("127.0.0.1", int(admin_port)))
    try:
        seen = len(server.lines)
        assert _get(f"https://127.0.0.1:{relay.port}/v1/topics", context)[0] == 401
        wait_until(lambda: denials(server, seen), 10, "the audit line")
        assert "peer=127.0.0.2" in denials(server, seen)[0]
    finally:
        relay.close()


def test_odd_connections_leave_the_port_serving(permissive: Permissive) -> None:
    server = permissive.server
    host, port = "127.0.0.1", server.grpc_port
    _, admin_port = server.admin.rsplit(":", 1)
    openings = [
        b"",  # connect and close
        b"hello, not HTTP/2\r\n",  # plaintext garbage: gRPC's HTTP/2 refuses it
        b"\x16\x03\x01\x00\x05hello",  # a TLS record that is no ClientHello
        b"\x16",  # half a record, then close
    ]
    for target in (port, int(admin_port)):
        for opening in openings:
            with socket.create_connection((host, target), timeout=10) as sock:
                if opening:
                    sock.sendall(opening)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(10)
                while sock.recv(4096):  # the server ends the connection
                    pass
    assert send(server.grpc, "perm-after", SUPER, permissive.ca.bundle)
    assert send(server.grpc, "perm-after", SUPER, None)
    assert server.alive()


def test_certificate_reload_on_sighup(permissive: Permissive, tmp_path: Path) -> None:
    server, old_roots = permissive.server, permissive.ca.bundle.read_bytes()
    open_channel = grpc.secure_channel(server.grpc, grpc.ssl_channel_credentials(old_roots))
    grpc.channel_ready_future(open_channel).result(timeout=10)
    new_ca = CertificateAuthority(tmp_path)
    fresh = new_ca.issue("server")
    permissive.issued.cert.write_bytes(fresh.cert.read_bytes())
    permissive.issued.key.write_bytes(fresh.key.read_bytes())
    seen = len(server.lines)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: any("event=tls_reloaded" in line for line in server.lines[seen:]), 10, "reload"
    )
    # The open TLS connection (relayed by the front) still carries calls.
    stub = service_pb2_grpc.MessagingServiceStub(open_channel)
    answer = stub.QueryRoute(svc.QueryRouteRequest(topic=pb.Resource(name="perm-r")), timeout=5)
    assert answer.HasField("status")
    open_channel.close()
    # New TLS handshakes get the new certificate; plaintext is untouched.
    with (
        grpc.secure_channel(server.grpc, grpc.ssl_channel_credentials(old_roots)) as old,
        pytest.raises(grpc.FutureTimeoutError),
    ):
        grpc.channel_ready_future(old).result(timeout=3)
    assert send(server.grpc, "perm-reloaded", SUPER, new_ca.bundle)
    assert send(server.grpc, "perm-reloaded", SUPER, None)
    # The admin API's HTTPS too.
    context = ssl.create_default_context(cafile=str(new_ca.bundle))
    https = server.admin.replace("http://", "https://")
    assert json.loads(_get(https + "/healthz", context)[1]) == {"status": "ok"}
    # Put the module's certificate back for the tests that follow.
    original = permissive.ca.issue("server")
    assert original.cert == permissive.issued.cert
    seen = len(server.lines)
    server.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: any("event=tls_reloaded" in line for line in server.lines[seen:]), 10, "reload"
    )


def test_metrics_count_tls_and_plaintext_connections(permissive: Permissive) -> None:
    server = permissive.server
    send(server.grpc, "perm-counted", SUPER, permissive.ca.bundle)
    send(server.grpc, "perm-counted", SUPER, None)
    code, text = _get(server.admin + "/metrics", token="Bearer " + ":".join(SUPER))
    assert code == 200, text
    counts = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("halfmoon_permissive_connections_total{")
    }
    for labels in (
        'listener="grpc",transport="tls"',
        'listener="grpc",transport="plaintext"',
        'listener="admin",transport="plaintext"',
    ):
        assert counts.get(labels, 0) >= 1, counts
