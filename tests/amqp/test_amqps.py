"""AMQPS: with TLS on, the AMQP listener takes the gRPC listener's certificate (tls.*)."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.server.certificates import CertificateAuthority
from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow


def test_amqps_with_the_tls_settings_and_plain_amqp_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    issued = ca.issue("server")
    server = ServerProcess(
        tmp_path / "data",
        settings=(
            "tls.mode=enforcing",
            f"tls.cert={issued.cert}",
            f"tls.key={issued.key}",
            "server.amqp_listen=127.0.0.1:0",
        ),
    ).start()
    try:
        host, port = server.amqp_address.rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(ca.bundle))
        params = pika.ConnectionParameters(
            "localhost", int(port), ssl_options=pika.SSLOptions(context, "localhost")
        )
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare("secure")
        ch.basic_publish("", "secure", b"over amqps")
        method, _, body = ch.basic_get("secure", auto_ack=True)
        assert method is not None and body == b"over amqps"
        conn.close()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(
                pika.ConnectionParameters(host, int(port), connection_attempts=1, socket_timeout=5)
            )
        assert server.alive()
    finally:
        server.stop()


def test_permissive_serves_amqp_and_amqps_on_one_port(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    issued = ca.issue("server")
    server = ServerProcess(
        tmp_path / "data",
        settings=(
            "tls.mode=permissive",
            f"tls.cert={issued.cert}",
            f"tls.key={issued.key}",
            "server.amqp_listen=127.0.0.1:0",
        ),
    ).start()
    try:
        host, port = server.amqp_address.rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(ca.bundle))
        secure = pika.BlockingConnection(
            pika.ConnectionParameters(
                "localhost", int(port), ssl_options=pika.SSLOptions(context, "localhost")
            )
        )
        plain = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        try:
            # Each kind of client on the one port, the two seeing the same queue.
            assert secure._impl._transport._sock.version() is not None  # type: ignore[attr-defined]
            assert not isinstance(plain._impl._transport._sock, ssl.SSLSocket)  # type: ignore[attr-defined]
            over_tls = secure.channel()
            over_tls.queue_declare("both")
            over_tls.confirm_delivery()
            over_tls.basic_publish("", "both", b"over amqps", mandatory=True)
            in_clear = plain.channel()
            in_clear.confirm_delivery()
            in_clear.basic_publish("", "both", b"over amqp", mandatory=True)
            got = [in_clear.basic_get("both", auto_ack=True)[2] for _ in range(2)]
            assert got == [b"over amqps", b"over amqp"]
        finally:
            secure.close()
            plain.close()
        with urllib.request.urlopen(f"{server.admin}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        for transport in ("tls", "plaintext"):
            counted = f'listener="amqp",transport="{transport}"}} 1'
            assert f"halfmoon_permissive_connections_total{{{counted}" in text, text
        assert server.alive()
    finally:
        server.stop()
