"""``halfmoon transaction ...`` against a real admin API over a real broker.

Each command runs as a subprocess: tables for people, ``--json`` for
scripts, one line on stderr with the stable code when the broker refuses.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.transactions import decode_transaction_id
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import failed, halfmoon, ok, table, unique

CHECK_MAX = 15  # TransactionConfig's default


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    with AdminServer(tmp_path / "metadata") as server:
        yield server


def half_messages(
    admin: AdminServer, topic: str, count: int, group: str | None = None
) -> list[str]:
    """Send ``count`` half messages; their transaction ids."""
    admin.broker.create_topic(topic, MessageType.TRANSACTION, 2)
    results = admin.broker.send(
        [
            OutgoingMessage(topic=topic, body=f"b{i}".encode(), keys=[f"key-{i}"],
                            message_type=MessageType.TRANSACTION, transaction_group=group)
            for i in range(count)
        ]
    )  # fmt: skip
    return [r.transaction_id for r in results]


def admin_get(admin: AdminServer, path: str) -> dict:
    with urllib.request.urlopen(admin.url + path, timeout=10) as response:
        return json.load(response)


def visible(admin: AdminServer, topic: str) -> int:
    return sum(q.max_offset - q.min_offset for q in admin.broker.topic_status(topic))


def park(admin: AdminServer, transaction_id: str) -> None:
    """What the check service does to a transaction nobody answers for: count checks, park."""
    service = admin.broker.transactions
    half_offset = decode_transaction_id(transaction_id)
    for _ in range(CHECK_MAX):
        service.checks.record_check(service.pending[half_offset], service.clock.now_ms())
    assert service.checks.park(half_offset)


def test_list_commit_rollback_as_an_operator(admin):
    topic = unique("txn")
    first, second, third = half_messages(admin, topic, 3)

    rows = table(ok(halfmoon("transaction", "list", admin=admin)))
    assert rows[0][:3] == ["TOPIC", "MESSAGE", "ID"]
    assert [r[-1] for r in rows[1:]] == [first, second, third]  # oldest first, id last
    assert all(topic in r and "prepared" in r for r in rows[1:])
    listed = json.loads(
        ok(halfmoon("transaction", "list", "--json", "--topic", topic, admin=admin))
    )
    # The admin API's shape: scripts read the same object from either.
    api = admin_get(admin, f"/v1/transactions?topic={topic}")
    assert listed.keys() == api.keys() == {"transactions"}
    assert [t.keys() for t in listed["transactions"]] == [t.keys() for t in api["transactions"]]
    assert [t["transaction_id"] for t in listed["transactions"]] == [first, second, third]
    head = listed["transactions"][0]
    assert head["keys"] == ["key-0"] and head["checks_sent"] == 0 and head["state"] == "prepared"
    limited = json.loads(ok(halfmoon("transaction", "list", "--json", "--limit", "1", admin=admin)))
    assert [t["transaction_id"] for t in limited["transactions"]] == [first]

    assert (
        ok(halfmoon("transaction", "commit", first, admin=admin)).strip()
        == f"transaction {first} is committed"
    )
    assert visible(admin, topic) == 1
    answer = json.loads(ok(halfmoon("transaction", "rollback", second, "--json", admin=admin)))
    assert answer == {"transaction_id": second, "state": "rolled_back"}
    # The same decision again is a no-op; the opposite one is refused.
    ok(halfmoon("transaction", "commit", first, admin=admin))
    assert visible(admin, topic) == 1
    line = failed(halfmoon("transaction", "rollback", first, admin=admin))
    assert "already committed" in line and line.endswith("(TRANSACTION_ALREADY_ENDED)")
    line = failed(halfmoon("transaction", "commit", "T-not-an-id", admin=admin))
    assert line.endswith("(INVALID_TRANSACTION_ID)")

    assert [
        t["transaction_id"]
        for t in json.loads(ok(halfmoon("transaction", "list", "--json", admin=admin)))[
            "transactions"
        ]
    ] == [third]
    ok(halfmoon("transaction", "rollback", third, admin=admin))
    assert ok(halfmoon("transaction", "list", admin=admin)).strip() == "no pending transactions"


def test_parked_resume_and_operator_commit_of_a_parked_one(admin):
    topic = unique("txn-parked")
    first, second = half_messages(admin, topic, 2)
    assert ok(halfmoon("transaction", "parked", admin=admin)).strip() == "no parked transactions"
    park(admin, first)
    park(admin, second)

    rows = table(ok(halfmoon("transaction", "parked", admin=admin)))
    assert [r[-1] for r in rows[1:]] == [first, second]
    assert all("parked" in r and str(CHECK_MAX) in r for r in rows[1:])

    resumed = json.loads(ok(halfmoon("transaction", "resume", first, "--json", admin=admin)))
    assert (resumed["transaction_id"], resumed["state"], resumed["checks_sent"]) == (
        first,
        "prepared",
        0,
    )
    assert [
        t["transaction_id"]
        for t in json.loads(ok(halfmoon("transaction", "parked", "--json", admin=admin)))[
            "transactions"
        ]
    ] == [second]
    # Only a parked transaction can be resumed.
    line = failed(halfmoon("transaction", "resume", first, admin=admin))
    assert line.endswith("(ILLEGAL_TRANSACTION_TRANSITION)")

    ok(halfmoon("transaction", "commit", second, admin=admin))
    assert visible(admin, topic) == 1
    assert ok(halfmoon("transaction", "parked", admin=admin)).strip() == "no parked transactions"


def test_group_commit_decides_every_member(admin):
    topic = unique("txn-group")
    members = half_messages(admin, topic, 3, group="g-42")
    # A member is decided with its group, not alone.
    line = failed(halfmoon("transaction", "commit", members[0], admin=admin))
    assert line.endswith("(TRANSACTION_GROUP_MEMBER)")
    out = ok(halfmoon("transaction", "group-commit", "g-42", admin=admin)).strip()
    assert out == "transaction group g-42 is committed (3 members decided now)"
    assert visible(admin, topic) == 3
    assert "0 members" in ok(halfmoon("transaction", "group-commit", "g-42", admin=admin))
    line = failed(halfmoon("transaction", "group-rollback", "g-42", admin=admin))
    assert line.endswith("(TRANSACTION_ALREADY_ENDED)")
