"""Namespaces on the gRPC endpoint, in process: requests resolve to stored names, answers
un-namespace."""

from __future__ import annotations

import asyncio
import uuid

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.server.inprocess import InProcess, run

HEADER = "x-mq-namespace"


def ns_metadata(namespace: str, client_id: str = "c-1") -> tuple[tuple[str, str], ...]:
    return (("x-mq-client-id", client_id), (HEADER, namespace))


def message(topic: pb.Resource, body: bytes) -> pb.Message:
    return pb.Message(
        topic=topic,
        body=body,
        system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex, message_type=pb.MessageType.NORMAL
        ),
    )


async def pull_all(endpoint: InProcess, group: pb.Resource, topic: pb.Resource, metadata=()):
    request = svc.PullMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=topic, id=0), offset=0, batch_size=16
    )
    statuses, messages = [], []
    async for response in endpoint.stub.PullMessage(request, metadata=metadata, timeout=5):
        kind = response.WhichOneof("content")
        if kind == "status":
            statuses.append(response.status)
        elif kind == "message":
            messages.append(response.message)
    return statuses[0], messages


def test_messages_are_stored_and_delivered_per_namespace() -> None:
    async def scenario(endpoint: InProcess) -> None:
        broker = endpoint.broker
        broker.create_topic("ns%orders", queue_count=1)
        broker.create_group("ns%billing")
        broker.create_group("billing")
        # Namespace on the message's Resource (the official Python and Node.js producers).
        sent = await endpoint.stub.SendMessage(
            svc.SendMessageRequest(
                messages=[message(pb.Resource(name="orders", resource_namespace="ns"), b"a")]
            )
        )
        assert sent.status.code == pb.Code.OK, sent.status
        # Namespace only in the header (the Node.js consumer's requests).
        status, got = await pull_all(
            endpoint,
            pb.Resource(name="billing"),
            pb.Resource(name="orders"),
            metadata=ns_metadata("ns"),
        )
        assert status.code == pb.Code.OK, status
        assert [m.body for m in got] == [b"a"]
        assert got[0].topic == pb.Resource(name="orders", resource_namespace="ns")
        # The bare topic (in_process creates "orders") received nothing.
        status, got = await pull_all(
            endpoint, pb.Resource(name="billing"), pb.Resource(name="orders")
        )
        assert status.code == pb.Code.MESSAGE_NOT_FOUND and got == []

    run(scenario)


def test_route_answers_name_the_topic_as_the_client_did() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_topic("ns%orders", queue_count=2)
        topic = pb.Resource(name="orders", resource_namespace="ns")
        answer = await endpoint.stub.QueryRoute(svc.QueryRouteRequest(topic=topic))
        assert answer.status.code == pb.Code.OK, answer.status
        assert [q.topic for q in answer.message_queues] == [topic, topic]
        missing = await endpoint.stub.QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name="orders")), metadata=ns_metadata("other")
        )
        assert missing.status.code == pb.Code.TOPIC_NOT_FOUND
        assert "other%orders" in missing.status.message

    run(scenario)


def test_a_resource_namespace_that_differs_from_the_header_is_a_bad_request() -> None:
    async def scenario(endpoint: InProcess) -> None:
        answer = await endpoint.stub.QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name="orders", resource_namespace="a")),
            metadata=ns_metadata("b"),
        )
        assert answer.status.code == pb.Code.BAD_REQUEST
        assert "x-mq-namespace" in answer.status.message
        bad = await endpoint.stub.SendMessage(
            svc.SendMessageRequest(
                messages=[message(pb.Resource(name="orders", resource_namespace="a b"), b"x")]
            )
        )
        assert bad.status.code == pb.Code.BAD_REQUEST
        assert "illegal namespace 'a b'" in bad.status.message

    run(scenario)


def test_telemetry_settings_register_stored_names_and_answer_the_clients() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_topic("ns%orders", queue_count=1)
        call = endpoint.stub.Telemetry(metadata=ns_metadata("ns", "producer-ns"))
        settings = pb.Settings(client_type=pb.ClientType.PRODUCER)
        settings.publishing.topics.add(name="orders")  # namespace from the header only
        await call.write(svc.TelemetryCommand(settings=settings))
        answer = await asyncio.wait_for(call.read(), 5)
        assert answer.status.code == pb.Code.OK, answer.status
        assert [t.name for t in answer.settings.publishing.topics] == ["orders"]
        # Transaction checks for ns%orders go to this producer, not to one of "orders".
        assert [s.client_id for s in endpoint.registry.producers(topic="ns%orders")] == [
            "producer-ns"
        ]
        assert endpoint.registry.producers(topic="orders") == []

        consumer = endpoint.stub.Telemetry(metadata=ns_metadata("ns", "consumer-ns"))
        sub = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER)
        sub.subscription.group.name = "billing"
        sub.subscription.group.resource_namespace = "ns"
        entry = sub.subscription.subscriptions.add()
        entry.topic.name = "orders"
        entry.expression.type = pb.FilterType.TAG
        entry.expression.expression = "*"
        await consumer.write(svc.TelemetryCommand(settings=sub))
        answer = await asyncio.wait_for(consumer.read(), 5)
        assert answer.status.code == pb.Code.OK, answer.status
        assert answer.settings.subscription.group.name == "billing"
        assert [s.client_id for s in endpoint.registry.consumers("ns%billing")] == ["consumer-ns"]
        call.cancel()
        consumer.cancel()

    run(scenario)
