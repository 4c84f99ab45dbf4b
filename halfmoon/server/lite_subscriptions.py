"""The gRPC side of lite topics (RIP-83): SyncLiteSubscription, settings, unsubscribe notices.

- ``SyncLiteSubscription``: the client's id (``x-mq-client-id``), its group,
  the bound parent topic, an action and a set of lite topic names, maybe an
  offset option. One broker call (:meth:`Broker.sync_lite_subscription`).
- Settings: a lite consumer (LITE_PUSH_CONSUMER, LITE_SIMPLE_CONSUMER) learns
  ``lite_subscription_quota`` and ``max_lite_topic_size`` from its settings
  answer. The official Python client never finishes starting without them;
  the Java and Node.js clients check names and quota against them before
  they ask.
- ``NotifyUnsubscribeLiteCommand``: when the broker drops a client's lite
  subscription (an operator deleted the lite topic or its parent), the client
  is told on its telemetry stream, so it stops asking for it.
"""

from __future__ import annotations

from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.facade import Broker
from halfmoon.broker.lite import OffsetOption
from halfmoon.server.errors import RequestError
from halfmoon.server.telemetry import ClientRegistry

LITE_CLIENT_TYPES = frozenset(
    (pb.ClientType.LITE_PUSH_CONSUMER, pb.ClientType.LITE_SIMPLE_CONSUMER)
)

_ACTIONS = {
    pb.LiteSubscriptionAction.PARTIAL_ADD: "partial_add",
    pb.LiteSubscriptionAction.PARTIAL_REMOVE: "partial_remove",
    pb.LiteSubscriptionAction.COMPLETE_ADD: "complete_add",
    pb.LiteSubscriptionAction.COMPLETE_REMOVE: "complete_remove",
}


def offset_option(request: svc.SyncLiteSubscriptionRequest) -> OffsetOption | None:
    """The broker's OffsetOption for the request's (None: keep the group's position)."""
    if not request.HasField("offset_option"):
        return None
    option = request.offset_option
    kind = option.WhichOneof("offset_type")
    if kind == "offset":
        return OffsetOption("offset", option.offset)
    if kind == "tail_n":
        return OffsetOption("tail_n", option.tail_n)
    if kind == "timestamp":
        return OffsetOption("timestamp", option.timestamp)
    if kind == "policy" and option.policy == pb.OffsetOption.Policy.MIN:
        return OffsetOption("min")
    if kind == "policy" and option.policy == pb.OffsetOption.Policy.MAX:
        return OffsetOption("max")
    return None  # LAST: go on where the group is


def sync_call(
    request: svc.SyncLiteSubscriptionRequest, client_id: str, *, topic: str, group: str
) -> tuple[Any, ...]:
    """The arguments of ``broker.sync_lite_subscription`` for one request (protocol checks).

    ``topic`` and ``group`` are the request's, as stored (namespace applied).
    """
    if not client_id:
        raise RequestError(
            "SyncLiteSubscription needs the x-mq-client-id header", code="CLIENT_ID_REQUIRED"
        )
    action = _ACTIONS.get(request.action)
    if action is None:
        raise RequestError(f"unknown lite subscription action {request.action}")
    return (
        client_id,
        group,
        topic,
        action,
        list(request.lite_topic_set),
        offset_option(request),
    )


def add_lite_settings(answer: pb.Settings, client: pb.Settings, broker: Broker) -> None:
    """Tell a lite consumer its quota and the longest lite topic name."""
    if client.client_type not in LITE_CLIENT_TYPES:
        return
    answer.subscription.lite_subscription_quota = broker.config.lite_subscription_quota
    answer.subscription.max_lite_topic_size = broker.config.max_lite_topic_length


def unsubscribe_command(lite_topic: str) -> svc.TelemetryCommand:
    return svc.TelemetryCommand(
        notify_unsubscribe_lite_command=svc.NotifyUnsubscribeLiteCommand(lite_topic=lite_topic)
    )


def install_notifier(broker: Broker, registry: ClientRegistry) -> None:
    """Send NotifyUnsubscribeLiteCommand down a client's stream when the broker drops its lite
    topic."""

    def notify(client_id: str, group: str, topic: str, lite_topic: str) -> None:
        registry.send_command_threadsafe(client_id, unsubscribe_command(lite_topic))

    broker.set_lite_unsubscribe_notifier(notify)


def remove_notifier(broker: Broker) -> None:
    broker.set_lite_unsubscribe_notifier(None)
