"""Authentication and ACLs against the official Python client, unchanged, signing its requests.

One ``halfmoon serve`` with ``auth.enabled`` and a bootstrap super user;
the tests create normal users and policies through the admin API, then use
the official client as an application would. Raw gRPC calls cover what the
client cannot be made to send (stale and replayed signatures).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionResolution,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc
from rocketmq.v5.exception import ForbiddenException

from halfmoon.auth import signature
from tests.server.conftest import ServerProcess, audit_denials, unique
from tests.server.test_transactions_official_python import TRANSACTION_SETTINGS, StatusChecker

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
ALICE = ("alice", "alice-secret-key")
MALLORY = ("mallory", "mallory-secret-key")  # Sub on allowed-*, Pub nowhere


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-auth"),
        settings=("auth.enabled=true", "auth.bootstrap_access_key=root", *TRANSACTION_SETTINGS),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    proc.admin_call("POST", "/v1/users", {"access_key": ALICE[0], "secret_key": ALICE[1]})
    proc.admin_call(
        "POST",
        "/v1/users",
        {"access_key": "carol", "secret_key": "carol-secret-key", "enabled": False},
    )
    policies = [
        {"resource": "Topic:allowed-*", "actions": ["Pub", "Sub"]},
        {"resource": "Topic:readonly-*", "actions": ["Sub"]},
        {"resource": "Group:alice-*", "actions": ["Sub"]},
    ]
    code, body = proc.admin_call(
        "POST", "/v1/acls", {"subject": "User:alice", "policies": policies}
    )
    assert code == 201, body
    proc.admin_call("POST", "/v1/users", {"access_key": MALLORY[0], "secret_key": MALLORY[1]})
    policies = [{"resource": "Topic:allowed-*", "actions": ["Sub"]}]
    code, body = proc.admin_call(
        "POST", "/v1/acls", {"subject": "User:mallory", "policies": policies}
    )
    assert code == 201, body
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def config(server: ServerProcess, ak: str, sk: str) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials(ak, sk), request_timeout=5)


def message(topic: str, body: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    return msg


def producer(server: ServerProcess, ak: str, sk: str) -> Producer:
    p = Producer(config(server, ak, sk))
    p.startup()
    return p


def test_allowed_send_and_receive(server: ServerProcess) -> None:
    topic, group = unique("allowed"), unique("alice")
    server.create_topic(topic)
    server.create_group(group)
    p = producer(server, *ALICE)
    try:
        receipt = p.send(message(topic, "hello"))
    finally:
        p.shutdown()
    consumer = SimpleConsumer(
        config(server, *ALICE), group, {topic: FilterExpression()}, await_duration=2
    )
    consumer.startup()
    try:
        deadline = time.monotonic() + 15
        got = []
        while not got and time.monotonic() < deadline:
            got = consumer.receive(8, 15)
        assert [m.message_id for m in got] == [receipt.message_id]
        consumer.ack(got[0])
    finally:
        consumer.shutdown()


def test_denied_send_is_forbidden_and_names_the_permission(server: ServerProcess) -> None:
    topic = unique("readonly")  # alice may look its route up (Sub), not Pub
    server.create_topic(topic)
    p = producer(server, *ALICE)
    try:
        with pytest.raises(ForbiddenException, match=f"Pub on Topic:{topic}"):
            p.send(message(topic, "nope"))
    finally:
        p.shutdown()
    denials = audit_denials(server.lines, containing=topic)
    assert denials and "reason=forbidden" in denials[0] and "user=alice" in denials[0]
    assert ALICE[1] not in "\n".join(server.lines)


def test_denied_receive_is_forbidden(server: ServerProcess) -> None:
    topic, group = unique("allowed"), unique("other-group")
    server.create_topic(topic)
    server.create_group(group)
    with pytest.raises(ForbiddenException, match=f"Sub on Group:{group}"):
        consumer = SimpleConsumer(
            config(server, *ALICE), group, {topic: FilterExpression()}, await_duration=1
        )
        consumer.startup()
        try:
            consumer.receive(1, 15)
        finally:
            consumer.shutdown()


@pytest.mark.parametrize(
    "ak, sk",
    [
        (ALICE[0], "wrong-secret-key"),
        ("nobody", "nobody-secret-key"),
        ("carol", "carol-secret-key"),  # disabled
        ("", ""),  # no credentials: the client sends an empty Credential=
    ],
    ids=["wrong-secret", "unknown-user", "disabled-user", "no-credentials"],
)
def test_bad_credentials_are_unauthorized(server: ServerProcess, ak: str, sk: str) -> None:
    topic = unique("allowed")
    server.create_topic(topic)
    seen = len(server.lines)
    p = producer(server, ak, sk)
    try:
        # The client's first call, the route lookup, is refused: it cannot send.
        with pytest.raises(Exception, match="failed to fetch topic"):
            p.send(message(topic, "nope"))
    finally:
        p.shutdown()
    denials = audit_denials(server.lines, seen)
    assert denials and all("reason=unauthenticated" in line for line in denials)
    assert all(f"user={ak or '-'} " in line for line in denials)
    if sk:
        assert sk not in "\n".join(server.lines)


def test_wrong_secret_answers_unauthorized_on_the_wire(server: ServerProcess) -> None:
    status = _route(server, unique("allowed"), signature.utc_stamp(), sk="wrong-secret-key")
    assert status.code == pb.Code.UNAUTHORIZED and "secret key" in status.message


def _route(server: ServerProcess, topic: str, date_time: str, sk: str = ALICE[1]) -> pb.Status:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        metadata = [
            ("x-mq-date-time", date_time),
            ("authorization", signature.authorization_header(ALICE[0], sk, date_time)),
        ]
        request = svc.QueryRouteRequest(topic=pb.Resource(name=topic))
        return stub.QueryRoute(request, metadata=metadata, timeout=5).status


def test_fresh_signature_passes_stale_and_future_ones_do_not(server: ServerProcess) -> None:
    topic = unique("allowed")
    server.create_topic(topic)
    now = time.time()
    assert _route(server, topic, signature.utc_stamp(now)).code == pb.Code.OK
    # A header captured ten minutes ago (replayed), and one from a skewed clock.
    replayed = _route(server, topic, signature.utc_stamp(now - 600))
    assert replayed.code == pb.Code.UNAUTHORIZED and "x-mq-date-time" in replayed.message
    skewed = _route(server, topic, signature.utc_stamp(now + 3 * 3600 + 17))
    assert skewed.code == pb.Code.UNAUTHORIZED


def test_route_of_a_missing_topic_does_not_leak_existence(server: ServerProcess) -> None:
    stamp = signature.utc_stamp()
    exists = unique("private")
    server.create_topic(exists)
    answers = [_route(server, name, stamp) for name in (exists, unique("private"))]
    assert {a.code for a in answers} == {pb.Code.FORBIDDEN}
    assert answers[0].message.replace(exists, "X") == answers[1].message.replace(
        answers[1].message.split("Topic:")[1].split(" ")[0], "X"
    )


def test_fuzzed_authorization_headers_are_refused_and_harmless(server: ServerProcess) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    topic = unique("allowed")
    server.create_topic(topic)
    printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200)
    stamp = signature.utc_stamp()
    real = signature.authorization_header(ALICE[0], ALICE[1], stamp)
    mutated = st.builds(lambda cut, junk: real[:cut] + junk, st.integers(0, len(real)), printable)
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.one_of(printable, mutated), printable)
        def attempt(value: str, date_time: str) -> None:
            metadata = [("authorization", value), ("x-mq-date-time", date_time)]
            request = svc.QueryRouteRequest(topic=pb.Resource(name=topic))
            answer = stub.QueryRoute(request, metadata=metadata, timeout=5)
            if answer.status.code == pb.Code.OK:  # only the genuine header with its date
                assert (value, date_time) == (real, stamp)
            else:
                assert answer.status.code == pb.Code.UNAUTHORIZED, answer.status

        attempt()
    assert server.alive()
    assert not [line for line in server.lines if "Traceback" in line]


class Committing(StatusChecker):
    """Commits every transaction it is asked about (and counts the asks)."""

    def check(self, message: Message) -> TransactionResolution:
        super().check(message)
        return TransactionResolution.COMMIT


def test_transaction_check_back_only_to_the_producer_allowed_to_pub(
    server: ServerProcess,
) -> None:
    topic, group = unique("allowed-txn"), unique("alice")
    server.create_topic(topic, "transaction")
    server.create_group(group)
    # Mallory may Sub on the topic, not Pub: her producer declares it and is up first, yet
    # must never be asked about alice's transaction (a check carries the message).
    spy, checker = Committing(), Committing()
    mallory = Producer(config(server, *MALLORY), topics=(topic,), checker=spy)
    mallory.startup()
    try:
        alice = Producer(config(server, *ALICE), topics=(topic,), checker=checker)
        alice.startup()
        try:
            # Sent, never committed by the sender: only a check-back can decide it.
            receipt = alice.send(message(topic, "decided by check"), alice.begin_transaction())
            deadline = time.monotonic() + 30
            with checker.changed:
                while not checker.asked:
                    assert time.monotonic() < deadline, "alice was never asked a check"
                    checker.changed.wait(0.5)
            assert list(checker.asked) == [receipt.message_id]
        finally:
            alice.shutdown()
    finally:
        mallory.shutdown()
    assert not spy.asked, "a producer without Pub on the topic was asked a check"
    # The check's COMMIT (an EndTransaction signed by alice's client) made it visible.
    consumer = SimpleConsumer(
        config(server, *ALICE), group, {topic: FilterExpression()}, await_duration=2
    )
    consumer.startup()
    try:
        got: list = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            got = consumer.receive(8, 15)
        assert [m.message_id for m in got] == [receipt.message_id]
    finally:
        consumer.shutdown()
    assert ALICE[1] not in "\n".join(server.lines) and MALLORY[1] not in "\n".join(server.lines)
