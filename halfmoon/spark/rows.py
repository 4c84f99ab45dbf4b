"""The source's row schema and the conversion of wire messages to Arrow record batches.

One schema for batch and streaming reads, modelled on Spark's Kafka source
(topic, partition → queue_id, offset → queue_offset, key → keys, timestamp →
born/store timestamps) plus what RocketMQ messages carry besides: tag,
user properties, FIFO message group, transaction id.

``transaction_id`` is the message id of a message that went through a
transaction (RocketMQ derives a transaction's id from its half message's id;
the committed message keeps that id), null for other messages. The reserved
transaction-group property never reaches readers, and neither do the
``__SHARDINGKEY`` and ``__transactionId__`` entries the server adds to the
user properties for RocketMQ's clients: ``properties`` holds what a producer
set, so a row can go back to the sink as it is.

Rows leave the reader as ``pyarrow.RecordBatch`` objects built column by
column: Spark takes them without converting row by row. A BulkRead answer
(:mod:`halfmoon.bulkread.format`) is already columnar, so
:func:`record_batch_of_columns` turns each of its lists into one Arrow array
(the server needs no pyarrow; this is the only place Arrow is built).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb

_TRANSACTION = pb.MessageType.TRANSACTION
_SERVER_ADDED = frozenset({"__SHARDINGKEY", "__transactionId__"})

SCHEMA_DDL = (
    "topic string, queue_id int, queue_offset bigint, message_id string, keys array<string>, "
    "tag string, properties map<string,string>, body binary, born_timestamp timestamp, "
    "store_timestamp timestamp, message_group string, transaction_id string"
)

ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("message_id", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("tag", pa.string()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("born_timestamp", pa.timestamp("us", tz="UTC")),
        ("store_timestamp", pa.timestamp("us", tz="UTC")),
        ("message_group", pa.string()),
        ("transaction_id", pa.string()),
    ]
)


def _micros(ts: timestamp_pb2.Timestamp) -> int:
    return ts.seconds * 1_000_000 + ts.nanos // 1000


def record_batch(messages: Sequence[pb.Message]) -> pa.RecordBatch:
    """The Arrow record batch (``ARROW_SCHEMA``) of ``messages`` in order."""
    topic, queue_id, offset, message_id, keys, tag, props, body = [], [], [], [], [], [], [], []
    born, stored, group, txn = [], [], [], []
    for m in messages:
        sp = m.system_properties
        topic.append(m.topic.name)
        queue_id.append(sp.queue_id)
        offset.append(sp.queue_offset)
        message_id.append(sp.message_id)
        keys.append(list(sp.keys))
        tag.append(sp.tag or None)
        props.append([(k, v) for k, v in m.user_properties.items() if k not in _SERVER_ADDED])
        body.append(m.body)
        born.append(_micros(sp.born_timestamp))
        stored.append(_micros(sp.store_timestamp))
        group.append(sp.message_group or None)
        txn.append(sp.message_id if sp.message_type == _TRANSACTION else None)
    columns = [
        pa.array(topic, pa.string()),
        pa.array(queue_id, pa.int32()),
        pa.array(offset, pa.int64()),
        pa.array(message_id, pa.string()),
        pa.array(keys, pa.list_(pa.string())),
        pa.array(tag, pa.string()),
        pa.array(props, pa.map_(pa.string(), pa.string())),
        pa.array(body, pa.binary()),
        pa.array(born, pa.timestamp("us", tz="UTC")),
        pa.array(stored, pa.timestamp("us", tz="UTC")),
        pa.array(group, pa.string()),
        pa.array(txn, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


_MS = pa.timestamp("ms", tz="UTC")
_US = pa.timestamp("us", tz="UTC")


def record_batch_of_columns(columns: Mapping[str, list[Any]], queue_id: int) -> pa.RecordBatch:
    """The Arrow record batch (``ARROW_SCHEMA``) of a BulkRead answer's columns."""
    count = len(columns["queue_offset"])
    message_ids = columns["message_id"]
    txn = [
        message_ids[i] if kind == "TRANSACTION" else None
        for i, kind in enumerate(columns["message_type"])
    ]
    arrays = [
        pa.array(columns["topic"], pa.string()),
        pa.repeat(pa.scalar(queue_id, pa.int32()), count),
        pa.array(columns["queue_offset"], pa.int64()),
        pa.array(message_ids, pa.string()),
        pa.array(columns["keys"], pa.list_(pa.string())),
        pa.array(columns["tag"], pa.string()),
        _map_array(columns["properties"]),
        pa.array(columns["body"], pa.binary()),
        pa.array(columns["born_timestamp"], _MS).cast(_US),
        pa.array(columns["store_timestamp"], _MS).cast(_US),
        pa.array(columns["message_group"], pa.string()),
        pa.array(txn, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _map_array(maps: list[dict[str, str]]) -> pa.Array:
    """A map<string,string> array from dicts, built from flat key and value lists."""
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    total = 0
    for entry in maps:
        if entry:
            keys.extend(entry)
            values.extend(entry.values())
            total += len(entry)
        offsets.append(total)
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string())
    )
