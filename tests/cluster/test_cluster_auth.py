"""Authentication and ACLs in cluster mode: etcd, two brokers, two proxies, real clients.

Users and ACLs are made through one proxy and used through the other (they
live in etcd, which every proxy watches). The official Python client signs
its requests as it would against Apache RocketMQ; raw gRPC calls measure how
fast an ACL change reaches the other proxy.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.exception import ForbiddenException

from halfmoon.auth import signature
from tests.cluster.cluster_server import ClusterProxy, ClusterServer
from tests.server.conftest import audit_denials, unique
from tests.server.test_transactions_official_python import (
    CHECK_MAX,
    TRANSACTION_SETTINGS,
    UNKNOWN,
    StatusChecker,
)

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
ALICE = ("alice", "alice-secret-key")
MALLORY = ("mallory", "mallory-secret-key")
PROPAGATION_BOUND_S = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    directory = tmp_path_factory.mktemp("cluster-auth")
    key = directory / "auth.key"  # the one key every proxy unseals the secrets with
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    server = ClusterServer(
        directory,
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            f"auth.key_file={key}",
            *TRANSACTION_SETTINGS,
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    try:
        yield server
    finally:
        server.stop()


def proxy(cluster: ClusterServer, index: int) -> ClusterProxy:
    return cluster.proxies[index]


def config(p: ClusterProxy, ak: str, sk: str) -> ClientConfiguration:
    return ClientConfiguration(p.address, Credentials(ak, sk), request_timeout=5)


def message(topic: str, body: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    return msg


def make_user(p: ClusterProxy, user: tuple[str, str], *policies: dict) -> None:
    code, body = p.admin_call("POST", "/v1/users", {"access_key": user[0], "secret_key": user[1]})
    assert code == 201, body
    if policies:
        acl = {"subject": f"User:{user[0]}", "policies": list(policies)}
        code, body = p.admin_call("POST", "/v1/acls", acl)
        assert code == 201, body


@pytest.fixture(scope="module")
def users(cluster: ClusterServer) -> None:
    # Made through proxy B; the tests use them through proxy A.
    make_user(
        proxy(cluster, 1),
        ALICE,
        {"resource": "Topic:allowed-*", "actions": ["Pub", "Sub"]},
        {"resource": "Topic:readonly-*", "actions": ["Sub"]},
        {"resource": "Group:alice-*", "actions": ["Sub"]},
        {"resource": "Topic:txn-*", "actions": ["Pub"]},
    )
    make_user(proxy(cluster, 1), MALLORY, {"resource": "Topic:txn-*", "actions": ["Sub"]})


def test_a_user_made_through_one_proxy_sends_and_receives_through_the_other(
    cluster: ClusterServer, users: None
) -> None:
    topic, group = unique("allowed"), unique("alice")
    cluster.create_topic(topic)
    cluster.create_group(group)
    producer = Producer(config(proxy(cluster, 0), *ALICE))
    producer.startup()
    try:
        receipt = producer.send(message(topic, "hello"))
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(
        config(proxy(cluster, 0), *ALICE), group, {topic: FilterExpression()}, await_duration=2
    )
    consumer.startup()
    try:
        deadline = time.monotonic() + 20
        got: list = []
        while not got and time.monotonic() < deadline:
            got = consumer.receive(8, 15)
        assert [m.message_id for m in got] == [receipt.message_id]
        consumer.ack(got[0])
    finally:
        consumer.shutdown()


def test_denied_send_and_receive_through_a_proxy(cluster: ClusterServer, users: None) -> None:
    topic, group = unique("readonly"), unique("other-group")
    cluster.create_topic(topic)
    cluster.create_group(group)
    producer = Producer(config(proxy(cluster, 0), *ALICE))
    producer.startup()
    try:
        with pytest.raises(ForbiddenException, match=f"Pub on Topic:{topic}"):
            producer.send(message(topic, "nope"))
    finally:
        producer.shutdown()
    with pytest.raises(ForbiddenException, match=f"Sub on Group:{group}"):
        consumer = SimpleConsumer(
            config(proxy(cluster, 0), *ALICE), group, {topic: FilterExpression()}, await_duration=1
        )
        consumer.startup()
        try:
            consumer.receive(1, 15)
        finally:
            consumer.shutdown()
    denials = audit_denials(cluster.lines, containing=topic)
    assert denials and "reason=forbidden" in denials[0] and "user=alice" in denials[0]
    assert ALICE[1] not in "\n".join(cluster.lines + proxy(cluster, 1).lines)


def _signed(p: ClusterProxy, ak: str, sk: str) -> list[tuple[str, str]]:
    stamp = signature.utc_stamp()
    return [
        ("x-mq-date-time", stamp),
        ("authorization", signature.authorization_header(ak, sk, stamp)),
    ]


def _send(p: ClusterProxy, topic: str, ak: str, sk: str) -> pb.Status:
    with grpc.insecure_channel(p.address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = svc.SendMessageRequest(
            messages=[
                pb.Message(
                    topic=pb.Resource(name=topic),
                    body=b"x",
                    system_properties=pb.SystemProperties(
                        message_id=secrets.token_hex(8).upper(),
                        body_encoding=pb.Encoding.IDENTITY,
                        message_type=pb.MessageType.NORMAL,
                    ),
                )
            ]
        )
        return stub.SendMessage(request, metadata=_signed(p, ak, sk), timeout=5).status


def _wait_for_code(p: ClusterProxy, topic: str, user: tuple[str, str], code: int) -> float:
    started = time.monotonic()
    while True:
        status = _send(p, topic, *user)
        if status.code == code:
            return time.monotonic() - started
        assert time.monotonic() - started < PROPAGATION_BOUND_S, status
        time.sleep(0.01)


def test_an_acl_change_through_one_proxy_applies_on_the_other_within_a_second(
    cluster: ClusterServer, users: None
) -> None:
    user = ("dave", "dave-secret-key")
    topic = unique("dave")
    cluster.create_topic(topic)
    make_user(proxy(cluster, 1), user)
    _wait_for_code(proxy(cluster, 0), topic, user, pb.Code.FORBIDDEN)  # known, not allowed
    acl = {"subject": "User:dave", "policies": [{"resource": f"Topic:{topic}", "actions": ["Pub"]}]}
    assert proxy(cluster, 1).admin_call("POST", "/v1/acls", acl)[0] == 201
    granted = _wait_for_code(proxy(cluster, 0), topic, user, pb.Code.OK)
    deny = {"policies": [{"resource": f"Topic:{topic}", "actions": ["Pub"], "decision": "Deny"}]}
    assert proxy(cluster, 1).admin_call("PATCH", "/v1/acls/User:dave", deny)[0] == 200
    revoked = _wait_for_code(proxy(cluster, 0), topic, user, pb.Code.FORBIDDEN)
    code, _ = proxy(cluster, 0).admin_call("PATCH", "/v1/users/dave", {"enabled": False})
    assert code == 200  # and the other way round: through A, seen on B
    disabled = _wait_for_code(proxy(cluster, 1), topic, user, pb.Code.UNAUTHORIZED)
    print(
        f"propagation: grant {granted * 1000:.0f} ms, revoke {revoked * 1000:.0f} ms, "
        f"disable {disabled * 1000:.0f} ms"
    )


def test_wrong_secret_is_unauthorized_on_every_proxy(cluster: ClusterServer, users: None) -> None:
    topic = unique("allowed")
    cluster.create_topic(topic)
    for index in (0, 1):
        status = _send(proxy(cluster, index), topic, ALICE[0], "wrong-secret-key")
        assert status.code == pb.Code.UNAUTHORIZED and "secret key" in status.message


def test_the_admin_api_and_the_cli_on_every_proxy(cluster: ClusterServer, users: None) -> None:
    anonymous = ClusterProxy(Path("/nonexistent"), cluster.etcd, cluster.cluster)
    anonymous.admin_port = proxy(cluster, 1).admin_port
    assert anonymous.admin_call("GET", "/v1/topics")[0] == 401
    made = proxy(cluster, 0).cli("user", "create", "erin", "--user-secret", "erin-secret-key")
    assert made.returncode == 0, made.stderr
    listed = proxy(cluster, 1).cli("user", "list", "--json")
    assert listed.returncode == 0 and "erin" in listed.stdout, listed.stderr
    assert "erin-secret-key" not in listed.stdout
    reader = ClusterProxy(Path("/nonexistent"), cluster.etcd, cluster.cluster, credentials=ALICE)
    reader.admin_port = proxy(cluster, 1).admin_port
    assert reader.admin_call("GET", "/v1/users")[0] == 403  # users are for super users


class Recording(StatusChecker):
    """Answers ``answer`` to every check (and counts them, as StatusChecker does)."""

    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer

    def check(self, message: Message):  # type: ignore[no-untyped-def]
        super().check(message)
        return self.answer


def test_transaction_checks_go_only_to_producers_allowed_to_pub(
    cluster: ClusterServer, users: None
) -> None:
    from rocketmq import TransactionResolution

    topic = unique("txn")
    cluster.create_topic(topic, "transaction")
    # Mallory may Sub on the topic, not Pub: her producer declares the topic on the same
    # proxy as alice's, yet must never be asked about alice's transactions (a check carries
    # the message). Checks are taken round robin, so without the filter she would be.
    spy = Recording(TransactionResolution.COMMIT)
    asker = Recording(UNKNOWN)
    mallory = Producer(config(proxy(cluster, 0), *MALLORY), topics=(topic,), checker=spy)
    alice = Producer(config(proxy(cluster, 0), *ALICE), topics=(topic,), checker=asker)
    mallory.startup()
    try:
        alice.startup()
        try:
            for i in range(2):
                alice.send(message(topic, f"undecided {i}"), alice.begin_transaction())
            deadline = time.monotonic() + 30
            with asker.changed:
                while sum(asker.asked.values()) < 2 * CHECK_MAX:
                    assert time.monotonic() < deadline, (asker.asked, spy.asked)
                    asker.changed.wait(0.5)
            assert not spy.asked, "a producer without Pub on the topic was asked a check"
        finally:
            alice.shutdown()
    finally:
        mallory.shutdown()


def _root_half(p: ClusterProxy, topic: str, **properties: str) -> svc.SendResultEntry:
    with grpc.insecure_channel(p.address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        message = pb.Message(
            topic=pb.Resource(name=topic),
            body=b"payment",
            system_properties=pb.SystemProperties(
                message_id=secrets.token_hex(8).upper(),
                body_encoding=pb.Encoding.IDENTITY,
                message_type=pb.MessageType.TRANSACTION,
            ),
        )
        message.user_properties.update(properties)
        answer = stub.SendMessage(
            svc.SendMessageRequest(messages=[message]), metadata=_signed(p, *ROOT), timeout=5
        )
        assert answer.status.code == pb.Code.OK, answer.status
        return answer.entries[0]


def _end(p: ClusterProxy, user: tuple[str, str], topic: str, tid: str) -> pb.Status:
    with grpc.insecure_channel(p.address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            transaction_id=tid,
            resolution=pb.TransactionResolution.COMMIT,
        )
        return stub.EndTransaction(request, metadata=_signed(p, *user), timeout=5).status


def test_a_decision_through_a_proxy_needs_the_right_on_what_it_decides(
    cluster: ClusterServer, users: None
) -> None:
    """The same permission rules behind a proxy: alice may Pub on txn-*, not on payments."""
    payments, own = unique("payments-tx"), unique("txn-own")
    cluster.create_topic(payments, "transaction")
    cluster.create_topic(own, "transaction")
    group = unique("batch")
    _root_half(proxy(cluster, 1), payments, __HM_TXN_GROUP=group)
    single = _root_half(proxy(cluster, 1), payments)
    through = proxy(cluster, 0)
    # A group decision needs Pub on Cluster, whichever topic the request names.
    refused = _end(through, ALICE, own, f"hm-group:{group}")
    assert refused.code == pb.Code.FORBIDDEN and "Pub on Cluster" in refused.message, refused
    # Another topic's transaction, named with her own topic: as if it did not exist.
    unknown = _end(through, ALICE, own, single.transaction_id)
    assert unknown.code == pb.Code.INVALID_TRANSACTION_ID, unknown
    assert payments not in unknown.message and single.message_id not in unknown.message
    code, body = through.admin_call("GET", f"/v1/transactions?topic={payments}")
    assert code == 200, body
    members = [t for t in body["transactions"] if t["transaction_group"] == group]  # type: ignore[index]
    assert [t["state"] for t in members] == ["prepared"], body
