"""What each MessagingService RPC needs, in ACL 2.0's terms (RocketMQ's proxy maps them so).

- send, recall, end a transaction: Pub on the topic (the broker then checks that the
  transaction or recall handle belongs to that topic, and answers as if it did not
  exist when it does not: the topic a caller names is bound to what it acts on);
- route lookup: Pub or Sub on the topic;
- assignment, receive, ack, change invisibility, dead-letter, pull, offsets,
  lite subscriptions: Sub on the topic and Sub on the group;
- a consumer's heartbeat naming its group: Sub on the group (it may create the group,
  as a first receive would; RocketMQ's proxy asks the same);
- a producer's heartbeat, termination, telemetry: a known user, nothing more (a producer
  learns of transaction checks only for topics it may Pub on: see
  ``TelemetryCheckSender``);
- BulkRead (``halfmoon.v1.BulkRead``, halfmoon's own): as pull, Sub on the topic and group;
- ending a transaction *group* (``hm-group:<id>``): Pub on Cluster, whatever topic the
  request names. A group's members may be in any topic (sends, acks and offset
  commits of many topics and groups, on many brokers), so the topic field says
  nothing about what the decision publishes;
- ending a single transaction without a topic: Pub on Cluster (nothing binds it).

The client id a request names is bound to its user before any of this
(:mod:`halfmoon.server.client_owners`).

Names are the stored ones (namespace applied), so ``Namespace:<ns>`` policies
see them. A method missing here needs Update on Cluster: a new RPC is closed
to normal users until it is mapped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.auth import CLUSTER, Need, group, topic
from halfmoon.broker.transactions.ids import GROUP_ID_PREFIX
from halfmoon.server import namespace as ns

Needs = list[Need]


def _topic(resource: pb.Resource, header: str) -> str:
    return ns.resolve(resource, header, "topic")


def _group(resource: pb.Resource, header: str) -> str:
    return ns.resolve(resource, header, "group")


def _sub(topic_resource: pb.Resource, group_resource: pb.Resource | None, header: str) -> Needs:
    # A request without a name touches nothing: its handler answers BAD_REQUEST.
    out = []
    if topic_resource.name:
        out.append(Need.of(topic(_topic(topic_resource, header)), "Sub"))
    if group_resource is not None and group_resource.name:
        out.append(Need.of(group(_group(group_resource, header)), "Sub"))
    return out


def _pub(topic_resource: pb.Resource, header: str, *actions: str) -> Needs:
    if not topic_resource.name:
        return []
    return [Need.of(topic(_topic(topic_resource, header)), *actions)]


def _send(request: Any, header: str) -> Needs:
    # A batch names one topic, 32 times over: each distinct (name, namespace) is resolved once.
    distinct: dict[tuple[str, str], pb.Resource] = {}
    for m in request.messages:
        resource = m.topic
        key = (resource.name, resource.resource_namespace)
        if key[0] and key not in distinct:
            distinct[key] = resource
    names = {_topic(resource, header) for resource in distinct.values()}
    return [Need.of(topic(name), "Pub") for name in sorted(names)]


def _end_transaction(request: Any, header: str) -> Needs:
    if request.transaction_id.startswith(GROUP_ID_PREFIX) or not request.topic.name:
        return [Need.of(CLUSTER, "Pub")]
    return _pub(request.topic, header, "Pub")


def _bulk_read(request: Any, header: str) -> Needs:
    # halfmoon.v1.BulkRead (a BulkRequest, not protobuf): what PullMessage needs.
    topic_resource = pb.Resource(name=request.topic, resource_namespace=request.namespace)
    group_resource = pb.Resource(name=request.group, resource_namespace=request.namespace)
    return _sub(topic_resource, group_resource, header)


def _heartbeat(request: Any, header: str) -> Needs:
    if request.client_type == pb.ClientType.PRODUCER:
        return []
    return _sub(pb.Resource(), request.group, header)


def _nothing(request: Any, header: str) -> Needs:
    return []


NEEDS: dict[str, Callable[[Any, str], Needs]] = {
    "QueryRoute": lambda r, h: _pub(r.topic, h, "Pub", "Sub"),
    "Heartbeat": _heartbeat,
    "NotifyClientTermination": _nothing,
    "Telemetry": _nothing,
    "SendMessage": _send,
    "RecallMessage": lambda r, h: _pub(r.topic, h, "Pub"),
    "EndTransaction": _end_transaction,
    "QueryAssignment": lambda r, h: _sub(r.topic, r.group, h),
    "ReceiveMessage": lambda r, h: _sub(r.message_queue.topic, r.group, h),
    "AckMessage": lambda r, h: _sub(r.topic, r.group, h),
    "ChangeInvisibleDuration": lambda r, h: _sub(r.topic, r.group, h),
    "ForwardMessageToDeadLetterQueue": lambda r, h: _sub(r.topic, r.group, h),
    "PullMessage": lambda r, h: _sub(r.message_queue.topic, r.group, h),
    "UpdateOffset": lambda r, h: _sub(r.message_queue.topic, r.group, h),
    "GetOffset": lambda r, h: _sub(r.message_queue.topic, r.group, h),
    "QueryOffset": lambda r, h: _sub(r.message_queue.topic, None, h),
    "SyncLiteSubscription": lambda r, h: _sub(r.topic, r.group, h),
    "BulkRead": _bulk_read,
}


def needs(method: str, request: Any, header: str) -> Needs:
    """The permissions ``request`` to ``method`` needs; raises on a malformed name."""
    rule = NEEDS.get(method)
    if rule is None:
        return [Need.of(CLUSTER, "Update")]
    return rule(request, header)
