"""The Settings answer a client gets on its telemetry stream.

A client sends what it is (producer / push / simple consumer, its topics or
subscriptions); the server answers with what it must use, as RocketMQ's proxy
does: producers get the retry policy and the body-size limit; consumers get
their group's FIFO flag, delivery attempts and backoff (from the broker's
GroupConfig), the receive batch size and the long-polling timeout.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2

from halfmoon.broker.filter_spec import FilterSpec, compile_spec
from halfmoon.broker.groups import GroupConfig, RetryPolicy
from halfmoon.config import ServerConfig
from halfmoon.server.convert import filter_spec, to_duration

pb = definition_pb2


def producer_settings(client: pb.Settings, server: ServerConfig, max_body_size: int) -> pb.Settings:
    answer = pb.Settings()
    answer.CopyFrom(client)
    policy = answer.backoff_policy
    policy.Clear()
    policy.max_attempts = server.producer_max_attempts
    policy.exponential_backoff.initial.CopyFrom(to_duration(server.producer_backoff_initial * 1000))
    policy.exponential_backoff.max.CopyFrom(to_duration(server.producer_backoff_max * 1000))
    policy.exponential_backoff.multiplier = server.producer_backoff_multiplier
    answer.publishing.max_body_size = max_body_size
    answer.publishing.validate_message_type = True
    answer.metric.Clear()
    answer.metric.on = False
    return answer


def retry_policy(policy: RetryPolicy, max_attempts: int) -> pb.RetryPolicy:
    wire = pb.RetryPolicy(max_attempts=max_attempts)
    if policy.kind == "exponential":
        wire.exponential_backoff.initial.CopyFrom(to_duration(policy.initial_ms))
        wire.exponential_backoff.max.CopyFrom(to_duration(policy.max_ms))
        wire.exponential_backoff.multiplier = policy.multiplier
    else:
        wire.customized_backoff.next.extend(to_duration(ms) for ms in policy.levels_ms)
    return wire


def validate_subscriptions(client: pb.Settings) -> None:
    """Compile every subscription's filter: a bad expression fails here, with its position."""
    for entry in client.subscription.subscriptions:
        spec: FilterSpec = filter_spec(entry.expression)
        if not spec.matches_all:
            compile_spec(spec)


def consumer_settings(client: pb.Settings, group: GroupConfig, server: ServerConfig) -> pb.Settings:
    answer = pb.Settings()
    answer.CopyFrom(client)
    sub = answer.subscription
    sub.fifo = group.fifo
    sub.receive_batch_size = server.receive_batch_size
    asked = (
        client.subscription.long_polling_timeout
        if client.subscription.HasField("long_polling_timeout")
        else None
    )
    seconds = server.long_polling_default
    if asked is not None and (asked.seconds or asked.nanos):
        seconds = asked.seconds + asked.nanos / 1e9
    sub.long_polling_timeout.CopyFrom(to_duration(min(seconds, server.long_polling_max) * 1000))
    answer.backoff_policy.CopyFrom(retry_policy(group.retry_policy, group.max_delivery_attempts))
    answer.metric.Clear()
    answer.metric.on = False
    return answer
