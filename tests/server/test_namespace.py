"""The namespace name mapping (RocketMQ's NamespaceUtil cases) and its validation."""

from __future__ import annotations

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.broker.errors import IllegalGroup, IllegalTopic
from halfmoon.broker.topics import check_topic_name, dead_letter_topic
from halfmoon.server import namespace as ns
from halfmoon.server.errors import Code, code_for


@pytest.mark.parametrize(
    ("namespace", "name", "stored"),
    [
        ("ns", "orders", "ns%orders"),
        ("MQ_INST_1_x-y", "GID_a", "MQ_INST_1_x-y%GID_a"),
        ("ns", "%DLQ%billing", "%DLQ%ns%billing"),
        ("ns", "%RETRY%billing", "%RETRY%ns%billing"),
        ("ns", "ns%orders", "ns%orders"),  # already in this namespace
        ("ns", "%DLQ%ns%billing", "%DLQ%ns%billing"),
        ("a", "b%orders", "a%b%orders"),  # another namespace's name stays inside "a"
        ("", "orders", "orders"),
        ("ns", "", ""),
        ("ns", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC"),  # broker-only names
        ("ns", "%HM_TIMER%", "%HM_TIMER%"),
        ("ns", "rmq_sys_x", "rmq_sys_x"),
        ("ns", "CID_RMQ_SYS_TRANS", "CID_RMQ_SYS_TRANS"),
        ("ns", "TBW102", "ns%TBW102"),  # not a halfmoon name: namespaced like any other
    ],
)
def test_wrap_builds_the_stored_name_as_rocketmq_does(
    namespace: str, name: str, stored: str
) -> None:
    assert ns.wrap(namespace, name) == stored


@pytest.mark.parametrize(
    ("stored", "namespace", "name"),
    [
        ("ns%orders", "ns", "orders"),
        ("%DLQ%ns%billing", "ns", "%DLQ%billing"),
        ("%RETRY%ns%billing", "ns", "%RETRY%billing"),
        ("a%b%orders", "a", "b%orders"),
        ("orders", "", "orders"),
        ("%DLQ%billing", "", "%DLQ%billing"),
        ("%HM_TIMER%", "", "%HM_TIMER%"),
        ("RMQ_SYS_TRANS_HALF_TOPIC", "", "RMQ_SYS_TRANS_HALF_TOPIC"),
        ("", "", ""),
    ],
)
def test_split_recovers_namespace_and_name(stored: str, namespace: str, name: str) -> None:
    assert ns.split(stored) == (namespace, name)
    assert ns.in_namespace(stored, namespace)
    if namespace:
        assert ns.wrap(namespace, name) == stored  # the round trip


def test_resource_carries_the_bare_name_and_the_namespace() -> None:
    assert ns.resource("ns%orders") == pb.Resource(name="orders", resource_namespace="ns")
    assert ns.resource("orders") == pb.Resource(name="orders")


@pytest.mark.parametrize(
    "bad",
    [
        "a%b",
        "a b",
        "a|b",
        "a.b",
        "ns/1",
        "é",
        "x" * (ns.MAX_NAMESPACE_LENGTH + 1),
        "rmq_sys_x",
        "CID_RMQ_SYS_x",
    ],
)
def test_illegal_namespaces_are_refused_with_a_stable_code(bad: str) -> None:
    with pytest.raises(ns.IllegalNamespace) as caught:
        ns.stored_name(bad, "orders")
    assert caught.value.code == "ILLEGAL_NAMESPACE"
    assert repr(bad) in caught.value.message
    assert code_for(caught.value) == Code.BAD_REQUEST


def test_longest_legal_namespace_is_accepted() -> None:
    longest = "n" * ns.MAX_NAMESPACE_LENGTH
    assert ns.stored_name(longest, "t") == f"{longest}%t"


def test_stored_name_must_fit_the_topic_and_group_limits() -> None:
    with pytest.raises(IllegalTopic, match="stored as 'ns%"):
        ns.stored_name("ns", "t" * 125, "topic")  # 128 characters once namespaced
    assert ns.stored_name("ns", "t" * 124, "topic") == "ns%" + "t" * 124
    # A group leaves room for its %DLQ% topic: 120 characters once namespaced, as any group.
    assert ns.stored_name("ns", "g" * 117, "group") == "ns%" + "g" * 117
    with pytest.raises(IllegalGroup, match="at most 120"):
        ns.stored_name("ns", "g" * 118, "group")
    longest = ns.stored_name("ns", "g" * 117, "group")
    check_topic_name(dead_letter_topic(longest), allow_reserved=True)  # it can dead-letter


def test_request_namespace_comes_from_the_resource_else_the_header() -> None:
    assert ns.resolve(pb.Resource(name="t", resource_namespace="a"), "") == "a%t"
    assert ns.resolve(pb.Resource(name="t"), "a") == "a%t"  # the Node.js consumer's requests
    assert ns.resolve(pb.Resource(name="t", resource_namespace="a"), "a") == "a%t"
    assert ns.resolve(pb.Resource(name="t"), "") == "t"
    assert ns.resolve(pb.Resource(name="g", resource_namespace="a"), "", "group") == "a%g"


def test_a_resource_and_header_naming_different_namespaces_are_refused() -> None:
    with pytest.raises(ns.IllegalNamespace, match="x-mq-namespace"):
        ns.resolve(pb.Resource(name="t", resource_namespace="a"), "b")
