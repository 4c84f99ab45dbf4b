"""Authentication, ACLs and TLS with the official Node.js client (uppercase-hex signatures).

The scripts and fixtures are test_official_node_client's; the server is one
of this module's own (authentication on; one run with TLS as well).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server import test_official_node_client as node_client
from tests.server.conftest import ServerProcess

node = node_client.node
scripts = node_client.scripts

pytestmark = pytest.mark.slow

ROOT_USER = ("root", "root-secret-key")
NODE_USER = ("nodeuser", "node-secret-key")


def _start(directory: Path, *settings: str) -> ServerProcess:
    server = ServerProcess(
        directory,
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root", *settings),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT_USER[1]},
        credentials=ROOT_USER,
    ).start()
    user = {"access_key": NODE_USER[0], "secret_key": NODE_USER[1]}
    assert server.admin_call("POST", "/v1/users", user)[0] == 201
    policies = [{"resource": "Topic:node-ok*", "actions": ["Pub"]},
                {"resource": "Topic:node-ro*", "actions": ["Sub"]}]  # fmt: skip
    acl = {"subject": "User:nodeuser", "policies": policies}
    assert server.admin_call("POST", "/v1/acls", acl)[0] == 201
    for topic in ("node-ok", "node-ro"):
        server.create_topic(topic)
    return server


@pytest.fixture(scope="module")
def server(node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = _start(tmp_path_factory.mktemp("halfmoon-auth-node"))
    try:
        yield proc
    finally:
        proc.stop()


def _send(scripts: Any, server: ServerProcess, topic: str, ak: str, sk: str, **extra: Any):
    spec = {
        "endpoints": server.grpc,
        "topic": topic,
        "accessKey": ak,
        "accessSecret": sk,
        "messages": [{"body": "hello"}],
        "startupTimeoutMs": 10000,
        **extra,
    }
    return scripts("produce.js", spec).finish(60)


def test_allowed_send_with_credentials(server: ServerProcess, scripts: Any) -> None:
    run = _send(scripts, server, "node-ok", *NODE_USER)
    assert run.returncode == 0 and len(run.events("sent")) == 1, run.explain()


def test_send_without_pub_is_forbidden(server: ServerProcess, scripts: Any) -> None:
    run = _send(scripts, server, "node-ro", *NODE_USER)
    errors = run.events("send_error")
    assert run.returncode != 0 and errors, run.explain()
    assert "Pub on Topic:node-ro" in errors[0]["error"], run.explain()


@pytest.mark.parametrize(
    "ak, sk", [(NODE_USER[0], "wrong-secret-key"), ("nobody", "nobody-secret-key")]
)
def test_bad_credentials_are_refused(server: ServerProcess, scripts: Any, ak: str, sk: str) -> None:
    seen = len(server.lines)
    run = _send(scripts, server, "node-ok", ak, sk)
    assert run.returncode != 0 and not run.events("sent"), run.explain()
    denials = [line for line in server.lines[seen:] if "event=access_denied" in line]
    assert denials and "reason=unauthenticated" in denials[0]
    assert sk not in "\n".join(server.lines)


def test_node_client_over_tls_with_credentials(
    node: str, scripts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cryptography")
    from tests.server.certificates import CertificateAuthority  # needs cryptography

    ca = CertificateAuthority(tmp_path)
    issued = ca.issue("server")
    proc = ServerProcess(
        tmp_path / "data",
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "broker.auto_create_topics=true",  # the admin API is HTTPS here: no create call
            "tls.mode=enforcing",
            f"tls.cert={issued.cert}",
            f"tls.key={issued.key}",
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT_USER[1]},
    ).start()
    try:
        monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(ca.bundle))
        run = _send(scripts, proc, "node-tls", *ROOT_USER, sslEnabled=True)
        assert run.returncode == 0 and len(run.events("sent")) == 1, run.explain()
    finally:
        proc.stop()
