"""Authentication, ACLs and TLS with the official Node.js client (uppercase-hex signatures).

The scripts and fixtures are test_official_node_client's; the server is one
of this module's own (authentication on, quick transaction checks; runs with
TLS, enforcing and permissive, as well).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server import test_official_node_client as node_client
from tests.server.conftest import ServerProcess, audit_denials, wait_until

node = node_client.node
scripts = node_client.scripts

pytestmark = pytest.mark.slow

ROOT_USER = ("root", "root-secret-key")
NODE_USER = ("nodeuser", "node-secret-key")
READER = ("nodereader", "reader-secret-key")  # Sub on node-*, Pub nowhere
DISABLED = ("nodeoff", "nodeoff-secret-key")  # granted Pub on node-ok*, but disabled
CHECK_MAX = 3
QUICK_CHECKS = (
    "transaction.timeout_ms=400ms",
    "transaction.check_interval_ms=250ms",
    f"transaction.check_max={CHECK_MAX}",
)


def _start(
    directory: Path, *settings: str, kind: type[ServerProcess] = ServerProcess
) -> ServerProcess:
    """A server of ``kind`` (tests/cluster runs these scenarios through a cluster too)."""
    server = kind(
        directory,
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root", *settings),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT_USER[1]},
        credentials=ROOT_USER,
    ).start()
    for ak, sk in (NODE_USER, READER, DISABLED):
        user = {"access_key": ak, "secret_key": sk, "enabled": ak != DISABLED[0]}
        assert server.admin_call("POST", "/v1/users", user)[0] == 201
    grants = {
        "nodeuser": [{"resource": "Topic:node-ok*", "actions": ["Pub"]},
                     {"resource": "Topic:node-ro*", "actions": ["Sub"]},
                     {"resource": "Group:node-group*", "actions": ["Sub"]}],
        "nodereader": [{"resource": "Topic:node-*", "actions": ["Sub"]},
                       {"resource": "Group:node-*", "actions": ["Sub"]}],
        "nodeoff": [{"resource": "Topic:node-ok*", "actions": ["Pub"]}],
    }  # fmt: skip
    for subject, policies in grants.items():
        acl = {"subject": f"User:{subject}", "policies": policies}
        assert server.admin_call("POST", "/v1/acls", acl)[0] == 201
    for topic in ("node-ok", "node-ro"):
        server.create_topic(topic)
    server.create_topic("node-ok-txn", "transaction")
    return server


@pytest.fixture(scope="module")
def server(node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = _start(tmp_path_factory.mktemp("halfmoon-auth-node"), *QUICK_CHECKS)
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
    "ak, sk",
    [(NODE_USER[0], "wrong-secret-key"), ("nobody", "nobody-secret-key"), DISABLED],
    ids=["wrong-secret", "unknown-user", "disabled-user"],
)
def test_bad_credentials_are_refused(server: ServerProcess, scripts: Any, ak: str, sk: str) -> None:
    seen = len(server.lines)
    run = _send(scripts, server, "node-ok", ak, sk)
    assert run.returncode != 0 and not run.events("sent"), run.explain()
    denials = audit_denials(server.lines, seen)
    assert denials and "reason=unauthenticated" in denials[0]
    assert sk not in "\n".join(server.lines)


@pytest.mark.parametrize("skew", [3600, -600, 90], ids=["hour-ahead", "ten-min-behind", "90s"])
def test_a_skewed_clock_is_refused_beyond_the_window(
    server: ServerProcess, scripts: Any, skew: int
) -> None:
    seen = len(server.lines)
    run = _send(scripts, server, "node-ok", *NODE_USER, clockSkewSeconds=skew)
    if abs(skew) <= 300:  # auth.signature_window: a clock a little off still works
        assert run.returncode == 0 and len(run.events("sent")) == 1, run.explain()
        return
    assert run.returncode != 0 and not run.events("sent"), run.explain()
    denials = audit_denials(server.lines, seen)
    assert denials and all("reason=unauthenticated" in d for d in denials), denials
    assert "detail='stale signature'" in denials[0], denials


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


def _receive(scripts: Any, server: ServerProcess, topic: str, user: tuple[str, str], **extra: Any):
    spec = {
        "endpoints": server.grpc,
        "topic": topic,
        "group": "node-group-1",
        "accessKey": user[0],
        "accessSecret": user[1],
        "expect": 1,
        "deadlineMs": 6000,
        "awaitDurationMs": 500,
        **extra,
    }
    return scripts("simple_consume.js", spec).finish(60)


def test_receive_without_sub_is_forbidden(server: ServerProcess, scripts: Any) -> None:
    # The same consumer receives where it may Sub (node-ro) ...
    sent = _send(scripts, server, "node-ro", *ROOT_USER)
    assert sent.returncode == 0, sent.explain()
    allowed = _receive(scripts, server, "node-ro", NODE_USER)
    assert allowed.returncode == 0 and not allowed.events("receive_error"), allowed.explain()
    (record,) = [r for r in allowed.events("received") if r["action"] == "ack"]
    assert record["messageId"] == sent.events("sent")[0]["messageId"]
    # ... and is refused where it may only Pub (node-ok): FORBIDDEN reaches the client.
    seen = len(server.lines)
    denied = _receive(scripts, server, "node-ok", NODE_USER, deadlineMs=3000)
    errors = denied.events("receive_error")
    assert denied.returncode != 0 and errors and not denied.events("received"), denied.explain()
    assert "ForbiddenException" in errors[0]["error"], denied.explain()
    assert "Sub on Topic:node-ok" in errors[0]["error"], denied.explain()
    audit = audit_denials(server.lines, seen)
    assert audit and "reason=forbidden user=nodeuser" in audit[0], audit


def test_transaction_checks_go_to_the_producer_allowed_to_pub(
    server: ServerProcess, scripts: Any
) -> None:
    topic = "node-ok-txn"
    # A producer that declares the topic but may not Pub on it (Sub only), open first ...
    outsider = scripts(
        "transaction_produce.js",
        {"endpoints": server.grpc, "topic": topic, "messages": [], "deadlineMs": 40000,
         "accessKey": READER[0], "accessSecret": READER[1]},
    )  # fmt: skip
    outsider.wait_for(lambda rs: any(r["event"] == "waiting" for r in rs), 30, "outsider up")
    # ... then the allowed one, with one transaction its checker commits and one it never
    # decides (checked CHECK_MAX times, then parked): enough checks to reach both.
    plan = [
        {"body": "decided-by-check", "end": "none", "check": "commit"},
        {"body": "never-decided", "end": "none", "check": "unknown"},
    ]
    insider = scripts(
        "transaction_produce.js",
        {"endpoints": server.grpc, "topic": topic, "messages": plan, "deadlineMs": 40000,
         "accessKey": NODE_USER[0], "accessSecret": NODE_USER[1]},
    )  # fmt: skip
    insider.wait_for(lambda rs: any(r["event"] == "waiting" for r in rs), 30, "insider sent")
    sent = insider.so_far()
    assert not sent.events("send_error"), sent.explain()
    ids = [r["messageId"] for r in sent.events("sent")]

    def settled() -> bool:
        code, body = server.admin_call("GET", f"/v1/transactions?topic={topic}")
        assert code == 200, body
        left = [(t["message_id"], t["state"]) for t in body["transactions"]]  # type: ignore[index]
        return left == [(ids[1], "parked")]

    wait_until(settled, 40, "the check to commit one transaction and park the other")
    insider.kill()
    outsider.kill()
    checked = [r["body"] for r in insider.so_far().events("checked")]
    assert checked.count("decided-by-check") == 1, checked
    assert checked.count("never-decided") == CHECK_MAX, checked
    assert outsider.so_far().events("checked") == [], outsider.so_far().explain()
    # The committed one is delivered (EndTransaction of the check answer was signed too).
    run = _receive(scripts, server, topic, READER, group="node-txn-readers")
    bodies = [r["bodyBase64"] for r in run.events("received")]
    assert run.returncode == 0 and len(bodies) == 1, run.explain()
    assert NODE_USER[1] not in "\n".join(server.lines)


def test_node_client_both_ways_on_a_permissive_port(
    node: str, scripts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cryptography")
    from tests.server.certificates import CertificateAuthority  # needs cryptography

    ca = CertificateAuthority(tmp_path)
    issued = ca.issue("server")
    proc = _start(
        tmp_path / "data",
        "tls.mode=permissive",
        f"tls.cert={issued.cert}",
        f"tls.key={issued.key}",
    )  # the admin API answers plain HTTP too: _start's admin calls work unchanged
    try:
        monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(ca.bundle))
        for ssl_enabled in (True, False):
            run = _send(scripts, proc, "node-ok", *NODE_USER, sslEnabled=ssl_enabled)
            assert run.returncode == 0 and len(run.events("sent")) == 1, run.explain()
        denied = _send(scripts, proc, "node-ro", *NODE_USER, sslEnabled=True)
        assert denied.returncode != 0 and denied.events("send_error"), denied.explain()
    finally:
        assert proc.stop() == 0
