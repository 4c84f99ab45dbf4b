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
