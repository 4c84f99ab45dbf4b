"""Hostile input against every RPC: the server answers, never crashes, never corrupts.

Three waves against one real ``halfmoon serve``:

1. random bytes, truncated and bit-flipped encodings of real requests, sent
   to every method of ``MessagingService`` through a raw channel with
   identity serializers;
2. well-formed requests with wrong contents (missing fields, huge numbers,
   bad names, garbage receipt handles and filters), each of which must get
   the protocol Code a user can act on, never INTERNAL_ERROR;
3. a normal send and receive, which must still work, on a live process.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow

SERVICE = svc.DESCRIPTOR.services_by_name["MessagingService"]
Code = pb.Code
TOPIC, GROUP = "fuzz-topic", "fuzz-group"
CLIENT_ID = "fuzz-client-" + uuid.uuid4().hex[:8]
METADATA = (("x-mq-client-id", CLIENT_ID), ("x-mq-language", "PYTHON"))


def _identity(data: bytes) -> bytes:
    return data


def _resource(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def _queue(topic: str = TOPIC, queue_id: int = 0) -> pb.MessageQueue:
    return pb.MessageQueue(topic=_resource(topic), id=queue_id, permission=pb.Permission.READ_WRITE)


def _message(topic: str = TOPIC, body: bytes = b"hello", **system: object) -> pb.Message:
    props = pb.SystemProperties(
        message_id=uuid.uuid4().hex.upper(),
        message_type=pb.MessageType.NORMAL,
        body_encoding=pb.Encoding.IDENTITY,
    )
    for key, value in system.items():
        if hasattr(value, "CopyFrom"):
            getattr(props, key).CopyFrom(value)
        elif isinstance(value, list):
            getattr(props, key).extend(value)
        else:
            setattr(props, key, value)
    return pb.Message(topic=_resource(topic), system_properties=props, body=body)


def _receive(**fields: object) -> svc.ReceiveMessageRequest:
    request = svc.ReceiveMessageRequest(
        group=_resource(GROUP), message_queue=_queue(queue_id=-1), batch_size=4
    )
    request.invisible_duration.seconds = 15
    request.long_polling_timeout.seconds = 0
    for key, value in fields.items():
        if hasattr(value, "CopyFrom"):
            getattr(request, key).CopyFrom(value)
        else:
            setattr(request, key, value)
    return request


def templates() -> dict[str, object]:
    """One realistic request per method: the seed for truncation and bit flips."""
    settings = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER)
    settings.subscription.group.name = GROUP
    entry = settings.subscription.subscriptions.add()
    entry.topic.name = TOPIC
    entry.expression.type = pb.FilterType.TAG
    entry.expression.expression = "*"
    return {
        "QueryRoute": svc.QueryRouteRequest(topic=_resource(TOPIC)),
        "Heartbeat": svc.HeartbeatRequest(
            group=_resource(GROUP), client_type=pb.ClientType.SIMPLE_CONSUMER
        ),
        "SendMessage": svc.SendMessageRequest(messages=[_message(tag="T", keys=["k1", "k2"])]),
        "QueryAssignment": svc.QueryAssignmentRequest(
            topic=_resource(TOPIC), group=_resource(GROUP)
        ),
        "ReceiveMessage": _receive(),
        "AckMessage": svc.AckMessageRequest(
            group=_resource(GROUP),
            topic=_resource(TOPIC),
            entries=[svc.AckMessageEntry(message_id="X", receipt_handle="abc")],
        ),
        "ForwardMessageToDeadLetterQueue": svc.ForwardMessageToDeadLetterQueueRequest(
            group=_resource(GROUP),
            topic=_resource(TOPIC),
            receipt_handle="abc",
            message_id="X",
            delivery_attempt=1,
            max_delivery_attempts=3,
        ),
        "PullMessage": svc.PullMessageRequest(
            group=_resource(GROUP), message_queue=_queue(), offset=0, batch_size=4
        ),
        "UpdateOffset": svc.UpdateOffsetRequest(
            group=_resource(GROUP), message_queue=_queue(), offset=0
        ),
        "GetOffset": svc.GetOffsetRequest(group=_resource(GROUP), message_queue=_queue()),
        "QueryOffset": svc.QueryOffsetRequest(
            message_queue=_queue(), query_offset_policy=pb.QueryOffsetPolicy.END
        ),
        "EndTransaction": svc.EndTransactionRequest(
            topic=_resource(TOPIC),
            message_id="X",
            transaction_id="Y",
            resolution=pb.TransactionResolution.COMMIT,
        ),
        "Telemetry": svc.TelemetryCommand(settings=settings),
        "NotifyClientTermination": svc.NotifyClientTerminationRequest(group=_resource(GROUP)),
        "ChangeInvisibleDuration": svc.ChangeInvisibleDurationRequest(
            group=_resource(GROUP), topic=_resource(TOPIC), receipt_handle="abc", message_id="X"
        ),
        "RecallMessage": svc.RecallMessageRequest(topic=_resource(TOPIC), recall_handle="abc"),
        "SyncLiteSubscription": svc.SyncLiteSubscriptionRequest(),
    }


class RawClient:
    """Calls any method with raw bytes; answers are (grpc code, list of raw responses)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)

    def call(
        self, method: str, payloads: list[bytes], timeout: float = 5.0
    ) -> tuple[grpc.StatusCode, list[bytes]]:
        descriptor = SERVICE.methods_by_name[method]
        path = f"/{SERVICE.full_name}/{method}"
        kinds = (descriptor.client_streaming, descriptor.server_streaming)
        try:
            if kinds == (False, False):
                stub = self.channel.unary_unary(
                    path, request_serializer=_identity, response_deserializer=_identity
                )
                return grpc.StatusCode.OK, [stub(payloads[0], timeout=timeout, metadata=METADATA)]
            if kinds == (False, True):
                stub = self.channel.unary_stream(
                    path, request_serializer=_identity, response_deserializer=_identity
                )
                return grpc.StatusCode.OK, list(
                    stub(payloads[0], timeout=timeout, metadata=METADATA)
                )
            stub = self.channel.stream_stream(
                path, request_serializer=_identity, response_deserializer=_identity
            )
            return grpc.StatusCode.OK, list(
                stub(iter(payloads), timeout=timeout, metadata=METADATA)
            )
        except grpc.RpcError as exc:
            return exc.code(), []

    def close(self) -> None:
        self.channel.close()


def status_codes(method: str, responses: list[bytes]) -> list[int]:
    """The protocol Codes in a method's responses (parsed with its real response type)."""
    output = SERVICE.methods_by_name[method].output_type
    response_type = svc.TelemetryCommand if method == "Telemetry" else getattr(svc, output.name)
    codes = []
    for raw in responses:
        message = response_type.FromString(raw)
        if message.HasField("status"):
            codes.append(message.status.code)
    return codes


def mutations(rng: random.Random, seed: bytes) -> Iterator[bytes]:
    yield b""
    for _ in range(6):
        yield rng.randbytes(rng.randint(1, 300))
    for _ in range(6):
        yield seed[: rng.randint(0, max(len(seed) - 1, 0))]
    for _ in range(8):
        flipped = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            if flipped:
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        yield bytes(flipped)
    # A length prefix claiming far more than is there.
    yield b"\x0a\xff\xff\xff\xff\x0f" + seed[:8]


@pytest.fixture(scope="module")
def raw(server: ServerProcess) -> Iterator[RawClient]:
    server.create_topic(TOPIC, "normal", queues=2)
    server.create_group(GROUP)
    client = RawClient(server.grpc)
    yield client
    client.close()


def test_random_truncated_and_flipped_bytes_at_every_rpc(
    server: ServerProcess, raw: RawClient
) -> None:
    rng = random.Random(20261121)
    seeds = templates()
    assert set(seeds) == {m.name for m in SERVICE.methods}, "a method has no fuzz seed"
    internal: list[tuple[str, bytes]] = []
    calls = 0
    for method, template in seeds.items():
        seed = template.SerializeToString()  # type: ignore[attr-defined]
        for payload in mutations(rng, seed):
            payloads = [payload, payload[::-1]] if method == "Telemetry" else [payload]
            code, responses = raw.call(method, payloads, timeout=4)
            calls += 1
            assert code != grpc.StatusCode.UNAVAILABLE, (
                f"server unavailable after {method} {payload!r}:\n{server.log_tail()}"
            )
            try:
                codes = status_codes(method, responses)
            except DecodeError:
                pytest.fail(f"{method} answered bytes that do not parse")
            if Code.INTERNAL_ERROR in codes:
                internal.append((method, payload))
        assert server.alive(), server.log_tail()
    assert calls > 300
    assert not internal, f"requests answered INTERNAL_ERROR (a server bug): {internal[:5]}"


def _unary(raw: RawClient, method: str, request: object) -> int:
    code, responses = raw.call(method, [request.SerializeToString()])  # type: ignore[attr-defined]
    assert code == grpc.StatusCode.OK, f"{method}: transport error {code}"
    codes = status_codes(method, responses)
    assert codes, f"{method}: no status in the answer"
    return codes[0]


def _bad_requests() -> list[tuple[str, str, object, set[int]]]:
    C = Code
    huge = 2**62
    long_name = "x" * 100_000
    digest = pb.Digest(type=pb.DigestType.CRC32, checksum="DEADBEEF")
    future = pb.SystemProperties()
    future.delivery_timestamp.seconds = 2**40
    cases: list[tuple[str, str, object, set[int]]] = [
        ("route without topic", "QueryRoute", svc.QueryRouteRequest(), {C.BAD_REQUEST}),
        (
            "route to unknown topic",
            "QueryRoute",
            svc.QueryRouteRequest(topic=_resource("no-such-topic")),
            {C.TOPIC_NOT_FOUND},
        ),
        (
            "route with illegal name",
            "QueryRoute",
            svc.QueryRouteRequest(topic=_resource("bad name!")),
            {C.ILLEGAL_TOPIC, C.TOPIC_NOT_FOUND},
        ),
        (
            "route with huge name",
            "QueryRoute",
            svc.QueryRouteRequest(topic=_resource(long_name)),
            {C.ILLEGAL_TOPIC, C.TOPIC_NOT_FOUND},
        ),
        (
            "heartbeat with illegal group",
            "Heartbeat",
            svc.HeartbeatRequest(
                group=_resource("bad group!"), client_type=pb.ClientType.PUSH_CONSUMER
            ),
            {C.ILLEGAL_CONSUMER_GROUP},
        ),
        ("send nothing", "SendMessage", svc.SendMessageRequest(), {C.BAD_REQUEST}),
        (
            "send to unknown topic",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message("no-such-topic")]),
            {C.TOPIC_NOT_FOUND},
        ),
        (
            "send without topic",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message("")]),
            {C.BAD_REQUEST},
        ),
        (
            "send empty body",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(body=b"")]),
            {C.MESSAGE_BODY_EMPTY, C.BAD_REQUEST},
        ),
        (
            "send with wrong digest",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(body_digest=digest)]),
            {C.MESSAGE_CORRUPTED},
        ),
        (
            "send fifo without group",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(message_type=pb.MessageType.FIFO)]),
            {C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE},
        ),
        (
            "send delay to a normal topic",
            "SendMessage",
            svc.SendMessageRequest(
                messages=[
                    _message(
                        message_type=pb.MessageType.DELAY,
                        delivery_timestamp=future.delivery_timestamp,
                    )
                ]
            ),
            {C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, C.ILLEGAL_DELIVERY_TIME},
        ),
        (
            "send lite message without a lite topic to a normal topic",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(message_type=pb.MessageType.LITE)]),
            {C.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, C.ILLEGAL_LITE_TOPIC},
        ),
        (
            "send unknown type number",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(message_type=99)]),
            {C.UNSUPPORTED},
        ),
        (
            "send garbage gzip",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(body_encoding=pb.Encoding.GZIP)]),
            {C.BAD_REQUEST},
        ),
        (
            "send reserved property",
            "SendMessage",
            svc.SendMessageRequest(
                messages=[
                    pb.Message(
                        topic=_resource(TOPIC),
                        body=b"x",
                        user_properties={"__SHARDINGKEY": "g"},
                        system_properties=pb.SystemProperties(message_type=pb.MessageType.NORMAL),
                    )
                ]
            ),
            {C.ILLEGAL_MESSAGE_PROPERTY_KEY},
        ),
        (
            "send blank tag",
            "SendMessage",
            svc.SendMessageRequest(messages=[_message(tag="a|b")]),
            {C.ILLEGAL_MESSAGE_TAG},
        ),
        (
            "assignment without group",
            "QueryAssignment",
            svc.QueryAssignmentRequest(topic=_resource(TOPIC)),
            {C.BAD_REQUEST},
        ),
        (
            "ack nothing",
            "AckMessage",
            svc.AckMessageRequest(group=_resource(GROUP), topic=_resource(TOPIC)),
            {C.BAD_REQUEST},
        ),
        (
            "ack garbage handle",
            "AckMessage",
            svc.AckMessageRequest(
                group=_resource(GROUP),
                topic=_resource(TOPIC),
                entries=[svc.AckMessageEntry(receipt_handle="garbage")],
            ),
            {C.INVALID_RECEIPT_HANDLE},
        ),
        (
            "ack huge handle",
            "AckMessage",
            svc.AckMessageRequest(
                group=_resource(GROUP),
                topic=_resource(TOPIC),
                entries=[svc.AckMessageEntry(receipt_handle=long_name)],
            ),
            {C.INVALID_RECEIPT_HANDLE},
        ),
        (
            "change invisible of garbage",
            "ChangeInvisibleDuration",
            svc.ChangeInvisibleDurationRequest(
                group=_resource(GROUP), topic=_resource(TOPIC), receipt_handle="garbage"
            ),
            {C.INVALID_RECEIPT_HANDLE, C.ILLEGAL_INVISIBLE_TIME},
        ),
        (
            "dead-letter garbage",
            "ForwardMessageToDeadLetterQueue",
            svc.ForwardMessageToDeadLetterQueueRequest(
                group=_resource(GROUP), topic=_resource(TOPIC), receipt_handle="garbage"
            ),
            {C.INVALID_RECEIPT_HANDLE},
        ),
        (
            "pull negative offset",
            "PullMessage",
            svc.PullMessageRequest(
                group=_resource(GROUP), message_queue=_queue(), offset=-1, batch_size=1
            ),
            {C.BAD_REQUEST, C.ILLEGAL_OFFSET},
        ),
        (
            "pull unknown queue",
            "PullMessage",
            svc.PullMessageRequest(
                group=_resource(GROUP),
                message_queue=_queue(queue_id=99_999),
                offset=0,
                batch_size=1,
            ),
            {C.BAD_REQUEST, C.NOT_FOUND},
        ),
        (
            "pull far offset",
            "PullMessage",
            svc.PullMessageRequest(
                group=_resource(GROUP), message_queue=_queue(), offset=huge, batch_size=1
            ),
            {C.ILLEGAL_OFFSET},
        ),
        (
            "pull zero batch",
            "PullMessage",
            svc.PullMessageRequest(
                group=_resource(GROUP), message_queue=_queue(), offset=0, batch_size=0
            ),
            {C.BAD_REQUEST},
        ),
        (
            "update negative offset",
            "UpdateOffset",
            svc.UpdateOffsetRequest(group=_resource(GROUP), message_queue=_queue(), offset=-5),
            {C.ILLEGAL_OFFSET, C.BAD_REQUEST},
        ),
        (
            "get never committed offset",
            "GetOffset",
            svc.GetOffsetRequest(group=_resource(GROUP), message_queue=_queue()),
            {C.OFFSET_NOT_FOUND},
        ),
        (
            "query offset unknown policy",
            "QueryOffset",
            svc.QueryOffsetRequest(message_queue=_queue(), query_offset_policy=7),
            {C.BAD_REQUEST},
        ),
        (
            "query offset by missing time",
            "QueryOffset",
            svc.QueryOffsetRequest(
                message_queue=_queue(), query_offset_policy=pb.QueryOffsetPolicy.TIMESTAMP
            ),
            {C.BAD_REQUEST},
        ),
        (
            "end unknown transaction",
            "EndTransaction",
            svc.EndTransactionRequest(
                topic=_resource(TOPIC),
                message_id="X",
                transaction_id="nope",
                resolution=pb.TransactionResolution.COMMIT,
            ),
            {C.UNSUPPORTED, C.INVALID_TRANSACTION_ID, C.NOT_FOUND, C.BAD_REQUEST},
        ),
        (
            "recall garbage",
            "RecallMessage",
            svc.RecallMessageRequest(topic=_resource(TOPIC), recall_handle="garbage"),
            {C.UNSUPPORTED, C.BAD_REQUEST, C.ILLEGAL_MESSAGE_ID, C.NOT_FOUND},
        ),
    ]
    receive_cases = [
        ("receive without group", _receive(group=pb.Resource()), {C.BAD_REQUEST}),
        ("receive zero batch", _receive(batch_size=0), {C.BAD_REQUEST}),
        ("receive huge batch", _receive(batch_size=2**31 - 1), {C.MESSAGE_NOT_FOUND, C.OK}),
        (
            "receive huge invisible time",
            _receive(invisible_duration=Duration(seconds=10**12)),
            {C.ILLEGAL_INVISIBLE_TIME},
        ),
        (
            "receive tiny invisible time",
            _receive(invisible_duration=Duration(nanos=1)),
            {C.ILLEGAL_INVISIBLE_TIME},
        ),
        (
            "receive bad SQL",
            _receive(
                filter_expression=pb.FilterExpression(type=pb.FilterType.SQL, expression="a > ")
            ),
            {C.ILLEGAL_FILTER_EXPRESSION},
        ),
        (
            "receive bad tag expression",
            _receive(
                filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="||")
            ),
            {C.ILLEGAL_FILTER_EXPRESSION, C.MESSAGE_NOT_FOUND},
        ),
        (
            "receive unknown topic",
            _receive(message_queue=_queue("no-such-topic")),
            {C.TOPIC_NOT_FOUND},
        ),
        (
            "receive negative poll",
            _receive(long_polling_timeout=Duration(seconds=-100)),
            {C.MESSAGE_NOT_FOUND, C.OK, C.ILLEGAL_POLLING_TIME},
        ),
    ]
    cases += [(name, "ReceiveMessage", request, codes) for name, request, codes in receive_cases]
    return cases


@pytest.mark.parametrize("case", _bad_requests(), ids=lambda case: case[0])
def test_well_formed_wrong_requests_get_actionable_codes(
    raw: RawClient, case: tuple[str, str, object, set[int]]
) -> None:
    name, method, request, expected = case
    code = _unary(raw, method, request)
    assert code in expected, (
        f"{name}: got {Code.Name(code)}, expected one of {[Code.Name(c) for c in expected]}"
    )


def test_telemetry_answers_settings_and_rejects_bad_subscriptions(raw: RawClient) -> None:
    good = templates()["Telemetry"]
    bad = svc.TelemetryCommand()
    bad.CopyFrom(good)  # type: ignore[arg-type]
    bad.settings.subscription.subscriptions[0].expression.type = pb.FilterType.SQL
    bad.settings.subscription.subscriptions[0].expression.expression = "(a = 1"
    code, responses = raw.call("Telemetry", [good.SerializeToString(), bad.SerializeToString()])  # type: ignore[attr-defined]
    assert code == grpc.StatusCode.OK
    answers = [svc.TelemetryCommand.FromString(r) for r in responses]
    assert [a.status.code for a in answers] == [Code.OK, Code.ILLEGAL_FILTER_EXPRESSION]
    assert answers[0].settings.subscription.receive_batch_size > 0
    assert answers[0].settings.backoff_policy.max_attempts == 17
    assert (
        "position" in answers[1].status.message
        or "column" in answers[1].status.message
        or "at " in answers[1].status.message
    )


def test_after_all_that_send_and_receive_still_work(server: ServerProcess, raw: RawClient) -> None:
    body = b"still standing " + uuid.uuid4().hex.encode()
    send = svc.SendMessageRequest(messages=[_message(body=body)])
    code, responses = raw.call("SendMessage", [send.SerializeToString()])
    assert code == grpc.StatusCode.OK
    answer = svc.SendMessageResponse.FromString(responses[0])
    assert answer.status.code == Code.OK, answer.status.message
    wanted_id = answer.entries[0].message_id

    def receive_once() -> list[pb.Message]:
        request = _receive(batch_size=32)
        request.long_polling_timeout.seconds = 2
        code, responses = raw.call("ReceiveMessage", [request.SerializeToString()], timeout=10)
        assert code == grpc.StatusCode.OK
        decoded = [svc.ReceiveMessageResponse.FromString(r) for r in responses]
        return [d.message for d in decoded if d.HasField("message")]

    deadline = time.monotonic() + 15
    found: list[pb.Message] = []
    while time.monotonic() < deadline and not any(
        m.system_properties.message_id == wanted_id for m in found
    ):
        found += receive_once()
    match = [m for m in found if m.system_properties.message_id == wanted_id]
    assert match and match[0].body == body
    assert server.alive()
    assert not [
        line for line in server.lines if "rpc_internal_error" in line or "Traceback" in line
    ], server.log_tail()
