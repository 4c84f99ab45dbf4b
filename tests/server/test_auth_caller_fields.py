"""Every MessagingService RPC (and BulkRead) × every field its caller chooses, through a real
server with authentication on.

Eve may Pub and Sub on ``Topic:eve-*`` and Sub on ``Group:eve-*``; the victim's
resources (``vic-*``) are the super user's. Each row is a request of Eve's own
with exactly one field pointed at the victim: a topic or group name, a namespace,
a transaction id, a transaction group, a receipt handle of another topic or of
another group, a recall handle. Eve's own request (the row's ``None`` variant)
must pass the edge check, so each row proves the one field is what is refused.
A refused field answers FORBIDDEN (naming only what Eve asked for) or, for a
token that belongs to a resource Eve cannot see, the very answer of a token that
does not exist; the victim's message, transaction or delivery is unchanged
afterwards (the super user can still act on it).
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.auth import signature
from halfmoon.bulkread.format import METHOD as BULK_METHOD
from halfmoon.bulkread.format import BulkAnswer, BulkRequest
from halfmoon.client.transaction import PROPERTY_TRANSACTION_GROUP
from tests.server.conftest import ServerProcess, unique

pytestmark = pytest.mark.slow

ROOT = ("root", "root-secret-key")
EVE = ("eve", "eve-secret-key")
Code = pb.Code


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-auth-fields"),
        # Transactions stay undecided for the whole module: no check may decide them.
        settings=(
            "auth.enabled=true",
            "auth.bootstrap_access_key=root",
            "transaction.timeout_ms=1h",
        ),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT[1]},
        credentials=ROOT,
    ).start()
    assert proc.admin_call("POST", "/v1/users", {"access_key": EVE[0], "secret_key": EVE[1]})[0]
    policies = [
        {"resource": "Topic:eve-*", "actions": ["Pub", "Sub", "Update"]},
        {"resource": "Group:eve-*", "actions": ["Sub", "Update"]},
        {"resource": "Topic:%DLQ%eve-*", "actions": ["Get", "Update"]},
    ]
    code, body = proc.admin_call("POST", "/v1/acls", {"subject": "User:eve", "policies": policies})
    assert code == 201, body
    for name, kind in (
        ("eve-plain", "normal"),
        ("eve-tx", "transaction"),
        ("eve-delay", "delay"),
        ("vic-plain", "normal"),
        ("vic-tx", "transaction"),
        ("vic-delay", "delay"),
    ):
        proc.create_topic(name, kind, queues=1)
    for name in ("eve-g", "eve-g2", "vic-g"):
        proc.create_group(name)
    try:
        yield proc
    finally:
        if proc.alive():
            assert proc.stop() == 0, proc.log_tail()
        assert not [line for line in proc.lines if "Traceback" in line], proc.log_tail()


class Caller:
    """Raw, signed MessagingService calls as one user."""

    def __init__(self, server: ServerProcess, user: tuple[str, str]) -> None:
        self.user = user
        self.channel = grpc.insecure_channel(server.grpc)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.client_id = f"{user[0]}-{uuid.uuid4().hex[:8]}"

    def metadata(self) -> list[tuple[str, str]]:
        stamp = signature.utc_stamp()
        return [
            ("x-mq-date-time", stamp),
            ("authorization", signature.authorization_header(*self.user, stamp)),
            ("x-mq-client-id", self.client_id),
        ]

    def status(self, method: str, request: Any, client_id: str | None = None) -> pb.Status:
        """The answer's status (a streaming RPC's first status)."""
        if client_id is not None:  # the same request under another client id
            saved, self.client_id = self.client_id, client_id
            try:
                return self.status(method, request)
            finally:
                self.client_id = saved
        if method == "Telemetry":
            for response in self.stub.Telemetry(
                iter([request]), metadata=self.metadata(), timeout=10
            ):
                return response.status
            raise AssertionError("Telemetry answered nothing")
        if method == "BulkRead":
            raw = self.channel.unary_unary(BULK_METHOD)(
                request.encode(), metadata=self.metadata(), timeout=10
            )
            answer = BulkAnswer.decode(raw)
            return pb.Status(code=answer.code, message=answer.message)
        call = getattr(self.stub, method)
        if method in ("ReceiveMessage", "PullMessage"):
            for response in call(request, metadata=self.metadata(), timeout=10):
                if response.HasField("status"):
                    return response.status
            raise AssertionError(f"{method} answered no status")
        return call(request, metadata=self.metadata(), timeout=10).status

    def send(self, topic: str, *, kind: int = pb.MessageType.NORMAL, **props: Any) -> Any:
        system = pb.SystemProperties(
            message_id=uuid.uuid4().hex, message_type=kind, body_encoding=pb.Encoding.IDENTITY
        )
        if "delivery_ms" in props:
            system.delivery_timestamp.FromMilliseconds(props.pop("delivery_ms"))
        message = pb.Message(
            topic=pb.Resource(name=topic), system_properties=system, body=b"victim's"
        )
        message.user_properties.update(props)
        answer = self.stub.SendMessage(
            svc.SendMessageRequest(messages=[message]), metadata=self.metadata(), timeout=10
        )
        assert answer.status.code == Code.OK, answer.status
        return answer.entries[0]

    def receive(self, topic: str, group: str) -> pb.Message:
        request = receive_request(topic, group)
        request.long_polling_timeout.seconds = 5
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for response in self.stub.ReceiveMessage(request, metadata=self.metadata(), timeout=15):
                if response.HasField("message"):
                    return response.message
        raise AssertionError(f"nothing to receive from {topic} as {group}")

    def ack(self, topic: str, group: str, handle: str) -> pb.Status:
        entry = svc.AckMessageEntry(receipt_handle=handle)
        request = svc.AckMessageRequest(group=res(group), topic=res(topic), entries=[entry])
        return self.stub.AckMessage(request, metadata=self.metadata(), timeout=10).status


def res(name: str, namespace: str = "") -> pb.Resource:
    return pb.Resource(name=name, resource_namespace=namespace)


def queue(topic: str, namespace: str = "") -> pb.MessageQueue:
    return pb.MessageQueue(topic=res(topic, namespace), id=0)


def receive_request(topic: str, group: str, namespace: str = "") -> svc.ReceiveMessageRequest:
    request = svc.ReceiveMessageRequest(
        group=res(group, namespace),
        message_queue=pb.MessageQueue(topic=res(topic, namespace), id=-1),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=1,
    )
    request.invisible_duration.seconds = 30
    request.long_polling_timeout.seconds = 0
    return request


@dataclass
class Victim:
    """Tokens of the victim's resources, made by the super user."""

    root: Caller
    pending_tid: str  # an undecided transaction of vic-tx
    decided_tid: str  # a rolled-back transaction of vic-tx
    txn_group: str  # a transaction group with a member in vic-tx
    recall_handle: str  # a delay message of vic-delay, not yet due


@pytest.fixture(scope="module")
def victim(server: ServerProcess) -> Victim:
    root = Caller(server, ROOT)
    pending = root.send("vic-tx", kind=pb.MessageType.TRANSACTION)
    decided = root.send("vic-tx", kind=pb.MessageType.TRANSACTION)
    ended = root.stub.EndTransaction(
        svc.EndTransactionRequest(
            topic=res("vic-tx"),
            message_id=decided.message_id,
            transaction_id=decided.transaction_id,
            resolution=pb.TransactionResolution.ROLLBACK,
        ),
        metadata=root.metadata(),
        timeout=10,
    )
    assert ended.status.code == Code.OK, ended.status
    group = unique("vic-batch")
    root.send("vic-tx", kind=pb.MessageType.TRANSACTION, **{PROPERTY_TRANSACTION_GROUP: group})
    delayed = root.send(
        "vic-delay", kind=pb.MessageType.DELAY, delivery_ms=int(time.time() * 1000) + 3_600_000
    )
    beat = root.stub.Heartbeat(
        svc.HeartbeatRequest(group=res("vic-g"), client_type=pb.ClientType.SIMPLE_CONSUMER),
        metadata=root.metadata(),
        timeout=10,
    )
    assert beat.status.code == Code.OK, beat.status
    return Victim(
        root, pending.transaction_id, decided.transaction_id, group, delayed.recall_handle
    )


def delivery(victim: Victim, topic: str, group: str) -> str:
    """A fresh in-flight delivery of the victim's: its receipt handle."""
    victim.root.send(topic)
    return victim.root.receive(topic, group).system_properties.receipt_handle


@dataclass(frozen=True)
class Row:
    """One RPC with one caller-chosen field; ``build(victim, value)`` is Eve's request with
    that field set to ``value`` (None: Eve's own value)."""

    method: str
    field: str
    build: Callable[[Victim, str | None], Any]
    refused: int = Code.FORBIDDEN  # the answer when the field is the victim's
    # What the victim's token must still do afterwards (None: a name, nothing to check).
    unchanged: Callable[[ServerProcess, Victim, Any], None] | None = None


def _end(topic: str, tid: str, message_id: str = "") -> svc.EndTransactionRequest:
    return svc.EndTransactionRequest(
        topic=res(topic),
        message_id=message_id,
        transaction_id=tid,
        resolution=pb.TransactionResolution.COMMIT,
    )


def _transactions(server: ServerProcess) -> dict[str, str]:
    code, body = server.admin_call("GET", "/v1/transactions?topic=vic-tx")
    assert code == 200, body
    return {t["transaction_id"]: t["state"] for t in body["transactions"]}  # type: ignore[index]


def _still_pending(server: ServerProcess, victim: Victim, _: Any) -> None:
    states = _transactions(server)
    assert states[victim.pending_tid] == "prepared", states


def _group_undecided(server: ServerProcess, victim: Victim, _: Any) -> None:
    code, body = server.admin_call("GET", "/v1/transactions?topic=vic-tx")
    members = [t for t in body["transactions"] if t.get("transaction_group") == victim.txn_group]  # type: ignore[index]
    assert members and all(t["state"] == "prepared" for t in members), body


def _recall_still_works(server: ServerProcess, victim: Victim, _: Any) -> None:
    # Not recalled by Eve: it is still there for its owner to recall (once).
    answer = victim.root.stub.RecallMessage(
        svc.RecallMessageRequest(topic=res("vic-delay"), recall_handle=victim.recall_handle),
        metadata=victim.root.metadata(),
        timeout=10,
    )
    assert answer.status.code == Code.OK, answer.status


def _handle_still_in_flight(topic: str, group: str) -> Callable[[ServerProcess, Victim, Any], None]:
    def check(server: ServerProcess, victim: Victim, handle: Any) -> None:
        # Neither acked, nor its invisible time changed, nor dead-lettered by Eve: the
        # owner's own handle still acks it.
        status = victim.root.ack(topic, group, handle)
        assert status.code == Code.OK, status

    return check


def _handle_rows(method: str, make: Callable[[str, str, str], Any]) -> list[Row]:
    """Ack, change and dead-letter alike: topic, group, and handles of others."""
    own = ("eve-plain", "eve-g")
    return [
        Row(method, "topic", lambda v, x: make(x or own[0], own[1], "h")),
        Row(method, "group", lambda v, x: make(own[0], x or own[1], "h")),
        Row(method, "namespace", lambda v, x: make_ns(make, own, x)),
        # A handle of a topic Eve may not read, acked as one of hers.
        Row(
            method,
            "receipt_handle of another topic",
            lambda v, x: make(own[0], own[1], x or "h"),
            refused=Code.INVALID_RECEIPT_HANDLE,
            unchanged=_handle_still_in_flight("vic-plain", "vic-g"),
        ),
        # A handle of another group's delivery in Eve's own topic.
        Row(
            method,
            "receipt_handle of another group",
            lambda v, x: make(own[0], own[1], x or "h"),
            refused=Code.INVALID_RECEIPT_HANDLE,
            unchanged=_handle_still_in_flight("eve-plain", "vic-g"),
        ),
    ]


def make_ns(make: Callable[..., Any], own: tuple[str, str], namespace: str | None) -> Any:
    request = make(*own, "h")
    if namespace:
        request.topic.resource_namespace = namespace
        request.group.resource_namespace = namespace
    return request


def _ack(topic: str, group: str, handle: str) -> svc.AckMessageRequest:
    entry = svc.AckMessageEntry(receipt_handle=handle, message_id="m")
    return svc.AckMessageRequest(group=res(group), topic=res(topic), entries=[entry])


def _change(topic: str, group: str, handle: str) -> svc.ChangeInvisibleDurationRequest:
    request = svc.ChangeInvisibleDurationRequest(
        group=res(group), topic=res(topic), receipt_handle=handle, message_id="m"
    )
    request.invisible_duration.seconds = 60
    return request


def _forward(topic: str, group: str, handle: str) -> svc.ForwardMessageToDeadLetterQueueRequest:
    return svc.ForwardMessageToDeadLetterQueueRequest(
        group=res(group), topic=res(topic), receipt_handle=handle, message_id="m",
        delivery_attempt=1, max_delivery_attempts=16,
    )  # fmt: skip


def _queue_rows(method: str, make: Callable[[pb.MessageQueue, str], Any]) -> list[Row]:
    return [
        Row(method, "message_queue.topic", lambda v, x: make(queue(x or "eve-plain"), "eve-g")),
        Row(method, "group", lambda v, x: make(queue("eve-plain"), x or "eve-g")),
        Row(method, "namespace", lambda v, x: make(queue("eve-plain", x or ""), "eve-g")),
    ]


def _pull(mq: pb.MessageQueue, group: str) -> svc.PullMessageRequest:
    return svc.PullMessageRequest(
        group=res(group, mq.topic.resource_namespace), message_queue=mq, offset=0, batch_size=1,
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
    )  # fmt: skip


def _update_offset(mq: pb.MessageQueue, group: str) -> svc.UpdateOffsetRequest:
    return svc.UpdateOffsetRequest(
        group=res(group, mq.topic.resource_namespace), message_queue=mq, offset=0
    )


def _get_offset(mq: pb.MessageQueue, group: str) -> svc.GetOffsetRequest:
    return svc.GetOffsetRequest(group=res(group, mq.topic.resource_namespace), message_queue=mq)


def _session_intact(server: ServerProcess, victim: Victim, _: Any) -> None:
    code, body = server.admin_call("GET", "/v1/groups/vic-g/clients")
    assert code == 200, body
    ids = [c["client_id"] for c in body["clients"]]  # type: ignore[index]
    assert victim.root.client_id in ids, body


VIC_NAMES = {
    "topic": "vic-plain",
    "message_queue.topic": "vic-plain",
    "messages[].topic": "vic-plain",
    "group": "vic-g",
    "namespace": "vicns",
}

ROWS: list[Row] = [
    Row("QueryRoute", "topic", lambda v, x: svc.QueryRouteRequest(topic=res(x or "eve-plain"))),
    Row(
        "QueryRoute",
        "namespace",
        lambda v, x: svc.QueryRouteRequest(topic=res("eve-plain", x or "")),
    ),
    Row(
        "SendMessage",
        "messages[].topic",
        lambda v, x: svc.SendMessageRequest(
            messages=[
                pb.Message(
                    topic=res(t),
                    body=b"eve's",
                    system_properties=pb.SystemProperties(
                        message_id=uuid.uuid4().hex, body_encoding=pb.Encoding.IDENTITY
                    ),
                )
                for t in ("eve-plain", x or "eve-plain")
            ]
        ),  # fmt: skip
    ),
    Row(
        "RecallMessage",
        "topic",
        lambda v, x: svc.RecallMessageRequest(topic=res(x or "eve-delay"), recall_handle="h"),
    ),
    Row(
        "RecallMessage",
        "recall_handle of another topic",
        lambda v, x: svc.RecallMessageRequest(topic=res("eve-delay"), recall_handle=x or "h"),
        refused=Code.BAD_REQUEST,  # ILLEGAL_RECALL_HANDLE
        unchanged=_recall_still_works,
    ),
    Row("EndTransaction", "topic", lambda v, x: _end(x or "eve-tx", "T")),
    Row(
        "EndTransaction",
        "transaction_id of another topic (pending)",
        lambda v, x: _end("eve-tx", x or "T"),
        refused=Code.INVALID_TRANSACTION_ID,
        unchanged=_still_pending,
    ),
    Row(
        "EndTransaction",
        "transaction_id of another topic (decided)",
        lambda v, x: _end("eve-tx", x or "T"),
        refused=Code.INVALID_TRANSACTION_ID,
    ),
    Row(
        "EndTransaction",
        "transaction_id of another topic, with its message id",
        lambda v, x: _end("eve-tx", x or "T", message_id="m"),
        refused=Code.INVALID_TRANSACTION_ID,
        unchanged=_still_pending,
    ),
    # A group decision publishes whatever its members are: the topic named does not count.
    Row(
        "EndTransaction",
        "transaction group",
        lambda v, x: _end("eve-tx", x or "T"),
        unchanged=_group_undecided,
    ),
    Row(
        "QueryAssignment",
        "topic",
        lambda v, x: svc.QueryAssignmentRequest(topic=res(x or "eve-plain"), group=res("eve-g")),
    ),
    Row(
        "QueryAssignment",
        "group",
        lambda v, x: svc.QueryAssignmentRequest(topic=res("eve-plain"), group=res(x or "eve-g")),
    ),
    Row(
        "ReceiveMessage",
        "message_queue.topic",
        lambda v, x: receive_request(x or "eve-plain", "eve-g"),
    ),
    Row("ReceiveMessage", "group", lambda v, x: receive_request("eve-plain", x or "eve-g")),
    Row("ReceiveMessage", "namespace", lambda v, x: receive_request("eve-plain", "eve-g", x or "")),
    *_handle_rows("AckMessage", _ack),
    *_handle_rows("ChangeInvisibleDuration", _change),
    *_handle_rows("ForwardMessageToDeadLetterQueue", _forward),
    *_queue_rows("PullMessage", _pull),
    *_queue_rows("UpdateOffset", _update_offset),
    *_queue_rows("GetOffset", _get_offset),
    Row(
        "QueryOffset",
        "message_queue.topic",
        lambda v, x: svc.QueryOffsetRequest(
            message_queue=queue(x or "eve-plain"),
            query_offset_policy=pb.QueryOffsetPolicy.BEGINNING,
        ),
    ),
    Row(
        "SyncLiteSubscription",
        "topic",
        lambda v, x: svc.SyncLiteSubscriptionRequest(
            topic=res(x or "eve-plain"), group=res("eve-g"), lite_topic_set=["a"]
        ),
    ),
    Row(
        "SyncLiteSubscription",
        "group",
        lambda v, x: svc.SyncLiteSubscriptionRequest(
            topic=res("eve-plain"), group=res(x or "eve-g"), lite_topic_set=["a"]
        ),
    ),
    # A consumer's heartbeat may create its group: Sub on it.
    Row(
        "Heartbeat",
        "group",
        lambda v, x: svc.HeartbeatRequest(
            group=res(x or "eve-g"), client_type=pb.ClientType.SIMPLE_CONSUMER
        ),
    ),
    # The victim's client id: its session, stream and lite subscriptions are not Eve's.
    *(
        Row(method, "x-mq-client-id", build, unchanged=_session_intact)
        for method, build in (
            (
                "Heartbeat",
                lambda v, x: svc.HeartbeatRequest(
                    group=res("eve-g"), client_type=pb.ClientType.SIMPLE_CONSUMER
                ),
            ),
            (
                "NotifyClientTermination",
                lambda v, x: svc.NotifyClientTerminationRequest(group=res("eve-g")),
            ),
            (
                "Telemetry",
                lambda v, x: svc.TelemetryCommand(
                    settings=pb.Settings(
                        client_type=pb.ClientType.SIMPLE_CONSUMER,
                        subscription=pb.Subscription(group=res("eve-g")),
                    )
                ),
            ),
            (
                "SendMessage",
                lambda v, x: svc.SendMessageRequest(
                    messages=[
                        pb.Message(
                            topic=res("eve-plain"),
                            body=b"eve's",
                            system_properties=pb.SystemProperties(
                                message_id=uuid.uuid4().hex, body_encoding=pb.Encoding.IDENTITY
                            ),
                        )
                    ]
                ),
            ),
        )
    ),  # fmt: skip
    Row("BulkRead", "topic", lambda v, x: BulkRequest("eve-g", x or "eve-plain", 0, 0)),
    Row("BulkRead", "group", lambda v, x: BulkRequest(x or "eve-g", "eve-plain", 0, 0)),
    Row(
        "BulkRead",
        "namespace",
        lambda v, x: BulkRequest("eve-g", "eve-plain", 0, 0, namespace=x or ""),
    ),
]


def victim_value(server: ServerProcess, victim: Victim, row: Row) -> str:
    """The victim's value for the row's field (a fresh one for tokens that get used up)."""
    if row.field == "x-mq-client-id":
        return victim.root.client_id
    if row.field in VIC_NAMES:
        return VIC_NAMES[row.field]
    if row.field.startswith("receipt_handle of another topic"):
        return delivery(victim, "vic-plain", "vic-g")
    if row.field.startswith("receipt_handle of another group"):
        return delivery(victim, "eve-plain", "vic-g")
    if row.field.startswith("recall_handle"):
        return victim.recall_handle
    if row.field == "transaction group":
        return "hm-group:" + victim.txn_group
    if "decided" in row.field:
        return victim.decided_tid
    return victim.pending_tid


def test_every_mapped_rpc_has_rows() -> None:
    methods = svc.DESCRIPTOR.services_by_name["MessagingService"].methods
    assert {m.name for m in methods} <= {r.method for r in ROWS} - {"BulkRead"}
    assert "BulkRead" in {r.method for r in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.method}:{r.field}")
def test_a_field_pointing_at_another_users_resource_is_refused(
    server: ServerProcess, victim: Victim, row: Row
) -> None:
    eve = Caller(server, EVE)
    own = eve.status(row.method, row.build(victim, None))
    assert own.code not in (Code.FORBIDDEN, Code.UNAUTHORIZED), (row, own)
    value = victim_value(server, victim, row)
    if row.field == "x-mq-client-id":
        answer = eve.status(row.method, row.build(victim, None), client_id=value)
    else:
        answer = eve.status(row.method, row.build(victim, value))
    assert answer.code == row.refused, (row, answer)
    if row.refused != Code.FORBIDDEN:
        # A token of a resource Eve cannot see: the answer names none of the victim's.
        text = answer.message.replace(value, "TOKEN")
        assert "vic" not in text, answer.message
        bogus = eve.status(row.method, row.build(victim, _bogus(value)))
        assert bogus.code == answer.code
        if row.refused == Code.INVALID_TRANSACTION_ID:
            assert bogus.message.replace(_bogus(value), "TOKEN") == text
    if row.unchanged is not None:
        row.unchanged(server, victim, value)


def _bogus(value: str) -> str:
    """A token of the same kind that names nothing."""
    if value.startswith("T") and len(value) == 25:
        from halfmoon.broker.transactions.ids import encode_transaction_id

        return encode_transaction_id(10**12)
    return value[:-2] + ("AA" if not value.endswith("AA") else "BB")


# -- the admin API: resources a request acts on but its path does not name -------------------


def _dead_letter(victim: Victim, topic: str, group: str) -> None:
    """One more dead letter of ``group``, consumed from ``topic``."""
    handle = delivery(victim, topic, group)
    answer = victim.root.stub.ForwardMessageToDeadLetterQueue(
        _forward(topic, group, handle), metadata=victim.root.metadata(), timeout=10
    )
    assert answer.status.code == Code.OK, answer.status


def _offsets(server: ServerProcess, group: str) -> list[object]:
    code, body = server.admin_call("GET", f"/v1/groups/{group}/progress")
    assert code == 200, body
    return [(q["topic"], q["queue_id"], q["committed_offset"]) for q in body["queues"]]  # type: ignore[index]


def _depth(server: ServerProcess, topic: str) -> int:
    code, body = server.admin_call("GET", f"/v1/topics/{topic}/status")
    assert code == 200, body
    return sum(q["max_offset"] for q in body["queues"])  # type: ignore[index]


def _admin(server: ServerProcess, user: tuple[str, str], method: str, path: str, body: dict):
    as_user = copy.copy(server)
    as_user.credentials = user
    return as_user.admin_call(method, path, body)


def test_admin_bodies_naming_another_users_resource_are_refused(
    server: ServerProcess, victim: Victim
) -> None:
    eve = Caller(server, EVE)
    eve.send("eve-plain")
    eve.ack(
        "eve-plain", "eve-g", eve.receive("eve-plain", "eve-g").system_properties.receipt_handle
    )
    # clone-offset writes the offsets of the group in "to".
    before = _offsets(server, "vic-g")
    code, answer = _admin(server, EVE, "POST", "/v1/groups/eve-g/clone-offset", {"to": "vic-g"})
    assert code == 403 and "Group:vic-g" in str(answer), (code, answer)
    assert _offsets(server, "vic-g") == before
    code, answer = _admin(server, EVE, "POST", "/v1/groups/eve-g/clone-offset", {"to": "eve-g2"})
    assert code == 200, answer
    # A dead-letter resend sends to the topic in the body, else to the letter's own topic.
    _dead_letter(victim, "eve-plain", "eve-g")
    _dead_letter(victim, "vic-plain", "eve-g")
    path = "/v1/topics/%25DLQ%25eve-g/queues/0/offsets/{}/resend"
    depth = _depth(server, "vic-plain")
    code, answer = _admin(server, EVE, "POST", path.format(0), {"topic": "vic-plain"})
    assert code == 403 and "Topic:vic-plain" in str(answer), (code, answer)
    code, answer = _admin(server, EVE, "POST", path.format(1), {})
    assert code == 403 and "Topic:vic-plain" in str(answer), (code, answer)
    assert _depth(server, "vic-plain") == depth
    code, answer = _admin(server, EVE, "POST", path.format(0), {})
    assert code == 201, answer
