"""Lite topics on the wire, in process: settings, SyncLiteSubscription, receive/ack, notices."""

from __future__ import annotations

import asyncio

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.message import MessageType
from halfmoon.server import lite_subscriptions
from tests.server.inprocess import InProcess, run

TOPIC, GROUP = "chat", "bots"
CODE = pb.Code


def meta(client_id: str) -> tuple[tuple[str, str], ...]:
    return (("x-mq-client-id", client_id),)


def resource(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def sync_request(
    action: int, *names: str, topic: str = TOPIC, **kw: object
) -> svc.SyncLiteSubscriptionRequest:
    return svc.SyncLiteSubscriptionRequest(
        action=action,
        topic=resource(topic),
        group=resource(GROUP),
        lite_topic_set=list(names),
        **kw,
    )


def lite_message(lite_topic: str, body: bytes) -> pb.Message:
    return pb.Message(
        topic=resource(TOPIC),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=f"id-{lite_topic}-{body.decode()}",
            message_type=pb.MessageType.LITE,
            lite_topic=lite_topic,
        ),
    )


async def lite_consumer_stream(
    endpoint: InProcess, client_id: str
) -> tuple[grpc.aio.StreamStreamCall, svc.TelemetryCommand]:
    settings = pb.Settings(client_type=pb.ClientType.LITE_PUSH_CONSUMER)
    settings.subscription.group.name = GROUP
    settings.subscription.subscriptions.add(topic=resource(TOPIC))
    call = endpoint.stub.Telemetry(metadata=meta(client_id))
    await call.write(svc.TelemetryCommand(settings=settings))
    return call, await asyncio.wait_for(call.read(), 5)


def setup(endpoint: InProcess) -> None:
    endpoint.broker.create_topic(TOPIC, MessageType.LITE, queue_count=1)
    endpoint.broker.create_group(GROUP)
    lite_subscriptions.install_notifier(endpoint.broker, endpoint.registry)


def test_lite_consumer_settings_carry_quota_and_name_limit() -> None:
    run(settings_carry_lite_limits)


async def settings_carry_lite_limits(endpoint: InProcess) -> None:
    setup(endpoint)
    call, answer = await lite_consumer_stream(endpoint, "lite-1")
    assert answer.status.code == CODE.OK
    assert answer.settings.subscription.HasField("lite_subscription_quota")
    assert answer.settings.subscription.lite_subscription_quota == 1000
    assert answer.settings.subscription.max_lite_topic_size == 64
    call.cancel()
    # A plain consumer's settings do not mention lite limits.
    settings = pb.Settings(client_type=pb.ClientType.SIMPLE_CONSUMER)
    settings.subscription.group.name = GROUP
    plain = endpoint.stub.Telemetry(metadata=meta("plain-1"))
    await plain.write(svc.TelemetryCommand(settings=settings))
    answer = await asyncio.wait_for(plain.read(), 5)
    assert not answer.settings.subscription.HasField("lite_subscription_quota")
    plain.cancel()


def test_sync_receive_ack_round_trip() -> None:
    run(sync_receive_ack)


async def receive(endpoint: InProcess, client_id: str, wait_s: int = 0) -> list[pb.Message]:
    request = svc.ReceiveMessageRequest(
        group=resource(GROUP),
        message_queue=pb.MessageQueue(topic=resource(TOPIC), id=0),
        batch_size=16,
        long_polling_timeout={"seconds": wait_s},
    )
    out = []
    async for answer in endpoint.stub.ReceiveMessage(request, metadata=meta(client_id)):
        if answer.WhichOneof("content") == "message":
            out.append(answer.message)
    return out


async def sync_receive_ack(endpoint: InProcess) -> None:
    setup(endpoint)
    stub = endpoint.stub
    sent = await stub.SendMessage(
        svc.SendMessageRequest(messages=[lite_message("s-1", b"a"), lite_message("s-2", b"b")])
    )
    assert [e.status.code for e in sent.entries] == [CODE.OK, CODE.OK]
    answer = await stub.SyncLiteSubscription(
        sync_request(pb.LiteSubscriptionAction.PARTIAL_ADD, "s-1"), metadata=meta("c1")
    )
    assert answer.status.code == CODE.OK
    [msg] = await receive(endpoint, "c1")
    sp = msg.system_properties
    assert (msg.body, sp.lite_topic, sp.message_type, msg.topic.name) == (
        b"a",
        "s-1",
        pb.MessageType.LITE,
        TOPIC,
    )
    assert await receive(endpoint, "other-client") == []
    entry = svc.AckMessageEntry(
        message_id=sp.message_id, receipt_handle=sp.receipt_handle, lite_topic=""
    )
    ack = await stub.AckMessage(
        svc.AckMessageRequest(group=resource(GROUP), topic=resource(TOPIC), entries=[entry])
    )
    assert ack.status.code == CODE.ILLEGAL_LITE_TOPIC  # an empty lite topic, refused here too
    entry.lite_topic = "s-1"
    ack = await stub.AckMessage(
        svc.AckMessageRequest(group=resource(GROUP), topic=resource(TOPIC), entries=[entry])
    )
    assert ack.status.code == CODE.OK

    # A parked receive wakes when a message reaches a subscribed lite topic.
    poll = asyncio.create_task(receive(endpoint, "c1", wait_s=5))
    await endpoint.until_parked()
    await stub.SendMessage(svc.SendMessageRequest(messages=[lite_message("s-1", b"c")]))
    got = await asyncio.wait_for(poll, 5)
    assert [m.body for m in got] == [b"c"]


def test_sync_errors_have_stable_codes() -> None:
    run(sync_errors)


async def sync_errors(endpoint: InProcess) -> None:
    setup(endpoint)
    endpoint.broker.create_topic("plain", MessageType.NORMAL, queue_count=1)
    stub, add = endpoint.stub, pb.LiteSubscriptionAction.PARTIAL_ADD

    async def code(request: svc.SyncLiteSubscriptionRequest, client_id: str = "c1") -> int:
        answer = await stub.SyncLiteSubscription(
            request, metadata=meta(client_id) if client_id else ()
        )
        return answer.status.code

    assert await code(sync_request(add, "")) == CODE.ILLEGAL_LITE_TOPIC
    assert await code(sync_request(add, "a b")) == CODE.ILLEGAL_LITE_TOPIC
    assert await code(sync_request(add, "x" * 65)) == CODE.ILLEGAL_LITE_TOPIC
    assert (
        await code(sync_request(pb.LiteSubscriptionAction.PARTIAL_REMOVE, ""))
        == CODE.ILLEGAL_LITE_TOPIC
    )
    assert await code(sync_request(add, "ok"), client_id="") == CODE.CLIENT_ID_REQUIRED
    assert await code(sync_request(add, "ok", topic="plain")) == CODE.ILLEGAL_TOPIC
    assert await code(sync_request(add, "ok", topic="missing")) == CODE.TOPIC_NOT_FOUND
    too_many = [f"t{i}" for i in range(1001)]
    assert await code(sync_request(add, *too_many)) == CODE.LITE_SUBSCRIPTION_QUOTA_EXCEEDED
    # The empty name is refused on send too, with the same code.
    sent = await stub.SendMessage(svc.SendMessageRequest(messages=[lite_message("", b"x")]))
    assert sent.status.code == CODE.ILLEGAL_LITE_TOPIC


def test_deleting_a_lite_topic_notifies_its_subscribers() -> None:
    run(delete_notifies)


async def delete_notifies(endpoint: InProcess) -> None:
    setup(endpoint)
    call, _ = await lite_consumer_stream(endpoint, "lite-9")
    await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=[lite_message("s-9", b"x")]))
    answer = await endpoint.stub.SyncLiteSubscription(
        sync_request(pb.LiteSubscriptionAction.COMPLETE_ADD, "s-9"), metadata=meta("lite-9")
    )
    assert answer.status.code == CODE.OK
    notified = await asyncio.to_thread(endpoint.broker.delete_lite_topic, TOPIC, "s-9")
    assert notified == 1
    command = await asyncio.wait_for(call.read(), 5)
    assert command.WhichOneof("command") == "notify_unsubscribe_lite_command"
    assert command.notify_unsubscribe_lite_command.lite_topic == "s-9"
    # A terminating client's subscriptions end with it.
    await endpoint.stub.NotifyClientTermination(
        svc.NotifyClientTerminationRequest(group=resource(GROUP)), metadata=meta("lite-9")
    )
    assert endpoint.broker.lite.subscriptions() == []
    call.cancel()


def test_namespaced_lite_topics_stay_apart() -> None:
    run(namespaced_lite)


async def namespaced_lite(endpoint: InProcess) -> None:
    broker = endpoint.broker
    broker.create_topic("tenant%chat", MessageType.LITE, queue_count=1)
    broker.create_group("tenant%bots")
    stub = endpoint.stub
    topic = pb.Resource(name=TOPIC, resource_namespace="tenant")
    group = pb.Resource(name=GROUP, resource_namespace="tenant")
    msg = lite_message("s-1", b"ns")
    msg.topic.CopyFrom(topic)
    sent = await stub.SendMessage(svc.SendMessageRequest(messages=[msg]))
    assert sent.status.code == CODE.OK, sent.status
    answer = await stub.SyncLiteSubscription(
        svc.SyncLiteSubscriptionRequest(
            action=pb.LiteSubscriptionAction.PARTIAL_ADD,
            topic=topic,
            group=group,
            lite_topic_set=["s-1"],
        ),
        metadata=meta("tenant-client"),
    )
    assert answer.status.code == CODE.OK, answer.status
    assert [t["lite_topic"] for t in broker.list_lite_topics("tenant%chat")] == ["s-1"]
    request = svc.ReceiveMessageRequest(
        group=group, message_queue=pb.MessageQueue(topic=topic, id=0), batch_size=4
    )
    got = [
        a.message
        async for a in stub.ReceiveMessage(request, metadata=meta("tenant-client"))
        if a.WhichOneof("content") == "message"
    ]
    assert [(m.body, m.system_properties.lite_topic, m.topic.name) for m in got] == [
        (b"ns", "s-1", TOPIC)
    ]
