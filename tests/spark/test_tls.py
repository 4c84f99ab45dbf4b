"""The Spark source and sink over TLS, with credentials, against real ``halfmoon serve``s.

One server with TLS (``enforcing``) and authentication on: a batch read, a
batch write through the exactly-once sink (whose driver also calls the
admin API over HTTPS with the same roots and credentials), and a read of
what it wrote. The plan and the logs carry neither the secret key nor any
certificate or key material: the ``tls*`` options are paths. A second
server asks for client certificates (mutual TLS): a read with
``tlsCertificateChain``/``tlsPrivateKey`` works, one without does not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from halfmoon.client import Credentials, Message, Producer
from halfmoon.spark.options import SparkOptionError, TlsOptions, source_options, tls_of
from halfmoon.spark.wire import Wire
from tests.server.conftest import ServerProcess

pytest.importorskip("cryptography")
from tests.server.certificates import CertificateAuthority, Issued  # noqa: E402

SUPER = ("root", "root-secret-key-for-spark")
MARKERS = "halfmoon-spark-commits"


@dataclass
class TlsServer:
    server: ServerProcess
    ca: CertificateAuthority
    client: Issued  # a client certificate the CA signed

    def admin(self, method: str, path: str, body: dict | None = None) -> object:
        url = self.server.admin.replace("http://", "https://") + path
        context = ssl.create_default_context(cafile=str(self.ca.bundle))
        if self.server.settings and any("client_ca" in s for s in self.server.settings):
            context.load_cert_chain(self.client.cert, self.client.key)
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={
                "content-type": "application/json",
                "authorization": "Bearer root:" + SUPER[1],
            },
        )
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return json.loads(answer.read() or b"null")

    def options(self, *, client_cert: bool = False) -> dict[str, str]:
        options = {
            "endpoint": self.server.grpc,
            "accessKey": SUPER[0],
            "secretKey": SUPER[1],
            "tlsRootCertificates": str(self.ca.bundle),
        }
        if client_cert:
            options.update(
                tlsCertificateChain=str(self.client.cert), tlsPrivateKey=str(self.client.key)
            )
        return options


def _start(directory: Path, *extra: str) -> TlsServer:
    ca = CertificateAuthority(directory)
    issued = ca.issue("server")
    client = ca.issue("spark-client", server=False)
    server = ServerProcess(
        directory / "data",
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "tls.mode=enforcing",
            f"tls.cert={issued.cert}",
            f"tls.key={issued.key}",
            *extra,
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": SUPER[1]},
    ).start()
    return TlsServer(server, ca, client)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    started = _start(tmp_path_factory.mktemp("halfmoon-spark-tls"))
    try:
        started.admin("POST", "/v1/topics", {"name": MARKERS, "message_type": "transaction",
                                             "queue_count": 1})  # fmt: skip
        yield started
    finally:
        started.server.stop()


def _read(spark, options: dict[str, str], topic: str):  # noqa: ANN001, ANN202
    reader = spark.read.format("halfmoon").option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_source_and_sink_over_tls_with_credentials(
    spark, tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="halfmoon")
    tls_server.admin("POST", "/v1/topics", {"name": "spark-tls-in", "queue_count": 2})
    tls_server.admin(
        "POST", "/v1/topics",
        {"name": "spark-tls-out", "message_type": "transaction", "queue_count": 2},
    )  # fmt: skip

    async def produce() -> None:
        async with Producer(
            tls_server.server.grpc,
            credentials=Credentials(*SUPER),
            tls=True,
            tls_root_certificates=str(tls_server.ca.bundle),
        ) as producer:
            await producer.send_batch(
                [Message("spark-tls-in", f"row-{i}".encode()) for i in range(20)]
            )

    asyncio.run(asyncio.wait_for(produce(), 60))
    options = tls_server.options()
    frame = _read(spark, options, "spark-tls-in")
    assert sorted(r.body.decode() for r in frame.collect()) == sorted(f"row-{i}" for i in range(20))
    plan = frame._jdf.queryExecution().toString()  # noqa: SLF001 - what explain() prints

    admin = tls_server.server.admin.replace("http://", "https://")
    writer = frame.selectExpr("body", "array(message_id) AS keys").write.format("halfmoon")
    for key, value in {**options, "topic": "spark-tls-out", "sinkId": "tls-copy",
                       "admin": admin}.items():  # fmt: skip
        writer = writer.option(key, value)
    writer.mode("append").save()
    copied = _read(spark, options, "spark-tls-out").collect()
    assert sorted(r.body.decode() for r in copied) == sorted(f"row-{i}" for i in range(20))

    # No secret and no key material in the plan, the connector's logs or the server's.
    key_material = [tls_server.client.key.read_text(), tls_server.ca.bundle.read_text()]
    for text in (plan, caplog.text, "\n".join(tls_server.server.lines)):
        assert SUPER[1] not in text
        assert not any(pem.strip() in text for pem in key_material)
        assert "PRIVATE KEY" not in text
    parsed = source_options({**options, "topic": "spark-tls-in"}, streaming=False)
    assert SUPER[1] not in repr(parsed)


def test_plaintext_connector_is_refused_by_a_tls_server(tls_server: TlsServer) -> None:
    from halfmoon.client.errors import ClientError

    options = tls_server.options()
    options["tls"] = "true"
    parsed = source_options({**options, "topic": MARKERS}, streaming=False)
    assert len(Wire(parsed.endpoint, parsed.credentials, tls=parsed.tls).queues(MARKERS)) == 1
    plain = Wire(parsed.endpoint, parsed.credentials, timeout=3)
    with pytest.raises(ClientError):
        plain.queues(MARKERS)


def test_mutual_tls_needs_the_client_certificate(spark, tmp_path: Path) -> None:
    started = _start(tmp_path, f"tls.client_ca={tmp_path / 'halfmoon-test-CA.pem'}")
    try:
        topic = {"name": "spark-mtls", "queue_count": 1, "message_type": "mixed"}
        started.admin("POST", "/v1/topics", topic)
        with_cert = started.options(client_cert=True)
        parsed = source_options({**with_cert, "topic": "spark-mtls"}, streaming=False)
        wire = Wire(parsed.endpoint, parsed.credentials, tls=parsed.tls)
        wire.send_halves([Message("spark-mtls", b"mutual")], "g-mtls")
        wire.end_group("g-mtls", "spark-mtls", commit=True)
        rows = _read(spark, with_cert, "spark-mtls").collect()
        assert [r.body for r in rows] == [b"mutual"]
        without = started.options()  # roots, no client certificate: the handshake fails
        with pytest.raises(Exception, match="(?i)unavailable|handshake|ssl|tls|connect"):
            _read(spark, {**without, "topic": "spark-mtls"}, "spark-mtls").collect()
    finally:
        started.server.stop()


def test_tls_options_parse_and_say_what_is_wrong(tmp_path: Path) -> None:
    assert tls_of({}) is None
    assert tls_of({"tls": "true"}) == TlsOptions()
    assert tls_of({"tlsrootcertificates": "/ca.pem"}) == TlsOptions("/ca.pem")  # implies tls
    both = {"tlsCertificateChain": "/c.pem", "tlsPrivateKey": "/c.key"}
    assert tls_of(both) == TlsOptions(None, "/c.pem", "/c.key")
    with pytest.raises(SparkOptionError, match="go together"):
        tls_of({"tlsPrivateKey": "/c.key"})
    with pytest.raises(SparkOptionError, match="contradicts option tlsRootCertificates"):
        tls_of({"tls": "false", "tlsRootCertificates": "/ca.pem"})
    missing = TlsOptions(str(tmp_path / "nowhere.pem"))
    with pytest.raises(SparkOptionError, match="tlsRootCertificates: cannot read .*nowhere.pem"):
        Wire("127.0.0.1:1", tls=missing).queues("x")
