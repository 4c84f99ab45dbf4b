"""The client's message conversions (pure functions)."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.client.message import view_of


def test_server_added_properties_become_fields_not_user_properties() -> None:
    # The server hands the message group and a transaction id over among the user
    # properties, as RocketMQ's proxy does; this client's views keep only the
    # producer's own properties, so a received message can be sent on unchanged.
    wire = pb.Message(
        topic=pb.Resource(name="t"),
        body=b"x",
        user_properties={
            "p": "1",
            "__SHARDINGKEY": "order-7",
            "__transactionId__": "T00000000000000070123ABCD",
        },
        system_properties=pb.SystemProperties(message_id="M", message_group="order-7"),
    )
    view = view_of(wire)
    assert view.properties == {"p": "1"}
    assert view.message_group == "order-7"
    assert view.transaction_id == "T00000000000000070123ABCD"


def test_a_plain_message_has_no_transaction_id() -> None:
    wire = pb.Message(
        topic=pb.Resource(name="t"),
        body=b"x",
        user_properties={"p": "1"},
        system_properties=pb.SystemProperties(message_id="M"),
    )
    view = view_of(wire)
    assert (view.properties, view.message_group, view.transaction_id) == ({"p": "1"}, None, "")


def test_every_field_of_a_received_message() -> None:
    sp = pb.SystemProperties(
        message_id="M",
        tag="tagA",
        keys=["k1", "k2"],
        message_type=pb.MessageType.TRANSACTION,
        born_host="10.0.0.1",
        queue_id=3,
        queue_offset=17,
        delivery_attempt=2,
        receipt_handle="rh",
    )
    sp.born_timestamp.seconds, sp.born_timestamp.nanos = 1_700_000_000, 123_000_000
    sp.store_timestamp.seconds = 1_700_000_001
    sp.delivery_timestamp.seconds = 1_700_000_005
    wire = pb.Message(topic=pb.Resource(name="t"), body=b"x", system_properties=sp)
    view = view_of(wire, "ep:1")
    assert (view.topic, view.body, view.message_id, view.tag, view.keys) == (
        "t", b"x", "M", "tagA", ["k1", "k2"]
    )  # fmt: skip
    assert (view.born_timestamp, view.store_timestamp, view.delivery_timestamp) == (
        1_700_000_000_123, 1_700_000_001_000, 1_700_000_005_000
    )  # fmt: skip
    assert (view.born_host, view.queue_id, view.queue_offset, view.delivery_attempt) == (
        "10.0.0.1", 3, 17, 2
    )  # fmt: skip
    assert (view.message_type, view.receipt_handle, view.endpoint) == ("TRANSACTION", "rh", "ep:1")


def test_unset_and_unknown_fields_of_a_received_message() -> None:
    sp = pb.SystemProperties(message_id="M", tag="", message_group="")
    sp.message_type = 99  # a type newer than this client
    view = view_of(pb.Message(topic=pb.Resource(name="t"), body=b"x", system_properties=sp))
    assert (view.tag, view.message_group, view.delivery_timestamp, view.receipt_handle) == (
        None, None, None, None
    )  # fmt: skip
    assert view.message_type == "NORMAL"
