"""What each MessagingService RPC needs (ACL 2.0's actions), without a server."""

from __future__ import annotations

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.server.rpc_permissions import NEEDS, needs


def described(method: str, request: object, header: str = "") -> list[str]:
    return [n.describe() for n in needs(method, request, header)]


def test_every_rpc_of_the_protocol_is_mapped() -> None:
    methods = svc.DESCRIPTOR.services_by_name["MessagingService"].methods
    assert {m.name for m in methods} <= set(NEEDS)


def test_an_unmapped_method_is_closed_to_normal_users() -> None:
    assert described("SomeFutureRpc", None) == ["Update on Cluster"]


def topic(name: str, namespace: str = "") -> pb.Resource:
    return pb.Resource(name=name, resource_namespace=namespace)


@pytest.mark.parametrize(
    "method, request_, header, expected",
    [
        (
            "SendMessage",
            svc.SendMessageRequest(
                messages=[pb.Message(topic=topic(t)) for t in ("b", "a", "b", "a", "")]
            ),
            "",
            ["Pub on Topic:a", "Pub on Topic:b"],
        ),
        (
            "SendMessage",
            svc.SendMessageRequest(messages=[pb.Message(topic=topic("t"))] * 3),
            "ns1",
            ["Pub on Topic:ns1%t"],
        ),
        ("QueryRoute", svc.QueryRouteRequest(topic=topic("t")), "",
         ["Pub on Topic:t or Sub on Topic:t"]),
        (
            "ReceiveMessage",
            svc.ReceiveMessageRequest(
                group=topic("g"), message_queue=pb.MessageQueue(topic=topic("t"))
            ),
            "",
            ["Sub on Topic:t", "Sub on Group:g"],
        ),
        ("AckMessage", svc.AckMessageRequest(group=topic("g"), topic=topic("t")), "",
         ["Sub on Topic:t", "Sub on Group:g"]),
        ("EndTransaction", svc.EndTransactionRequest(topic=topic("t")), "", ["Pub on Topic:t"]),
        ("EndTransaction", svc.EndTransactionRequest(), "", ["Pub on Cluster"]),
        # A group's members may be in any topic: the topic the caller names does not count.
        (
            "EndTransaction",
            svc.EndTransactionRequest(topic=topic("orders-1"), transaction_id="hm-group:G"),
            "",
            ["Pub on Cluster"],
        ),
        ("Heartbeat", svc.HeartbeatRequest(group=topic("g")), "", ["Sub on Group:g"]),
        (
            "Heartbeat",
            svc.HeartbeatRequest(group=topic("pg"), client_type=pb.ClientType.PRODUCER),
            "",
            [],
        ),
        ("Heartbeat", svc.HeartbeatRequest(), "", []),
    ],
)  # fmt: skip
def test_what_requests_need(
    method: str, request_: object, header: str, expected: list[str]
) -> None:
    assert described(method, request_, header) == expected
