"""The sink's half messages, encoded from Arrow columns: the same bytes' meaning as the protobuf
library's message, and each bad row refused with the sink's error."""

from __future__ import annotations

import pyarrow as pa
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.message import Message, to_timestamp, to_wire
from halfmoon.client.transaction import (
    BATCH_TRANSACTION_TIMEOUT_MS,
    PROPERTY_TRANSACTION_GROUP,
    PROPERTY_TRANSACTION_TIMEOUT,
)
from halfmoon.spark.half_wire import HalfEncoder, varint
from halfmoon.spark.sink import SinkError, _encoded_rows

BORN_MS = 1_764_033_333_123


def expected(message: Message, message_id: str, group: str) -> pb.Message:
    message.properties[PROPERTY_TRANSACTION_GROUP] = group
    # A batch's group asks for the longest timeout the broker allows by default.
    message.properties[PROPERTY_TRANSACTION_TIMEOUT] = str(BATCH_TRANSACTION_TIMEOUT_MS)
    wire = to_wire(message, message_id, transactional=True)
    wire.system_properties.born_timestamp.CopyFrom(to_timestamp(BORN_MS))
    wire.system_properties.born_host = "10.1.2.3"
    return wire


def decoded(*encoded: bytes) -> list[pb.Message]:
    return list(svc.SendMessageRequest.FromString(b"".join(encoded)).messages)


def test_varint_matches_protobuf_for_small_and_large_values() -> None:
    for value in (0, 1, 127, 128, 300, 2**31, 2**63 - 1):
        assert svc.SendResultEntry.FromString(b"\x20" + varint(value)).offset == value


@pytest.mark.parametrize(
    "message",
    [
        Message("out", b"x"),
        Message("out", b"b" * 70_000, tag="t", keys=["k1", "k2"], properties={"a": "b"}),
        Message("other", "héllo".encode(), keys=["ü"], message_group="fifo-1"),
        # A row naming the group property itself: the group's wins, as send_halves does.
        Message("out", b"y", properties={PROPERTY_TRANSACTION_GROUP: "forged", "z": ""}),
    ],
)
def test_encoded_half_reads_back_as_the_protobuf_message(message: Message) -> None:
    encoder = HalfEncoder("s1:0:run", "10.1.2.3", BORN_MS)
    encoded = encoder.encode(
        message.topic,
        message.body,
        "01ABC",
        message.keys,
        message.tag,
        dict(message.properties),
        message.message_group,
    )
    (got,) = decoded(encoded)
    assert got == expected(message, "01ABC", "s1:0:run")


def test_rows_become_halves_column_by_column_with_defaults() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "body": ["text", "more"],
            "topic": [None, "elsewhere"],
            "keys": ["one", None],
            "properties": [[("p", "1")], None],
        },
        schema=pa.schema(
            [
                ("body", pa.string()),
                ("topic", pa.string()),
                ("keys", pa.string()),
                ("properties", pa.map_(pa.string(), pa.string())),
            ]
        ),
    )
    rows = list(_encoded_rows(batch, "out", HalfEncoder("g", "h", BORN_MS)))
    assert [topic for topic, _ in rows] == ["out", "elsewhere"]
    first, second = decoded(*(encoded for _, encoded in rows))
    assert (first.topic.name, first.body, list(first.system_properties.keys)) == (
        "out",
        b"text",
        ["one"],
    )
    assert dict(first.user_properties) == {
        "p": "1",
        PROPERTY_TRANSACTION_GROUP: "g",
        PROPERTY_TRANSACTION_TIMEOUT: str(BATCH_TRANSACTION_TIMEOUT_MS),
    }
    assert (second.topic.name, second.body, list(second.system_properties.keys)) == (
        "elsewhere",
        b"more",
        [],
    )
    assert first.system_properties.message_id != second.system_properties.message_id
    assert second.system_properties.message_type == pb.MessageType.TRANSACTION


@pytest.mark.parametrize(
    ("columns", "default_topic", "says"),
    [
        ({"value": [b"x"]}, "out", "needs a 'body' column"),
        ({"body": [b"x"]}, None, "no target topic"),
        ({"body": [b"x", None]}, "out", "null body"),
        ({"body": [b"x", b""]}, "out", "empty body"),
        ({"body": [b"x"], "topic": [""]}, None, "has no topic"),
    ],
)
def test_bad_rows_fail_the_task_with_the_sink_error(
    columns: dict[str, list[object]], default_topic: str | None, says: str
) -> None:
    batch = pa.RecordBatch.from_pydict(columns)
    with pytest.raises(SinkError, match=says) as info:
        list(_encoded_rows(batch, default_topic, HalfEncoder("g", "h", BORN_MS)))
    assert info.value.code == "SPARK_SINK_ERROR"
