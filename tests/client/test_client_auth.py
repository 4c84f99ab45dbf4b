"""halfmoon's own client with credentials against a broker with authentication on.

Also where the transaction check-back rule is tested end to end: a check is
sent only to producers whose user may Pub on the message's topic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from halfmoon.client import (
    Credentials,
    Forbidden,
    Message,
    Producer,
    TransactionProducer,
    TransactionResolution,
)
from halfmoon.client.errors import Unauthorized
from tests.client.conftest import ServerProcess, run, unique
from tests.waiting import until

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
ALICE = Credentials("alice", "alice-secret-key")
BOB = Credentials("bob", "bob-secret-key")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-client-auth"),
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "transaction.timeout_ms=200ms",
            "transaction.check_interval_ms=200ms",
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    for user in (ALICE, BOB):
        body = {"access_key": user.access_key, "secret_key": user.secret_key}
        assert proc.admin_call("POST", "/v1/users", body)[0] == 201
    grants = {
        "alice": [{"resource": "Topic:cl-*", "actions": ["Pub"]}],
        "bob": [{"resource": "Topic:cl-*", "actions": ["Sub"]}],
    }
    for user, policies in grants.items():
        acl = {"subject": f"User:{user}", "policies": policies}
        assert proc.admin_call("POST", "/v1/acls", acl)[0] == 201
    try:
        yield proc
    finally:
        proc.stop()


def test_signed_sends_are_authorized_per_topic(server: ServerProcess) -> None:
    allowed, other = unique("cl-ok"), unique("other")
    server.create_topic(allowed)
    server.create_topic(other)

    async def scenario() -> None:
        async with Producer(server.grpc, credentials=ALICE) as producer:
            receipt = await producer.send(Message(allowed, b"hello"))
            assert receipt.message_id
            with pytest.raises(Forbidden, match=f"Pub on Topic:{other}"):
                await producer.send(Message(other, b"nope"))
        wrong = Credentials("alice", "not-the-secret")
        with pytest.raises(Unauthorized):
            async with Producer(server.grpc, credentials=wrong, request_timeout=2) as producer:
                await producer.send(Message(allowed, b"nope"))

    run(scenario())
    assert "alice-secret-key" not in "\n".join(server.lines)
    assert "alice-secret-key" not in repr(ALICE)


class Checks:
    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        self.checked.append(message.message_id)
        return TransactionResolution.COMMIT


def test_transaction_checks_go_only_to_producers_allowed_to_pub(server: ServerProcess) -> None:
    topic, group = unique("cl-txn"), unique("pg")
    server.create_topic(topic, message_type="transaction")

    async def scenario() -> None:
        async with TransactionProducer(server.grpc, group, Checks(), credentials=ALICE) as first:
            sent = await first.send_message_in_transaction(
                Message(topic, b"orphan"), TransactionResolution.UNKNOWN
            )
        # bob publishes nothing but declares the topic and group; he may not Pub on it.
        outsider = Checks()
        async with TransactionProducer(
            server.grpc, group, outsider, credentials=BOB, topics=[topic]
        ):
            await asyncio.sleep(0)  # bob's stream is open before alice's new producer
            insider = Checks()
            async with TransactionProducer(
                server.grpc, group, insider, credentials=ALICE, topics=[topic]
            ):
                await until(lambda: insider.checked, 20, "a check at alice's producer")
            assert sent.receipt.message_id in insider.checked
            assert outsider.checked == []

    run(scenario())


def test_spark_wire_and_outbox_target_sign_their_requests(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halfmoon.outbox.targets import HalfmoonTarget
    from halfmoon.spark.options import source_options
    from halfmoon.spark.wire import Wire

    topic = unique("cl-spark")
    server.create_topic(topic)
    options = {
        "endpoint": server.grpc,
        "topic": topic,
        "accessKey": "bob",
        "secretKey": BOB.secret_key,
    }
    parsed = source_options(options, streaming=False)
    assert BOB.secret_key not in repr(parsed)  # Spark plans and logs show the options' repr
    assert len(Wire(parsed.endpoint, parsed.credentials).queues(topic)) == 4
    with pytest.raises(Unauthorized):
        Wire(server.grpc).queues(topic)
    # The outbox relay's target picks its credentials up from the environment.
    monkeypatch.setenv("HALFMOON_ACCESS_KEY", ALICE.access_key)
    monkeypatch.setenv("HALFMOON_SECRET_KEY", ALICE.secret_key)
    target = HalfmoonTarget(f"halfmoon://{server.grpc}")
    assert target._options["credentials"] == ALICE  # noqa: SLF001
    from halfmoon.outbox.outbox import OutboxRecord

    other = unique("other")
    server.create_topic(other)

    def record(n: int, to: str) -> OutboxRecord:
        return OutboxRecord(
            id=n, message_id=f"m-{n}", aggregate_type="order", aggregate_id=str(n), topic=to,
            routing_key="", keys=[], tag=None, message_group=None, headers={},
            payload=b"row", attempts=0, created_at=0,
        )  # fmt: skip

    try:
        sent, refused = target.publish([record(1, topic), record(2, other)])
    finally:
        target.close()
    assert sent is None  # alice may Pub on cl-*
    assert isinstance(refused, Forbidden) and f"Pub on Topic:{other}" in str(refused)
    assert ALICE.secret_key not in str(refused)


def test_the_transactional_sender_signs_with_its_producers_credentials(
    server: ServerProcess, tmp_path
) -> None:
    import time

    from sqlalchemy import create_engine

    from halfmoon.client import MessageSelector, SyncSimpleConsumer, SyncTransactionProducer
    from halfmoon.outbox.checker import TransactionLogChecker
    from halfmoon.outbox.txlog import TransactionalSender, TransactionLog

    topic, group = unique("cl-outbox"), unique("og")
    server.create_topic(topic, message_type="transaction")
    server.create_group(group)
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    log = TransactionLog(table_prefix="app_")
    log.metadata.create_all(engine)
    checker = TransactionLogChecker(engine, log, lock_timeout=2)
    for user, allowed in ((ALICE, True), (BOB, False)):  # bob may Sub on cl-*, not Pub
        with SyncTransactionProducer(
            server.grpc, unique("op"), checker, topics=[topic], credentials=user
        ) as producer:
            sender = TransactionalSender(producer, log)
            if allowed:
                with sender.transaction(engine) as tx:
                    tx.send(Message(topic, b"committed"))
                assert tx.outcome == "committed"
            else:
                refused = pytest.raises(Forbidden, match=f"Pub on Topic:{topic}")
                with refused, sender.transaction(engine) as tx:
                    tx.send(Message(topic, b"refused"))
                assert tx.outcome == "rolled_back"  # the database's side undone too
    root = Credentials(*ROOT)
    with SyncSimpleConsumer(
        server.grpc, group, {topic: MessageSelector.all()}, credentials=root
    ) as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while not got:
            assert time.monotonic() < deadline, "the committed message never arrived"
            got += [m.body for m in consumer.receive(8, 20, wait=0.5)]
    assert got == [b"committed"]
    assert ALICE.secret_key not in "\n".join(server.lines)
