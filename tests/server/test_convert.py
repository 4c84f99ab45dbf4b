"""Protobuf ⇄ broker conversion and the error → Code mapping (pure functions)."""

from __future__ import annotations

import gzip
import hashlib
import zlib

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.broker.errors import BodyDigestMismatch, GroupNotFound, TopicExists, TopicNotFound
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView
from halfmoon.errors import HalfmoonError, InvalidArgument
from halfmoon.server import convert
from halfmoon.server.errors import (
    RequestError,
    Unsupported,
    code_for,
    rocketmq_wording,
    status_for,
)


def wire(body: bytes = b"payload", **system: object) -> pb.Message:
    props = pb.SystemProperties(message_id="ID1")
    for key, value in system.items():
        if hasattr(value, "CopyFrom"):
            getattr(props, key).CopyFrom(value)
        elif isinstance(value, list):
            getattr(props, key).extend(value)
        else:
            setattr(props, key, value)
    return pb.Message(
        topic=pb.Resource(name="t"), body=body, system_properties=props, user_properties={"k": "v"}
    )


@pytest.mark.parametrize(
    ("kind", "checksum"),
    [
        (pb.DigestType.CRC32, format(zlib.crc32(b"payload"), "08X")),
        (pb.DigestType.CRC32, str(zlib.crc32(b"payload"))),  # the Node.js client's decimal form
        (pb.DigestType.MD5, hashlib.md5(b"payload").hexdigest().upper()),
        (pb.DigestType.SHA1, hashlib.sha1(b"payload").hexdigest()),
    ],
)
def test_matching_digests_pass(kind: int, checksum: str) -> None:
    msg = convert.outgoing_message(wire(body_digest=pb.Digest(type=kind, checksum=checksum)))
    assert msg.body == b"payload"


def test_a_wrong_digest_is_message_corrupted() -> None:
    with pytest.raises(BodyDigestMismatch) as caught:
        convert.outgoing_message(wire(body_digest=pb.Digest(type=pb.DigestType.MD5, checksum="00")))
    assert code_for(caught.value) == pb.Code.MESSAGE_CORRUPTED


def test_gzip_bodies_are_inflated_and_garbage_is_a_bad_request() -> None:
    msg = convert.outgoing_message(
        wire(body=gzip.compress(b"x" * 1000), body_encoding=pb.Encoding.GZIP)
    )
    assert msg.body == b"x" * 1000
    with pytest.raises(RequestError):
        convert.outgoing_message(wire(body=b"not gzip", body_encoding=pb.Encoding.GZIP))


def test_fields_types_and_times_reach_the_broker_message() -> None:
    deliver = pb.SystemProperties().delivery_timestamp.__class__(
        seconds=1_800_000_000, nanos=250_000_000
    )
    msg = convert.outgoing_message(
        wire(
            tag="T",
            keys=["a", "b"],
            message_type=pb.MessageType.DELAY,
            delivery_timestamp=deliver,
            born_host="h",
        ),
        peer_host="peer",
    )
    assert (msg.tag, msg.keys, msg.properties, msg.message_id) == (
        "T",
        ["a", "b"],
        {"k": "v"},
        "ID1",
    )
    assert msg.message_type is MessageType.DELAY and msg.delivery_timestamp == 1_800_000_000_250
    assert msg.born_host == "h"
    # Unset type is inferred: a message group makes it FIFO.
    assert convert.outgoing_message(wire(message_group="g")).message_type is MessageType.FIFO
    # Milliseconds put in the seconds field (the Python client's docs say ms) still work.
    millis = pb.SystemProperties().delivery_timestamp.__class__(seconds=1_800_000_000_123)
    assert (
        convert.outgoing_message(wire(delivery_timestamp=millis)).delivery_timestamp
        == 1_800_000_000_123
    )


def test_unsupported_types_and_empty_bodies_are_refused() -> None:
    with pytest.raises(Unsupported):
        convert.outgoing_message(wire(message_type=99))
    with pytest.raises(RequestError) as caught:
        convert.outgoing_message(wire(body=b""))
    assert code_for(caught.value) == pb.Code.MESSAGE_BODY_EMPTY


def test_filters() -> None:
    assert convert.filter_spec(None) == FilterSpec()
    assert convert.filter_spec(
        pb.FilterExpression(type=pb.FilterType.TAG, expression="")
    ) == FilterSpec("TAG", "*")
    assert convert.filter_spec(
        pb.FilterExpression(type=pb.FilterType.SQL, expression=" a > 1 ")
    ) == FilterSpec("SQL92", "a > 1")


def test_delivered_messages_carry_handle_attempt_and_an_md5_digest() -> None:
    view = MessageView(
        topic="t",
        queue_id=3,
        queue_offset=42,
        message_id="M",
        body=b"body",
        tag="T",
        keys=["k"],
        properties={"p": "1"},
        message_type=MessageType.FIFO,
        message_group="g",
        delivery_timestamp=None,
        born_timestamp=1000,
        born_host="b",
        store_timestamp=2000,
        store_host="s",
        commit_log_offset=7,
        delivery_attempt=2,
        receipt_handle="RH",
        invisible_duration_ms=30_000,
    )
    msg = convert.wire_message(view)
    sp = msg.system_properties
    # The message group is a user property too, as RocketMQ's proxy delivers it.
    assert (msg.topic.name, msg.body, dict(msg.user_properties)) == (
        "t",
        b"body",
        {"p": "1", "__SHARDINGKEY": "g"},
    )
    assert view.properties == {"p": "1"}  # the view itself is left alone
    assert (sp.receipt_handle, sp.delivery_attempt, sp.queue_id, sp.queue_offset) == (
        "RH",
        2,
        3,
        42,
    )
    assert sp.message_type == pb.MessageType.FIFO and sp.message_group == "g"
    assert (
        sp.body_digest.type == pb.DigestType.MD5
        and sp.body_digest.checksum == hashlib.md5(b"body").hexdigest().upper()
    )
    assert sp.body_encoding == pb.Encoding.IDENTITY
    assert (
        convert.timestamp_ms(sp.born_timestamp) == 1000
        and convert.duration_ms(sp.invisible_duration) == 30_000
    )


def test_delivered_times_at_the_epoch_and_missing_fields_are_encoded_as_before() -> None:
    """Zero times are still present fields; absent optional fields stay absent; empty ids stay
    empty."""
    view = MessageView(
        topic="t",
        queue_id=-1,
        queue_offset=0,
        message_id="",
        body=b"x",
        tag=None,
        keys=[],
        properties={},
        message_type=MessageType.DELAY,
        message_group=None,
        delivery_timestamp=0,
        born_timestamp=0,
        born_host="",
        store_timestamp=1_700_000_000_123,
        store_host="",
        commit_log_offset=0,
        receipt_handle=None,
        invisible_duration_ms=0,
    )
    sp = convert.wire_message(view, "host:1").system_properties
    assert sp.HasField("born_timestamp") and convert.timestamp_ms(sp.born_timestamp) == 0
    assert sp.HasField("delivery_timestamp") and convert.timestamp_ms(sp.delivery_timestamp) == 0
    assert convert.timestamp_ms(sp.store_timestamp) == 1_700_000_000_123
    assert sp.HasField("invisible_duration") and convert.duration_ms(sp.invisible_duration) == 0
    assert (
        not sp.HasField("tag")
        and not sp.HasField("receipt_handle")
        and not sp.HasField("message_group")
    )
    assert (sp.queue_id, sp.store_host, list(sp.keys), sp.message_type) == (
        0,
        "host:1",
        [],
        pb.MessageType.DELAY,
    )


def test_sent_message_without_digest_properties_or_keys() -> None:
    msg = pb.Message(topic=pb.Resource(name="t"), body=b"plain")
    msg.system_properties.message_id = "ID2"
    out = convert.outgoing_message(msg, "10.0.0.1")
    assert (out.body, out.keys, out.properties, out.tag, out.born_host) == (
        b"plain",
        [],
        {},
        None,
        "10.0.0.1",
    )
    assert out.message_type is MessageType.NORMAL


def test_error_codes_map_through_their_class() -> None:
    assert code_for(TopicNotFound("t")) == pb.Code.TOPIC_NOT_FOUND
    assert code_for(TopicExists("t")) == pb.Code.BAD_REQUEST
    # An unknown code given when raised keeps the class's protocol Code: a caller's error
    # stays the caller's, anything else is the server's.
    assert code_for(InvalidArgument("x", code="SOMETHING_NEW")) == pb.Code.BAD_REQUEST
    assert code_for(HalfmoonError("x", code="SOMETHING_NEW")) == pb.Code.INTERNAL_ERROR
    answer = status_for(ZeroDivisionError("boom"), "SendMessage")
    assert answer.code == pb.Code.INTERNAL_ERROR and "SendMessage" in answer.message


def test_priority_and_lite_messages_in_and_out() -> None:
    msg = convert.outgoing_message(wire(message_type=pb.MessageType.PRIORITY, priority=5))
    assert (msg.message_type, msg.priority, msg.lite_topic) == (MessageType.PRIORITY, 5, None)
    msg = convert.outgoing_message(wire(message_type=pb.MessageType.LITE, lite_topic="s-1"))
    assert (msg.message_type, msg.lite_topic, msg.priority) == (MessageType.LITE, "s-1", None)
    # An empty lite topic reaches the broker, which refuses it with ILLEGAL_LITE_TOPIC.
    assert (
        convert.outgoing_message(wire(message_type=pb.MessageType.LITE, lite_topic="")).lite_topic
        == ""
    )
    # Unset type: inferred as RocketMQ's proxy does (FIFO > delay > priority > lite).
    assert convert.outgoing_message(wire(priority=1)).message_type is MessageType.PRIORITY
    assert convert.outgoing_message(wire(lite_topic="a")).message_type is MessageType.LITE
    # A priority on another type is dropped, as RocketMQ's broker drops it.
    msg = convert.outgoing_message(wire(message_type=pb.MessageType.NORMAL, priority=3))
    assert (msg.message_type, msg.priority) == (MessageType.NORMAL, None)

    view = MessageView(
        topic="t",
        queue_id=0,
        queue_offset=1,
        message_id="M",
        body=b"b",
        tag=None,
        keys=[],
        properties={},
        message_type=MessageType.LITE,
        message_group=None,
        delivery_timestamp=None,
        born_timestamp=1,
        born_host="h",
        store_timestamp=2,
        store_host="s",
        commit_log_offset=3,
        lite_topic="s-1",
    )
    sp = convert.wire_message(view).system_properties
    assert (sp.message_type, sp.lite_topic, sp.HasField("priority")) == (
        pb.MessageType.LITE,
        "s-1",
        False,
    )
    view.message_type, view.lite_topic, view.priority = MessageType.PRIORITY, None, 0
    sp = convert.wire_message(view).system_properties
    assert (sp.message_type, sp.priority, sp.HasField("lite_topic")) == (
        pb.MessageType.PRIORITY,
        0,
        False,
    )


def test_a_committed_transactional_message_shows_its_transaction_id_as_a_user_property() -> None:
    view = MessageView(
        topic="t",
        queue_id=0,
        queue_offset=0,
        message_id="M",
        body=b"x",
        tag=None,
        keys=[],
        properties={"p": "1"},
        message_type=MessageType.TRANSACTION,
        message_group=None,
        delivery_timestamp=None,
        born_timestamp=0,
        born_host="",
        store_timestamp=0,
        store_host="",
        commit_log_offset=0,
        transaction_id="T00000000000000070123ABCD",
    )
    assert dict(convert.wire_message(view).user_properties) == {
        "p": "1",
        "__transactionId__": "T00000000000000070123ABCD",
    }
    view.transaction_id = None
    assert dict(convert.wire_message(view).user_properties) == {"p": "1"}


def test_unknown_topic_and_group_add_rocketmqs_wording() -> None:
    topic = status_for(TopicNotFound("TopicTest-not-exists"), "QueryRoute")
    assert topic.code == pb.Code.TOPIC_NOT_FOUND
    # halfmoon's sentence first, then the text RocketMQ's proxy answers (the Node.js
    # client's own test matches /CODE: 17 {2}DESC: No topic route info .../).
    assert topic.message.startswith("topic 'TopicTest-not-exists' does not exist")
    assert topic.message.endswith(
        ". CODE: 17  DESC: No topic route info in name server for the topic: TopicTest-not-exists"
    )
    group = status_for(GroupNotFound("g1"), "ReceiveMessage")
    assert group.code == pb.Code.CONSUMER_GROUP_NOT_FOUND
    assert group.message.startswith("consumer group 'g1' does not exist")
    assert group.message.endswith(". subscription group [g1] does not exist")
    # Errors without a RocketMQ counterpart keep halfmoon's sentence alone.
    assert status_for(TopicExists("t")).message == TopicExists("t").message
    assert rocketmq_wording(HalfmoonError("x", code="TOPIC_NOT_FOUND")) == ""


def test_a_group_members_timeout_property_reaches_the_broker_message() -> None:
    half = wire(message_type=pb.MessageType.TRANSACTION)
    half.user_properties["__HM_TXN_GROUP"] = "g1"
    half.user_properties["__HM_TXN_TIMEOUT_MS"] = "5000"
    msg = convert.outgoing_message(half, producer_group="pg")
    assert (msg.transaction_group, msg.transaction_timeout_ms) == ("g1", 5000)
    assert msg.properties == {"k": "v"}  # both reserved properties are taken out
    half.user_properties["__HM_TXN_TIMEOUT_MS"] = "soon"
    with pytest.raises(HalfmoonError) as bad:
        convert.outgoing_message(half, producer_group="pg")
    assert bad.value.code == "ILLEGAL_TRANSACTION_TIMEOUT"
    assert code_for(bad.value) == pb.Code.BAD_REQUEST
