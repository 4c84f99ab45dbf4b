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
column: Spark takes them without converting row by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from rocketmq.grpc_protocol import definition_pb2

pb = definition_pb2
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


def _micros(ts: Any) -> int:
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
