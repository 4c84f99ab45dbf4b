"""Reading a queue by offset through ``halfmoon.v1.BulkRead`` (docs/bulk-read.md).

``PullConsumer`` reads here: one call answers up to ``max_messages`` of a
queue's committed messages as columns, where PullMessage streams one
response per message. The call goes over the connection's channel with the
same headers (client id, namespace, signature) as every other call; a server
without the service (an older halfmoon, Apache RocketMQ) answers
UNIMPLEMENTED, which comes out as :class:`~halfmoon.client.errors.Unsupported`
so the caller can fall back to PullMessage.
"""

from __future__ import annotations

from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.bulkread.format import METHOD, BulkAnswer, BulkRequest, FormatError
from halfmoon.client.connection import Connection
from halfmoon.client.errors import ClientError, error_for_status
from halfmoon.client.message import MessageView
from halfmoon.client.route import QueueInfo
from halfmoon.client.selector import MessageSelector

RPC = "BulkRead"
MAX_BYTES = 4 * 1024 * 1024  # per answer, besides the caller's message count


async def bulk_read(
    connection: Connection,
    group: str,
    queue: QueueInfo,
    offset: int,
    max_messages: int,
    selector: MessageSelector,
    wait: float,
    timeout: float,
) -> tuple[list[MessageView], int]:
    """Messages at ``offset`` of ``queue`` and the offset to continue from, waiting up to
    ``wait`` seconds when there is none yet."""
    request = BulkRequest(
        group=group,
        topic=queue.topic,
        queue_id=queue.queue_id,
        offset=offset,
        max_messages=max_messages,
        max_bytes=MAX_BYTES,
        filter_kind=selector.kind,
        filter_expression=selector.expression,
        wait_ms=int(wait * 1000),
    )
    raw = await connection.call_raw(METHOD, request.encode(), rpc=RPC, timeout=wait + timeout)
    try:
        answer = BulkAnswer.decode(raw)
    except FormatError as exc:
        raise ClientError(f"{connection.target}: {exc}", rpc=RPC) from None
    if answer.code not in (pb.Code.OK, pb.Code.ILLEGAL_OFFSET):
        raise error_for_status(pb.Status(code=answer.code, message=answer.message), RPC)
    return views_of(answer, queue.queue_id, connection.target), answer.next_offset


def views_of(answer: BulkAnswer, queue_id: int, endpoint: str) -> list[MessageView]:
    """The answer's messages as the client's MessageView (what PullMessage would give)."""
    if not answer.count:
        return []
    c: dict[str, list[Any]] = answer.columns
    return [
        MessageView(
            topic=topic,
            body=body,
            message_id=message_id,
            tag=tag,
            keys=keys,
            properties=properties,
            message_group=group,
            delivery_timestamp=delivery,
            born_timestamp=born,
            store_timestamp=stored,
            born_host=born_host,
            queue_id=queue_id,
            queue_offset=offset,
            delivery_attempt=1,
            message_type=kind,
            endpoint=endpoint,
            transaction_id=txn or "",
        )
        for (
            topic,
            body,
            message_id,
            tag,
            keys,
            properties,
            group,
            delivery,
            born,
            stored,
            born_host,
            offset,
            kind,
            txn,
        ) in zip(
            c["topic"],
            c["body"],
            c["message_id"],
            c["tag"],
            c["keys"],
            c["properties"],
            c["message_group"],
            c["delivery_timestamp"],
            c["born_timestamp"],
            c["store_timestamp"],
            c["born_host"],
            c["queue_offset"],
            c["message_type"],
            c["transaction_id"],
            strict=True,
        )
    ]
