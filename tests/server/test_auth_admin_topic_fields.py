"""Admin routes whose path names a group and whose body or query names a topic.

``reset-offset``, ``purge`` and ``clone-offset`` move a group's offsets in the
topic their body names, and ``progress?topic=`` reads them; each answer shows
that topic's queues and offsets (a purge counts its backlog). The edge check
sees only the group in the path, so the topic is checked once the handler has
read it. Through a real server with authentication on: Eve may manage her own
groups (``Group:eve-*``) and consume her own topics (``Topic:eve-*``); the
victim's topic holds messages she has no right to. Each row is refused naming
only the topic she asked for, exactly as for a topic that does not exist, and
her group's offsets in the victim's topic are untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
EVE = ("eve", "eve-secret-key")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-auth-admin-topics"),
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root"),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    code, body = proc.admin_call("POST", "/v1/users", {"access_key": EVE[0], "secret_key": EVE[1]})
    assert code == 201, body
    policies = [
        {"resource": "Topic:eve-*", "actions": ["Pub", "Sub"]},
        {"resource": "Group:eve-*", "actions": ["Sub", "Get", "Update"]},
    ]
    code, body = proc.admin_call("POST", "/v1/acls", {"subject": "User:eve", "policies": policies})
    assert code == 201, body
    for name in ("eve-plain", "vic-plain"):
        proc.create_topic(name, "normal", queues=2)
        for i in range(3):
            code, body = proc.admin_call("POST", f"/v1/topics/{name}/messages", {"body": f"m{i}"})
            assert code == 201, body
    for name in ("eve-g", "eve-g2"):
        proc.create_group(name)
    try:
        yield proc
    finally:
        if proc.alive():
            assert proc.stop() == 0, proc.log_tail()


def as_eve(server: ServerProcess, method: str, path: str, body: dict | None) -> tuple[int, object]:
    eve = copy.copy(server)
    eve.credentials = EVE
    return eve.admin_call(method, path, body)


# (method, path, body) with TOPIC where the request names its topic.
ROWS = {
    "reset-offset": (
        "POST",
        "/v1/groups/eve-g/reset-offset",
        {"topic": "TOPIC", "timestamp_ms": 0},
    ),
    "purge": ("POST", "/v1/groups/eve-g/purge", {"topic": "TOPIC"}),
    "clone-offset": ("POST", "/v1/groups/eve-g/clone-offset", {"to": "eve-g2", "topic": "TOPIC"}),
    "progress": ("GET", "/v1/groups/eve-g/progress?topic=TOPIC", None),
}


def request_for(row: str, topic: str) -> tuple[str, str, dict | None]:
    method, path, body = ROWS[row]
    named = {k: (topic if v == "TOPIC" else v) for k, v in body.items()} if body else None
    return method, path.replace("TOPIC", topic), named


def offsets_in(server: ServerProcess, group: str, topic: str) -> list[object]:
    code, body = server.admin_call("GET", f"/v1/groups/{group}/progress?topic={topic}")
    assert code == 200, body
    return [(q["queue_id"], q["committed_offset"]) for q in body["queues"]]  # type: ignore[index]


@pytest.mark.parametrize("row", sorted(ROWS))
def test_a_topic_in_the_body_or_query_needs_a_right_on_it(server: ServerProcess, row: str) -> None:
    code, answer = as_eve(server, *request_for(row, "eve-plain"))
    assert code == 200, (row, answer)  # her own topic: the row's other fields pass
    before = {g: offsets_in(server, g, "vic-plain") for g in ("eve-g", "eve-g2")}
    code, answer = as_eve(server, *request_for(row, "vic-plain"))
    assert code == 403, (row, code, answer)
    error = answer["error"]  # type: ignore[index]
    assert error["code"] == "FORBIDDEN" and "Topic:vic-plain" in error["message"], answer
    # Refused alike whether the topic exists: the answer tells nothing about it.
    code, missing = as_eve(server, *request_for(row, "vic-missing"))
    assert code == 403, (row, code, missing)
    assert missing["error"]["message"].replace("vic-missing", "vic-plain") == error["message"]  # type: ignore[index]
    assert {g: offsets_in(server, g, "vic-plain") for g in ("eve-g", "eve-g2")} == before


def test_without_a_topic_only_her_topics_are_shown_and_cloned(server: ServerProcess) -> None:
    # An administrator gave her group progress in the victim's topic (and in hers): a clone or
    # a progress listing that names no topic must not reach into the victim's.
    for name in ("eve-plain", "vic-plain"):
        body = {"topic": name, "timestamp_ms": 0}
        code, answer = server.admin_call("POST", "/v1/groups/eve-g/reset-offset", body)
        assert code == 200, answer
    assert offsets_in(server, "eve-g", "vic-plain"), "the victim's topic holds none of her offsets"
    before = offsets_in(server, "eve-g2", "vic-plain")

    code, answer = as_eve(server, "GET", "/v1/groups/eve-g/progress", None)
    assert code == 200, answer
    shown = {q["topic"] for q in answer["queues"]}  # type: ignore[index]
    assert shown == {"eve-plain"}, shown

    body = {"to": "eve-g2"}
    code, answer = as_eve(server, "POST", "/v1/groups/eve-g/clone-offset", body)
    assert code == 200, answer
    assert {q["topic"] for q in answer["queues"]} == {"eve-plain"}, answer  # type: ignore[index]
    assert offsets_in(server, "eve-g2", "vic-plain") == before
    # The administrator's own listing still has both.
    code, answer = server.admin_call("GET", "/v1/groups/eve-g/progress")
    assert {q["topic"] for q in answer["queues"]} == {"eve-plain", "vic-plain"}  # type: ignore[index]
