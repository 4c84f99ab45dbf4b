"""Wire messages to Arrow rows (no Spark needed)."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.spark.rows import record_batch


def test_properties_hold_only_what_the_producer_set() -> None:
    # The server adds the message group and the transaction id to the user properties
    # for RocketMQ's clients; rows have columns for both, and a row must be able to go
    # back to the sink, which refuses those reserved names.
    message = pb.Message(
        topic=pb.Resource(name="t"),
        body=b"x",
        user_properties={"n": "1", "__SHARDINGKEY": "g", "__transactionId__": "T1"},
        system_properties=pb.SystemProperties(message_id="M", message_group="g"),
    )
    row = record_batch([message]).to_pylist()[0]
    assert row["properties"] == [("n", "1")]
    assert row["message_group"] == "g"
