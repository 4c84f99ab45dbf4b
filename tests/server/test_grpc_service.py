"""What the servicer answers where RocketMQ's proxy answers in a particular way, in process.

Assignments (one per readable queue for a FIFO group, one broker-wide for any
other), receives limited to the assigned queue for push consumers only, the
transaction id of plain sends, and RocketMQ's wording on an unknown topic.
"""

from __future__ import annotations

import uuid

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.message import MessageType
from tests.server.inprocess import InProcess, run

TOPIC = "fifo-orders"
FIFO_GROUP = "fifo-billing"
GROUP = "billing"


def setup(endpoint: InProcess) -> None:
    endpoint.broker.create_topic(TOPIC, MessageType.FIFO, queue_count=4)
    endpoint.broker.create_group(FIFO_GROUP, fifo=True, consume_from="earliest")
    endpoint.broker.create_group(GROUP, consume_from="earliest")


async def assignment_ids(endpoint: InProcess, group: str) -> list[tuple[int, int]]:
    answer = await endpoint.stub.QueryAssignment(
        svc.QueryAssignmentRequest(topic=pb.Resource(name=TOPIC), group=pb.Resource(name=group))
    )
    assert answer.status.code == pb.Code.OK, answer.status.message
    return [(a.message_queue.id, a.message_queue.permission) for a in answer.assignments]


async def send_fifo(endpoint: InProcess, count: int) -> dict[int, int]:
    """``count`` messages in as many message groups; how many landed in each queue."""
    messages = [
        pb.Message(
            topic=pb.Resource(name=TOPIC),
            body=f"m{i}".encode(),
            system_properties=pb.SystemProperties(
                message_id=uuid.uuid4().hex,
                message_type=pb.MessageType.FIFO,
                message_group=f"group-{i}",
            ),
        )
        for i in range(count)
    ]
    answer = await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=messages))
    assert answer.status.code == pb.Code.OK, answer.status.message
    per_queue: dict[int, int] = {}
    for status in endpoint.broker.topic_status(TOPIC):
        per_queue[status.queue_id] = status.max_offset
    return per_queue


async def heartbeat(endpoint: InProcess, client_id: str, client_type: int) -> None:
    answer = await endpoint.stub.Heartbeat(
        svc.HeartbeatRequest(group=pb.Resource(name=FIFO_GROUP), client_type=client_type),
        metadata=(("x-mq-client-id", client_id),),
    )
    assert answer.status.code == pb.Code.OK, answer.status.message


async def receive(endpoint: InProcess, client_id: str, queue_id: int) -> list[pb.Message]:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=FIFO_GROUP),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue_id),
        batch_size=32,
    )
    request.long_polling_timeout.seconds = 0
    request.invisible_duration.seconds = 30
    messages = []
    async for response in endpoint.stub.ReceiveMessage(
        request, metadata=(("x-mq-client-id", client_id),), timeout=5
    ):
        if response.WhichOneof("content") == "message":
            messages.append(response.message)
    return messages


def test_a_fifo_group_is_assigned_every_readable_queue_any_other_group_one() -> None:
    async def scenario(endpoint: InProcess) -> None:
        setup(endpoint)
        rw, r = pb.Permission.READ_WRITE, pb.Permission.READ
        assert await assignment_ids(endpoint, FIFO_GROUP) == [(q, rw) for q in range(4)]
        assert await assignment_ids(endpoint, GROUP) == [(-1, rw)]
        # Queues removed by a shrink stay readable while they hold messages: still assigned,
        # with their route permission.
        per_queue = await send_fifo(endpoint, 32)
        assert all(per_queue[q] for q in (2, 3)), per_queue
        endpoint.broker.update_topic(TOPIC, queue_count=2)
        assert await assignment_ids(endpoint, FIFO_GROUP) == [(0, rw), (1, rw), (2, r), (3, r)]
        assert await assignment_ids(endpoint, GROUP) == [(-1, rw)]

    run(scenario)


def test_a_push_consumer_receives_from_its_assigned_queue_only() -> None:
    async def scenario(endpoint: InProcess) -> None:
        setup(endpoint)
        per_queue = await send_fifo(endpoint, 16)
        await heartbeat(endpoint, "push-1", pb.ClientType.PUSH_CONSUMER)
        busy = next(q for q, n in sorted(per_queue.items()) if n > 0)
        got = await receive(endpoint, "push-1", busy)
        assert got and {m.system_properties.queue_id for m in got} == {busy}
        # The queue is blocked now (ordered messages in flight): nothing more from it.
        assert await receive(endpoint, "push-1", busy) == []

    run(scenario)


def test_a_simple_consumers_queue_id_is_not_binding() -> None:
    async def scenario(endpoint: InProcess) -> None:
        setup(endpoint)
        per_queue = await send_fifo(endpoint, 16)
        assert sum(1 for n in per_queue.values() if n) > 1, per_queue
        await heartbeat(endpoint, "simple-1", pb.ClientType.SIMPLE_CONSUMER)
        # A simple consumer names the route's queues in turn and expects messages from
        # any of them, as RocketMQ's proxy pops broker-wide for it.
        got = await receive(endpoint, "simple-1", 0)
        assert {m.system_properties.queue_id for m in got} == {q for q, n in per_queue.items() if n}

    run(scenario)


def test_a_plain_send_answers_its_message_id_as_transaction_id() -> None:
    async def scenario(endpoint: InProcess) -> None:
        message = pb.Message(
            topic=pb.Resource(name="orders"),
            body=b"x",
            system_properties=pb.SystemProperties(
                message_id="01ABC", message_type=pb.MessageType.NORMAL
            ),
        )
        answer = await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=[message]))
        (entry,) = answer.entries
        assert (entry.message_id, entry.transaction_id) == ("01ABC", "01ABC")

    run(scenario)


def test_an_unknown_topic_answers_with_rocketmqs_wording_too() -> None:
    async def scenario(endpoint: InProcess) -> None:
        answer = await endpoint.stub.QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name="TopicTest-not-exists"))
        )
        assert answer.status.code == pb.Code.TOPIC_NOT_FOUND
        assert answer.status.message.endswith(
            "CODE: 17  DESC: No topic route info in name server for the topic: TopicTest-not-exists"
        )

    run(scenario)


def test_metadata_pair_reads_the_first_value_of_each_header() -> None:
    from halfmoon.server.rpc_common import metadata, metadata_pair

    class Context:
        def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
            return (("a", "1"), ("b", b"2"), ("a", "3"))

    context = Context()
    assert metadata_pair(context, "a", "b") == ("1", "2")  # type: ignore[arg-type]
    assert metadata_pair(context, "b", "missing") == ("2", "")  # type: ignore[arg-type]
    assert metadata(context, "a") == "1"  # type: ignore[arg-type]
