"""Split a batch of wire messages into requests that each stay under a byte limit.

RocketMQ refuses a batch above 4 MiB; users should not have to write a
splitter. Messages keep their order: each request is a consecutive run of
the batch, as large as the limit allows. The size counted is the serialized
size of each message inside ``SendMessageRequest`` (its bytes plus the field
tag and length prefix), so the request on the wire is never above the limit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from rocketmq.grpc_protocol import definition_pb2

from halfmoon.client.errors import MessageBodyTooLarge

DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024


def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def framed_size(message: definition_pb2.Message) -> int:
    """Bytes ``message`` takes inside a SendMessageRequest (tag + length + payload)."""
    payload = message.ByteSize()
    return 1 + _varint_size(payload) + payload


def split_batch(
    messages: Sequence[definition_pb2.Message], max_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> Iterator[list[definition_pb2.Message]]:
    """Consecutive runs of ``messages`` whose framed size stays within ``max_bytes``.

    A single message larger than ``max_bytes`` on its own cannot be sent in any
    request and raises :class:`MessageBodyTooLarge`.
    """
    chunk: list[definition_pb2.Message] = []
    size = 0
    for message in messages:
        framed = framed_size(message)
        if framed > max_bytes:
            raise MessageBodyTooLarge(
                f"message {message.system_properties.message_id} is {framed} bytes on the wire, "
                "above the "
                f"{max_bytes}-byte request limit; send a smaller body (batches are split, single "
                "bodies are not)"
            )
        if chunk and size + framed > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append(message)
        size += framed
    if chunk:
        yield chunk
