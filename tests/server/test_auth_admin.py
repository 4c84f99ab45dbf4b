"""Every admin API route, from the OpenAPI document, without credentials, read-only and admin.

Table-driven from ``openapi_document()``: a route added to the API (and so to
the document, which test_admin checks) is covered here without a new test,
and cannot be left unprotected.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.server.admin_openapi import openapi_document
from tests.server.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.slow

SUPER = ("root", "root-secret-key")
READER = ("reader", "reader-secret-key")
OPEN = {
    ("get", "/healthz"),
    ("get", "/v1/whoami"),
    ("get", "/"),
    ("get", "/dashboard"),
    ("get", "/dashboard/"),
    ("get", "/dashboard/{file}"),
}
SUPER_ONLY = ("/v1/users", "/v1/acls", "/v1/definitions")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-auth-admin"),
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": SUPER[1]},
        credentials=SUPER,
    ).start()
    assert (
        proc.admin_call("POST", "/v1/users", {"access_key": READER[0], "secret_key": READER[1]})[0]
        == 201
    )
    policies = [{"resource": "Cluster", "actions": ["Get", "List"]}]
    assert (
        proc.admin_call("POST", "/v1/acls", {"subject": "User:reader", "policies": policies})[0]
        == 201
    )
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def operations() -> list[tuple[str, str]]:
    document = openapi_document()
    return [
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "post", "patch", "put", "delete")
    ]


def concrete(path: str) -> str:
    fixed = {"resolution": "commit", "file": "dashboard.js"}
    return re.sub(r"\{(\w+)\}", lambda m: fixed.get(m.group(1), "x-1"), path)


def call(server: ServerProcess, method: str, path: str, credentials) -> int:
    """The HTTP status of ``method path`` (an empty JSON body for writes)."""
    headers = {"content-type": "application/json"}
    if credentials is not None:
        headers["authorization"] = "Bearer " + ":".join(credentials)
    data = b"{}" if method in ("post", "patch", "put") else None
    request = urllib.request.Request(
        server.admin + concrete(path), data=data, method=method.upper(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("method, path", operations())
def test_route_protection(server: ServerProcess, method: str, path: str) -> None:
    anonymous = call(server, method, path, None)
    if (method, path) in OPEN:
        assert anonymous == 200
        return
    assert anonymous == 401, f"{method.upper()} {path} answered {anonymous} without credentials"
    assert call(server, method, path, ("root", "wrong-secret-key")) == 401
    reader = call(server, method, path, READER)
    if method == "get" and not path.startswith(SUPER_ONLY):
        assert reader not in (401, 403), f"read-only user refused GET {path}: {reader}"
    else:
        assert reader == 403, f"read-only user got {reader} for {method.upper()} {path}"
    admin = call(server, method, path, SUPER)
    assert admin not in (401, 403), f"super user refused {method.upper()} {path}: {admin}"


def test_unauthenticated_answer_asks_for_basic_credentials(server: ServerProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.admin + "/v1/topics", timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"].startswith("Basic")
    assert b"UNAUTHORIZED" in refused.value.read()


def test_bearer_and_basic_both_work(server: ServerProcess) -> None:
    for header in (
        "Basic " + base64.b64encode(b"reader:reader-secret-key").decode(),
        "Bearer reader:reader-secret-key",
    ):
        request = urllib.request.Request(
            server.admin + "/v1/status", headers={"authorization": header}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200


def _cli(server: ServerProcess, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *args, "--admin", server.admin],
        cwd=ROOT, capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip


def test_cli_user_and_acl_commands_and_no_secret_in_output(server: ServerProcess) -> None:
    done = server.cli("user", "create", "dave", "--user-secret", "dave-secret-key", "--json")
    assert done.returncode == 0, done.stderr
    assert "dave-secret-key" not in done.stdout
    listed = server.cli("user", "list", "--json")
    assert "dave" in listed.stdout and "secret" not in listed.stdout
    granted = server.cli(
        "acl", "create", "User:dave", "--resource", "Topic:d-*", "--actions", "Pub,Sub"
    )
    assert granted.returncode == 0, granted.stderr
    shown = server.cli("acl", "get", "User:dave", "--json")
    assert '"Topic:d-*"' in shown.stdout
    # updateAcl replaces the entry for that resource; listAcl shows it.
    changed = server.cli(
        "acl", "update", "User:dave", "--resource", "Topic:d-*", "--actions", "Sub"
    )
    assert changed.returncode == 0, changed.stderr
    listed_acls = json.loads(server.cli("acl", "list", "--subject", "User:dave", "--json").stdout)
    assert '"Pub"' not in json.dumps(listed_acls) and '"Sub"' in json.dumps(listed_acls)
    # updateUser: a new secret (from stdin) replaces the old one; --disabled locks dave out.
    rotated = subprocess.run(
        [sys.executable, "-m", "halfmoon", "user", "update", "dave", "--user-secret-stdin",
         "--admin", server.admin],
        input="dave-new-secret-key\n", cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, "HALFMOON_ACCESS_KEY": SUPER[0], "HALFMOON_SECRET_KEY": SUPER[1]},
    )  # fmt: skip
    assert rotated.returncode == 0, rotated.stderr
    assert "dave-new-secret-key" not in rotated.stdout + rotated.stderr
    assert call(server, "get", "/v1/topics", ("dave", "dave-secret-key")) == 401
    assert call(server, "get", "/v1/topics", ("dave", "dave-new-secret-key")) == 403
    off = server.cli("user", "update", "dave", "--disabled", "--json")
    assert off.returncode == 0 and json.loads(off.stdout)["enabled"] is False, off.stderr
    assert call(server, "get", "/v1/topics", ("dave", "dave-new-secret-key")) == 401
    assert server.cli("acl", "delete", "User:dave").returncode == 0
    assert server.cli("user", "delete", "dave").returncode == 0


def test_cli_without_credentials_is_refused_with_a_code(
    server: ServerProcess, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
    env["HALFMOON_CREDENTIALS_FILE"] = str(tmp_path / "absent")
    done = _cli(server, "topic", "list", env=env)
    assert done.returncode != 0
    assert "credentials file" in done.stderr  # named but missing


def test_credentials_file_must_be_private(server: ServerProcess, tmp_path: Path) -> None:
    path = tmp_path / "credentials"
    path.write_text('access_key = "reader"\nsecret_key = "reader-secret-key"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
    env["HALFMOON_CREDENTIALS_FILE"] = str(path)
    path.chmod(0o644)
    loose = _cli(server, "topic", "list", env=env)
    assert loose.returncode != 0 and "chmod 600" in loose.stderr
    path.chmod(0o600)
    private = _cli(server, "topic", "list", env=env)
    assert private.returncode == 0, private.stderr


def _as(server: ServerProcess, user, method: str, path: str, body=None) -> tuple[int, str]:
    headers = {"content-type": "application/json", "authorization": "Bearer " + ":".join(user)}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.admin + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_create_on_a_name_and_namespaces_are_authorized_by_the_stored_name(
    server: ServerProcess,
) -> None:
    bob = ("bob", "bob-secret-key")
    assert (
        server.admin_call("POST", "/v1/users", {"access_key": bob[0], "secret_key": bob[1]})[0]
        == 201
    )
    grants = [
        {"resource": "Topic:orders-*", "actions": ["Create", "Get", "Delete"]},
        {"resource": "Group:orders-*", "actions": ["Create"]},
    ]
    acl = {"subject": "User:bob", "policies": grants}
    assert server.admin_call("POST", "/v1/acls", acl)[0] == 201
    # ACL 2.0: Create on Topic:orders-* creates orders-…, not anything else.
    assert _as(server, bob, "POST", "/v1/topics", {"name": "orders-1"})[0] == 201
    assert _as(server, bob, "POST", "/v1/groups", {"name": "orders-readers"})[0] == 201
    code, answer = _as(server, bob, "POST", "/v1/topics", {"name": "payments-1"})
    assert code == 403 and "Create on Topic:payments-1" in answer, answer
    assert _as(server, bob, "POST", "/v1/groups", {"name": "payments"})[0] == 403
    # A namespace's topic is stored as ns1%orders-2: bob's Topic:orders-* does not reach it,
    # whether he names it with ?namespace= or not.
    made = server.admin_call("POST", "/v1/topics?namespace=ns1", {"name": "orders-2"})
    assert made[0] == 201, made
    for method in ("GET", "DELETE"):
        code, answer = _as(server, bob, method, "/v1/topics/orders-2?namespace=ns1")
        assert code == 403 and "Topic:ns1%orders-2" in answer, (method, answer)
    code, answer = _as(server, bob, "POST", "/v1/topics?namespace=ns1", {"name": "orders-3"})
    assert code == 403 and "Create on Topic:ns1%orders-3" in answer, answer
    assert server.admin_call("GET", "/v1/topics/ns1%25orders-2")[0] == 200  # still there
    assert _as(server, bob, "DELETE", "/v1/topics/orders-1")[0] == 200


def test_no_secret_in_metrics_config_or_listings(server: ServerProcess) -> None:
    # Refusals first, so that whatever counts or describes them has had its chance.
    assert call(server, "get", "/v1/topics", ("reader", "not-the-reader-secret")) == 401
    for path in ("/metrics", "/v1/config", "/v1/users", "/v1/acls", "/v1/status"):
        code, text = _as(server, SUPER, "GET", path)
        assert code == 200, (path, text)
        for secret in (SUPER[1], READER[1], "not-the-reader-secret"):
            assert secret not in text, f"{path} shows a secret key"
    assert not [line for line in server.lines if SUPER[1] in line or READER[1] in line]
