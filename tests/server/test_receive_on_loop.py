"""A long poll woken by an arrival reads its messages on the event loop, not a worker thread."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.server.inprocess import InProcess, run

GROUP = "billing"


async def receive(endpoint: InProcess, long_poll_seconds: int) -> list[pb.Message]:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="orders"), id=-1),
        batch_size=32,
    )
    request.long_polling_timeout.seconds = long_poll_seconds
    request.invisible_duration.seconds = 30
    messages = []
    async for response in endpoint.stub.ReceiveMessage(request, timeout=long_poll_seconds + 5):
        if response.WhichOneof("content") == "message":
            messages.append(response.message)
    return messages


async def send(endpoint: InProcess, body: bytes) -> None:
    message = pb.Message(
        topic=pb.Resource(name="orders"),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex, message_type=pb.MessageType.NORMAL
        ),
    )
    answer = await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=[message]))
    assert answer.status.code == pb.Code.OK, answer.status.message


def count_worker_calls(endpoint: InProcess) -> list[str]:
    """The names of the broker calls the servicer hands to its worker threads from now on."""
    calls: list[str] = []
    workers = endpoint.servicer.workers
    original = workers.call

    async def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        called = getattr(fn, "func", fn)  # a Pending answer's write is a partial
        calls.append(getattr(called, "__name__", repr(called)))
        return await original(fn, *args, **kwargs)

    workers.call = counting  # type: ignore[method-assign]
    return calls


def test_a_woken_poll_answers_from_the_loop_without_a_worker_thread() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_group(GROUP, consume_from="earliest")
        assert await receive(endpoint, 0) == []  # the group's first contact with the topic
        calls = count_worker_calls(endpoint)
        poll = asyncio.create_task(receive(endpoint, 20))
        await endpoint.until_parked()
        await send(endpoint, b"hello")
        got = await asyncio.wait_for(poll, 5)
        assert [m.body for m in got] == [b"hello"]
        # Parking (with "hello" in flight next time, too) and the woken read: all on the loop.
        again = asyncio.create_task(receive(endpoint, 20))
        await endpoint.until_parked()
        await send(endpoint, b"world")
        assert [m.body for m in await asyncio.wait_for(again, 5)] == [b"world"]
        assert calls == []

    run(scenario)


def test_a_receive_the_loop_cannot_answer_goes_to_a_worker() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_group(GROUP, consume_from="earliest")
        await send(endpoint, b"first")
        calls = count_worker_calls(endpoint)
        # First contact: the start position may read the store's history, so a worker answers.
        got = await receive(endpoint, 0)
        assert [m.body for m in got] == [b"first"]
        assert calls == ["received_by_calls"]  # the Pending answer's write

    run(scenario)


def test_a_batch_ack_is_answered_from_the_loop_and_reports_each_entry() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_group(GROUP, consume_from="earliest")
        assert await receive(endpoint, 0) == []
        for body in (b"a", b"b"):
            await send(endpoint, body)
        got = await receive(endpoint, 0)
        assert len(got) == 2
        calls = count_worker_calls(endpoint)
        entries = [
            svc.AckMessageEntry(
                message_id=m.system_properties.message_id,
                receipt_handle=m.system_properties.receipt_handle,
            )
            for m in got
        ] + [svc.AckMessageEntry(message_id="x", receipt_handle="not-a-handle")]
        answer = await endpoint.stub.AckMessage(
            svc.AckMessageRequest(
                group=pb.Resource(name=GROUP), topic=pb.Resource(name="orders"), entries=entries
            )
        )
        assert answer.status.code == pb.Code.MULTIPLE_RESULTS
        codes = [e.status.code for e in answer.entries]
        assert codes[:2] == [pb.Code.OK, pb.Code.OK]
        assert codes[2] == pb.Code.INVALID_RECEIPT_HANDLE
        assert calls == []  # bookkeeping in memory: no worker thread

    run(scenario)


def test_a_message_without_born_host_is_stored_with_the_callers_address() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_group(GROUP, consume_from="earliest")
        await send(endpoint, b"anonymous")  # no born_host in its system properties
        named = pb.Message(
            topic=pb.Resource(name="orders"),
            body=b"named",
            system_properties=pb.SystemProperties(
                message_id=uuid.uuid4().hex,
                message_type=pb.MessageType.NORMAL,
                born_host="producer-7",
            ),
        )
        answer = await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=[named]))
        assert answer.status.code == pb.Code.OK
        got = {m.body: m.system_properties.born_host for m in await receive(endpoint, 0)}
        assert got[b"named"] == "producer-7"
        assert got[b"anonymous"].startswith("127.0.0.1:")  # the caller's address and port

    run(scenario)
