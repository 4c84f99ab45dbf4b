"""Definitions export and import (``/v1/definitions``, ``halfmoon definitions``), on real servers.

One server's topics, groups, users and policies go to a second server through the CLI;
the second's export then says the same. A second import changes nothing. A document
with one bad entry among good ones changes nothing at all, and says which entry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

SUPER = ("root", "root-secret-key")
SECURED = ("auth.enabled=true", "auth.bootstrap_access_key=root")


def secured(path: Path) -> ServerProcess:
    return ServerProcess(
        path, settings=SECURED, env={"HALFMOON_BOOTSTRAP_SECRET_KEY": SUPER[1]}, credentials=SUPER
    ).start()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    source, target = secured(tmp_path / "source"), secured(tmp_path / "target")
    try:
        yield source, target
    finally:
        for proc in (source, target):
            if proc.alive():
                proc.stop()


def ok(server: ServerProcess, method: str, path: str, body: dict | None = None) -> dict:
    code, answer = server.admin_call(method, path, body)
    assert code in (200, 201), (method, path, code, answer)
    return answer  # type: ignore[return-value]


def shape(server: ServerProcess) -> dict:
    """The export without what differs between two servers by nature."""
    document = ok(server, "GET", "/v1/definitions")
    return {k: v for k, v in document.items() if k not in ("exported_ms", "broker")}


def populate(server: ServerProcess) -> None:
    server.create_topic("orders", "transaction", queues=3)
    ok(server, "POST", "/v1/topics", {"name": "audit", "queue_count": 2, "perm": "r"})
    ok(server, "PATCH", "/v1/topics/audit", {"trace": False})
    server.create_group("billing", max_delivery_attempts=5, fifo=True)
    retry = {"kind": "exponential", "initial_ms": 500, "max_ms": 60000, "multiplier": 3}
    ok(server, "POST", "/v1/groups", {"name": "shipping", "retry_policy": retry})
    ok(server, "POST", "/v1/users", {"access_key": "app", "secret_key": "app-secret-key"})
    policies = [{"resource": "Topic:orders", "actions": ["Pub", "Sub"]}]
    ok(server, "POST", "/v1/acls", {"subject": "User:app", "policies": policies})


def test_cli_export_then_import_copies_every_definition_once(servers, tmp_path: Path) -> None:
    source, target = servers
    populate(source)
    exported = tmp_path / "definitions.json"
    done = source.cli("definitions", "export", str(exported))
    assert done.returncode == 0, done.stderr
    assert "2 topics, 2 groups, 2 users, 1 acls" in done.stdout, done.stdout
    assert exported.stat().st_mode & 0o077 == 0  # it holds secret keys
    document = json.loads(exported.read_text())
    assert [t["name"] for t in document["topics"]] == ["audit", "orders"]  # no system topics

    done = target.cli("definitions", "import", str(exported), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["applied"] is True
    assert sorted(answer["created"]["topics"]) == ["audit", "orders"]
    assert answer["created"]["users"] == ["app"] and answer["unchanged"]["users"] == ["root"]
    assert shape(target) == shape(source)
    # The imported user signs in with the exported secret key.
    target.credentials = ("app", "app-secret-key")
    assert target.admin_call("GET", "/v1/whoami")[1]["authenticated"] is True  # type: ignore[index]
    target.credentials = SUPER

    again = json.loads(target.cli("definitions", "import", str(exported), "--json").stdout)
    assert all(not names for names in again["created"].values()), again
    assert all(not names for names in again["updated"].values()), again
    assert shape(target) == shape(source)


def test_a_bad_document_changes_nothing(servers) -> None:
    source, target = servers
    populate(target)
    before = shape(target)
    good = ok(target, "GET", "/v1/definitions")
    cases = {
        "a group's bad setting": {"groups": [{"name": "new-group", "max_delivery_attempts": 0}]},
        "a topic changing its type": {"topics": [{"name": "orders", "message_type": "normal"}]},
        "a policy for nobody": {"acls": [{"subject": "User:ghost", "policies": [{
            "resource": "Topic:orders", "actions": ["Pub"]}]}]},
        "no super user left": {"users": [{"access_key": "root", "enabled": False}]},
        "an unknown field": {"topics": [{"name": "extra", "colour": "blue"}]},
    }  # fmt: skip
    for why, bad in cases.items():
        document = {
            **good,
            # Good new entries first: they must not be applied either.
            "topics": [*good["topics"], {"name": "brand-new", "queue_count": 1}],
            "users": [*good["users"], {"access_key": "newcomer", "secret_key": "newcomer-key"}],
        }
        for kind, entries in bad.items():
            document[kind] = [*document[kind], *entries]
        code, answer = target.admin_call("POST", "/v1/definitions", document)
        assert code == 400, (why, code, answer)
        assert answer["error"]["code"] == "INVALID_DEFINITIONS", (why, answer)  # type: ignore[index]
        assert shape(target) == before, f"{why}: the document was partly applied"
    code, answer = target.admin_call("POST", "/v1/definitions", {"topics": []})
    assert code == 400 and "halfmoon_definitions" in answer["error"]["message"]  # type: ignore[index]
    done = target.cli("definitions", "import", "/nonexistent/definitions.json")
    assert done.returncode != 0 and "cannot read" in done.stderr, done.stderr
    del source


def test_dry_run_plans_without_applying(servers) -> None:
    source, target = servers
    populate(source)
    document = ok(source, "GET", "/v1/definitions")
    before = shape(target)
    answer = ok(target, "POST", "/v1/definitions?dry_run=true", document)
    assert answer["applied"] is False and sorted(answer["created"]["topics"]) == ["audit", "orders"]
    assert shape(target) == before
