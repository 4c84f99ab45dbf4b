"""Telemetry streams in process: the Settings handshake and commands pushed to live producers.

These run the servicer on an in-process grpc.aio server over the in-memory
store, so the registry (the seam the transaction check service uses to ask
a producer about an orphaned transaction) can be driven directly.
"""

from __future__ import annotations

import asyncio

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.server.check_sender import recover_orphaned_transaction_command
from tests.server.inprocess import InProcess, run


def producer_settings(topic: str) -> svc.TelemetryCommand:
    settings = pb.Settings(client_type=pb.ClientType.PRODUCER)
    settings.publishing.topics.add(name=topic)
    return svc.TelemetryCommand(settings=settings)


async def open_producer_stream(
    stub: service_pb2_grpc.MessagingServiceStub, client_id: str, topic: str
) -> tuple[grpc.aio.StreamStreamCall, svc.TelemetryCommand]:
    call = stub.Telemetry(metadata=(("x-mq-client-id", client_id),))
    await call.write(producer_settings(topic))
    answer = await asyncio.wait_for(call.read(), 5)
    return call, answer


def test_producer_settings_are_answered_with_publishing_limits() -> None:
    run(producer_settings_are_answered)


async def producer_settings_are_answered(endpoint: InProcess) -> None:
    call, answer = await open_producer_stream(endpoint.stub, "producer-1", "orders")
    assert answer.status.code == pb.Code.OK
    assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert answer.settings.publishing.validate_message_type
    assert answer.settings.backoff_policy.max_attempts == 3
    assert answer.settings.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    call.cancel()


def test_commands_reach_a_live_producer_of_the_topic_only() -> None:
    run(commands_reach_live_producer)


async def commands_reach_live_producer(endpoint: InProcess) -> None:
    orders, _ = await open_producer_stream(endpoint.stub, "producer-orders", "orders")
    other, _ = await open_producer_stream(endpoint.stub, "producer-other", "payments")
    registry = endpoint.registry
    assert [s.client_id for s in registry.producers(topic="orders")] == ["producer-orders"]

    message = pb.Message(topic=pb.Resource(name="orders"), body=b"half")
    chosen = registry.send_to_producer(
        recover_orphaned_transaction_command(message, "tx-1"), topic="orders"
    )
    assert chosen == "producer-orders"
    command = await asyncio.wait_for(orders.read(), 5)
    assert command.recover_orphaned_transaction_command.transaction_id == "tx-1"
    assert command.recover_orphaned_transaction_command.message.body == b"half"

    # From another thread (the broker's tick thread does this).
    future = registry.send_to_producer_threadsafe(
        recover_orphaned_transaction_command(message, "tx-2"), topic="orders"
    )
    assert await asyncio.wrap_future(future) == "producer-orders"
    command = await asyncio.wait_for(orders.read(), 5)
    assert command.recover_orphaned_transaction_command.transaction_id == "tx-2"

    assert (
        registry.send_to_producer(
            recover_orphaned_transaction_command(message, "tx-3"), topic="nobody"
        )
        is None
    )
    other.cancel()
    orders.cancel()


def test_a_closed_stream_is_no_longer_a_command_target() -> None:
    run(closed_stream_is_no_target)


async def closed_stream_is_no_target(endpoint: InProcess) -> None:
    call, _ = await open_producer_stream(endpoint.stub, "producer-gone", "orders")
    await call.done_writing()
    # The server ends its side when the client half-closes.
    assert await asyncio.wait_for(call.read(), 5) == grpc.aio.EOF
    assert endpoint.registry.producers(topic="orders") == []
    terminated = await endpoint.stub.NotifyClientTermination(
        svc.NotifyClientTerminationRequest(), metadata=(("x-mq-client-id", "producer-gone"),)
    )
    assert terminated.status.code == pb.Code.OK
    assert endpoint.registry.get("producer-gone") is None
