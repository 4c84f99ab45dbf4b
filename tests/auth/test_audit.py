"""The audit log: one line per denial, fields that cannot be forged, no secrets."""

from __future__ import annotations

import ast
import base64
import logging
import re

import pytest

from halfmoon.auth import Guard, Need, Unauthenticated, topic
from halfmoon.auth.config import AuthConfig
from halfmoon.auth.errors import Forbidden
from halfmoon.auth.guard import audit_field
from halfmoon.auth.sealing import SecretBox
from halfmoon.auth.store import AuthStore


@pytest.fixture
def guard(tmp_path) -> Guard:
    store = AuthStore(tmp_path / "users.json", SecretBox.from_file(tmp_path / "key"))
    store.create_user("alice", "alice-secret-key")
    return Guard(AuthConfig(enabled=True), store)


# key=value, the value bare or a Python string literal (as audit_field and ascii() write it)
FIELD = re.compile(r"""(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s'"]+)(?: |$)""")


def fields(line: str) -> dict[str, str]:
    """The audit line's fields; fails unless the whole line is key=value fields."""
    found = list(FIELD.finditer(line))
    assert "".join(m.group(0) for m in found) == line, line
    return {
        m.group(1): ast.literal_eval(m.group(2)) if m.group(2)[0] in "'\"" else m.group(2)
        for m in found
    }


def denials(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "halfmoon.audit"]


@pytest.mark.parametrize(
    "access_key",
    [
        "evil\nevent=access_granted user=root",
        "mallory user=root",
        "quote'\"=",
        "\u00e9\u202e\x00",
    ],
)
def test_a_forged_access_key_stays_one_quoted_field(
    guard: Guard, caplog: pytest.LogCaptureFixture, access_key: str
) -> None:
    header = "Basic " + base64.b64encode(f"{access_key}:some-secret".encode()).decode()
    with caplog.at_level(logging.WARNING, "halfmoon.audit"), pytest.raises(Unauthenticated):
        guard.authenticate_http(header, "10.0.0.7", "GET /v1/topics")
    (line,) = denials(caplog)
    assert "\n" not in line and line.isascii() and line.isprintable()
    assert fields(line) == {
        "event": "access_denied",
        "reason": "unauthenticated",
        "user": access_key,
        "peer": "10.0.0.7",
        "operation": "GET /v1/topics",
        "detail": "unknown or disabled user",
    }
    assert "some-secret" not in line


def test_a_plain_denial_reads_as_documented(guard: Guard, caplog: pytest.LogCaptureFixture) -> None:
    alice = guard.store.user("alice")
    assert alice is not None
    with caplog.at_level(logging.WARNING, "halfmoon.audit"), pytest.raises(Forbidden):
        guard.authorize(alice, [Need.of(topic("payments"), "Pub")], "10.0.0.7", "SendMessage")
    assert denials(caplog) == [
        "event=access_denied reason=forbidden user=alice peer=10.0.0.7 "
        "operation=SendMessage detail='Pub on Topic:payments'"
    ]
    assert "alice-secret-key" not in caplog.text


@pytest.mark.parametrize(
    "value, shown",
    [
        ("", "-"),
        ("orders-service", "orders-service"),
        ("ipv6:[::1]:5000", "ipv6:[::1]:5000"),
        ("a b", "'a b'"),
        ("x" * 129, ascii("x" * 129)),
    ],
)
def test_audit_field(value: str, shown: str) -> None:
    assert audit_field(value) == shown
