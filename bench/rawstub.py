"""Raw protocol calls shared by the benchmarks that drive the stubs directly.

The requests are shaped like the official clients' (one ReceiveMessage
stream of status + messages, one AckMessage with many entries), so the
benchmarks measure the server, not a client library.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

Metadata = tuple[tuple[str, str], ...]


class RequestFailed(RuntimeError):
    """The server answered a request with a non-OK status."""


def check_status(status: pb.Status, rpc: str) -> None:
    if status.code != pb.Code.OK:
        raise RequestFailed(f"{rpc} answered {pb.Code.Name(status.code)}: {status.message}")


async def receive(
    stub: service_pb2_grpc.MessagingServiceStub,
    metadata: Metadata,
    group: str,
    topic: str,
    *,
    batch: int,
    invisible_seconds: int,
    long_poll: float,
    rpc_timeout: float,
) -> list[pb.Message]:
    """One long-polling ReceiveMessage; an empty poll (MESSAGE_NOT_FOUND) is no error."""
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(
            topic=pb.Resource(name=topic), id=-1, permission=pb.Permission.READ_WRITE
        ),
        filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        batch_size=batch,
        auto_renew=False,
    )
    request.invisible_duration.seconds = invisible_seconds
    request.long_polling_timeout.FromMilliseconds(int(long_poll * 1000))
    messages = []
    call = stub.ReceiveMessage(request, metadata=metadata, timeout=long_poll + rpc_timeout)
    async for response in call:
        kind = response.WhichOneof("content")
        if kind == "message":
            messages.append(response.message)
        elif kind == "status" and response.status.code not in (
            pb.Code.OK,
            pb.Code.MESSAGE_NOT_FOUND,
        ):
            check_status(response.status, "ReceiveMessage")
    return messages


async def ack(
    stub: service_pb2_grpc.MessagingServiceStub,
    metadata: Metadata,
    group: str,
    topic: str,
    messages: list[pb.Message],
    *,
    rpc_timeout: float,
) -> None:
    """Ack ``messages`` in one AckMessage request."""
    entries = [
        svc.AckMessageEntry(
            message_id=m.system_properties.message_id,
            receipt_handle=m.system_properties.receipt_handle,
        )
        for m in messages
    ]
    request = svc.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries
    )
    response = await stub.AckMessage(request, metadata=metadata, timeout=rpc_timeout)
    check_status(response.status, "AckMessage")
