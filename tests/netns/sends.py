"""Sends through a proxy with the raw RocketMQ 5 gRPC stub, timed: what a client sees.

The official clients retry a failed send on another queue, which hides how long
one attempt took and what it answered; the partition tests need both.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

# Codes a RocketMQ client retries (the server's side of the 5xxxx range, and throttling).
RETRYABLE = {
    "INTERNAL_ERROR", "INTERNAL_SERVER_ERROR", "HA_NOT_AVAILABLE", "PROXY_TIMEOUT",
    "MASTER_PERSISTENCE_TIMEOUT", "SLAVE_PERSISTENCE_TIMEOUT", "TOO_MANY_REQUESTS",
}  # fmt: skip


@dataclass(frozen=True)
class Attempt:
    body: str
    code: str  # a protocol Code's name, or "DEADLINE_EXCEEDED"/"UNAVAILABLE" from gRPC itself
    message: str
    started: float  # time.time() when sent, and when the answer came
    answered: float

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    @property
    def seconds(self) -> float:
        return self.answered - self.started


class RawSender:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)

    def send(self, topic: str, body: str, timeout: float = 15.0) -> Attempt:
        message = pb.Message(
            topic=pb.Resource(name=topic),
            body=body.encode(),
            system_properties=pb.SystemProperties(
                message_id=uuid.uuid4().hex, message_type=pb.MessageType.NORMAL
            ),
        )
        started = time.time()
        try:
            answer = self.stub.SendMessage(
                svc.SendMessageRequest(messages=[message]), timeout=timeout
            )
            code, text = pb.Code.Name(answer.status.code), answer.status.message
        except grpc.RpcError as error:
            code, text = error.code().name, str(error.details())  # type: ignore[attr-defined]
        return Attempt(body, code, text, started, time.time())

    def close(self) -> None:
        self.channel.close()
