"""The two servers a client suite runs against: RabbitMQ (the reference) and halfmoon."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from halfmoon.config import ServerConfig
from tests.server.certificates import CertificateAuthority
from tests.server.conftest import ServerProcess

RABBITMQ_URL_ENV = "HALFMOON_TEST_AMQP"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
IN_CI = os.environ.get("CI", "").lower() == "true"


def rabbitmq_url() -> str:
    return os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL


def rabbitmq_address() -> tuple[str, int]:
    parts = urlsplit(rabbitmq_url())
    return parts.hostname or "127.0.0.1", parts.port or 5672


def require_rabbitmq() -> None:
    """Skip without RabbitMQ (fail under CI=true): the reference decides what is required."""
    try:
        socket.create_connection(rabbitmq_address(), timeout=3).close()
    except OSError as exc:
        reason = f"RabbitMQ is not reachable at {rabbitmq_url()} ({exc})"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)


def halfmoon_speaks_amqp() -> bool:
    """Whether this halfmoon has an AMQP listener to configure (``server.amqp_listen``)."""
    return any(f.name == "amqp_listen" for f in dataclasses.fields(ServerConfig))


def require_halfmoon_amqp() -> None:
    if not halfmoon_speaks_amqp():
        pytest.skip("halfmoon has no AMQP listener yet (server.amqp_listen, docs/amqp.md)")


@dataclasses.dataclass
class AmqpServer:
    url: str
    tls_port: int | None = None


def server_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate and key for halfmoon's TLS run, from a CA made in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    issued = CertificateAuthority(directory).issue("server")
    return issued.cert, issued.key


@contextlib.contextmanager
def halfmoon_amqp(
    data_dir: Path, *, tls: tuple[Path, Path] | None = None, tls_mode: str = "enforcing"
) -> Iterator[AmqpServer]:
    """``halfmoon serve`` with its AMQP listener on a loopback port of its own (port 0).

    With ``tls`` (certificate, key) the server runs ``tls.mode=enforcing``: the AMQP
    listener then speaks AMQPS on the same port, as the gRPC listener does TLS.
    ``tls_mode="permissive"``: AMQP and AMQPS both on that port (for a suite that also
    dials the plain port while it tests TLS).
    """
    settings: tuple[str, ...] = ()
    if tls is not None:
        cert, key = tls
        settings = (f"tls.mode={tls_mode}", f"tls.cert={cert}", f"tls.key={key}")
    server = ServerProcess(
        data_dir, settings=settings, env={"HALFMOON_SERVER_AMQP_LISTEN": "127.0.0.1:0"}
    )
    server.start()
    try:
        address = server.amqp_address  # the port the listener got, from the ready line
        assert address, server.log_tail()
        tls_port = int(address.rsplit(":", 1)[1]) if tls else None
        yield AmqpServer(f"amqp://guest:guest@{address}/", tls_port)
    finally:
        server.stop()
