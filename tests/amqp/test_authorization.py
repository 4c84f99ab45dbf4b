"""AMQP with authentication on: PLAIN/AMQPLAIN against halfmoon's users, and RabbitMQ's
configure / write / read mapped onto ACL actions (docs/security.md), as a table."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pika
import pika.credentials
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.server.conftest import ServerProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
BOB = ("bob", "bob-secret-key")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("amqp-auth"),
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "server.amqp_listen=127.0.0.1:0",
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    try:
        made = server.admin_call(
            "POST", "/v1/users", {"access_key": BOB[0], "secret_key": BOB[1], "user_type": "Normal"}
        )
        assert made[0] == 201, made
        grants = [
            {"resource": "Topic:bob_*", "actions": ["Create", "Pub", "Sub"]},
            {"resource": "Group:bob_*", "actions": ["Sub"]},
        ]
        acl = server.admin_call("POST", "/v1/acls", {"subject": "User:bob", "policies": grants})
        assert acl[0] == 201, acl
        yield server
    finally:
        if server.alive():
            server.stop()


def connect(server: ServerProcess, user: tuple[str, str]) -> pika.BlockingConnection:
    host, port = server.amqp_address.rsplit(":", 1)
    credentials = pika.credentials.PlainCredentials(*user)
    return pika.BlockingConnection(
        pika.ConnectionParameters(host, int(port), "/", credentials, connection_attempts=1)
    )


def test_wrong_password_is_refused_and_a_right_one_is_let_in(secured: ServerProcess) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError, match="ACCESS_REFUSED"):
        connect(secured, (BOB[0], "wrong"))
    with pytest.raises(pika.exceptions.AMQPConnectionError, match="ACCESS_REFUSED"):
        connect(secured, ("nobody", "x"))
    connect(secured, BOB).close()
    # Each refusal is audited (the server's output is read by another thread: poll).
    wait_until(
        lambda: any(
            "access_denied" in line and "unauthenticated" in line for line in secured.lines
        ),
        10,
        "the refused logins' audit lines",
    )


@pytest.fixture(scope="module")
def root_queue(secured: ServerProcess) -> str:
    conn = connect(secured, ROOT)
    ch = conn.channel()
    ch.queue_declare("root_q")
    ch.basic_publish("", "root_q", b"root's")
    conn.close()
    return "root_q"


Action = Callable[[BlockingChannel], object]
CASES: list[tuple[str, Action, bool]] = [
    ("declare own queue", lambda ch: ch.queue_declare("bob_q"), True),
    ("declare another's queue", lambda ch: ch.queue_declare("alice_q"), False),
    ("declare an exchange", lambda ch: ch.exchange_declare("bob_x", "direct"), False),
    ("publish to own queue", lambda ch: ch.basic_publish("", "bob_q", b"x"), True),
    ("publish to another's queue", lambda ch: ch.basic_publish("", "root_q", b"x"), False),
    ("get from own queue", lambda ch: ch.basic_get("bob_q", auto_ack=True), True),
    ("get from another's queue", lambda ch: ch.basic_get("root_q", auto_ack=True), False),
    ("consume another's queue", lambda ch: ch.basic_consume("root_q", lambda *a: None), False),
]


@pytest.mark.parametrize(("what", "action", "allowed"), CASES, ids=[c[0] for c in CASES])
def test_bob_gets_what_his_acl_grants(
    secured: ServerProcess, root_queue: str, what: str, action: Action, allowed: bool
) -> None:
    conn = connect(secured, BOB)
    try:
        ch = conn.channel()
        ch.confirm_delivery()  # a refused publish shows at once, not on the next call
        if allowed:
            ch.queue_declare("bob_q")
            action(ch)
            ch.queue_declare("bob_q", passive=True)
        else:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                action(ch)
                ch.queue_declare("bob_q", passive=True)
            assert info.value.reply_code == 403, info.value
            assert conn.is_open
    finally:
        if conn.is_open:
            conn.close()


def test_root_may_do_everything(secured: ServerProcess, root_queue: str) -> None:
    conn = connect(secured, ROOT)
    try:
        ch = conn.channel()
        ch.exchange_declare("root_x", "fanout")
        ch.queue_bind(root_queue, "root_x")
        ch.basic_publish("root_x", "", b"fanned")
        bodies = set()
        for _ in range(2):
            method, _, body = ch.basic_get(root_queue, auto_ack=True)
            assert method is not None
            bodies.add(body)
        assert bodies == {b"root's", b"fanned"}
    finally:
        conn.close()
