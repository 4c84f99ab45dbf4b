"""PullMessage and the offset RPCs (pull consumers, broadcasting, the Spark connector), in
process."""

from __future__ import annotations

import asyncio
import time
import uuid

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.server.inprocess import InProcess, run

GROUP = "pullers"
TOPIC = "single"  # one queue, so offsets are easy to predict


def queue(queue_id: int) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue_id)


async def send(endpoint: InProcess, body: bytes) -> svc.SendResultEntry:
    if TOPIC not in {t.name for t in endpoint.broker.list_topics()}:
        endpoint.broker.create_topic(TOPIC, queue_count=1)
    message = pb.Message(
        topic=pb.Resource(name=TOPIC),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex, message_type=pb.MessageType.NORMAL
        ),
    )
    answer = await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=[message]))
    assert answer.status.code == pb.Code.OK, answer.status.message
    return answer.entries[0]


async def pull(
    endpoint: InProcess, queue_id: int, offset: int, poll_seconds: int = 0
) -> tuple[int, list[pb.Message], int]:
    request = svc.PullMessageRequest(
        group=pb.Resource(name=GROUP), message_queue=queue(queue_id), offset=offset, batch_size=16
    )
    request.long_polling_timeout.seconds = poll_seconds
    code, messages, next_offset = None, [], -1
    async for response in endpoint.stub.PullMessage(request, timeout=poll_seconds + 5):
        kind = response.WhichOneof("content")
        if kind == "status":
            code = response.status.code
        elif kind == "message":
            messages.append(response.message)
        else:
            next_offset = response.next_offset
    assert code is not None
    return code, messages, next_offset


def test_pull_reads_by_offset_and_long_polls_for_the_next_message() -> None:
    async def scenario(endpoint: InProcess) -> None:
        await send(endpoint, b"m0")
        await send(endpoint, b"m1")
        queue_id = 0
        code, messages, next_offset = await pull(endpoint, queue_id, 0)
        assert (
            code == pb.Code.OK and [m.body for m in messages] == [b"m0", b"m1"] and next_offset == 2
        )

        # Nothing at offset 2 yet: the pull parks and returns as soon as m2 lands.
        parked = asyncio.create_task(pull(endpoint, queue_id, 2, poll_seconds=5))
        await endpoint.until_parked()
        sent_at = time.monotonic()
        await send(endpoint, b"m2")
        code, messages, next_offset = await parked
        assert code == pb.Code.OK and [m.body for m in messages] == [b"m2"] and next_offset == 3
        assert time.monotonic() - sent_at < 1, "the pull waited out its poll instead of waking"

        # An empty poll answers MESSAGE_NOT_FOUND with where to continue.
        code, messages, next_offset = await pull(endpoint, queue_id, 3)
        assert (code, messages, next_offset) == (pb.Code.MESSAGE_NOT_FOUND, [], 3)

    run(scenario)


def test_offsets_round_trip_and_query_by_policy() -> None:
    async def scenario(endpoint: InProcess) -> None:
        for i in range(3):
            await send(endpoint, f"m{i}".encode())
        queue_id = 0
        stub = endpoint.stub
        missing = await stub.GetOffset(
            svc.GetOffsetRequest(group=pb.Resource(name=GROUP), message_queue=queue(queue_id))
        )
        assert missing.status.code == pb.Code.OFFSET_NOT_FOUND
        updated = await stub.UpdateOffset(
            svc.UpdateOffsetRequest(
                group=pb.Resource(name=GROUP), message_queue=queue(queue_id), offset=2
            )
        )
        assert updated.status.code == pb.Code.OK
        got = await stub.GetOffset(
            svc.GetOffsetRequest(group=pb.Resource(name=GROUP), message_queue=queue(queue_id))
        )
        assert (got.status.code, got.offset) == (pb.Code.OK, 2)
        beyond = await stub.UpdateOffset(
            svc.UpdateOffsetRequest(
                group=pb.Resource(name=GROUP), message_queue=queue(queue_id), offset=99
            )
        )
        assert beyond.status.code == pb.Code.ILLEGAL_OFFSET

        async def query(policy: int, **fields: object) -> int:
            answer = await stub.QueryOffset(
                svc.QueryOffsetRequest(
                    message_queue=queue(queue_id), query_offset_policy=policy, **fields
                )
            )
            assert answer.status.code == pb.Code.OK, answer.status.message
            return answer.offset

        assert await query(pb.QueryOffsetPolicy.BEGINNING) == 0
        assert await query(pb.QueryOffsetPolicy.END) == 3
        future = pb.SystemProperties().store_timestamp.__class__(seconds=int(time.time()) + 3600)
        assert await query(pb.QueryOffsetPolicy.TIMESTAMP, timestamp=future) == 3

    run(scenario)
