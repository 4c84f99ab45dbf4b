"""Which messages of a topic a consumer wants: a tag expression or an SQL92 condition.

``MessageSelector.by_tag("A || B")`` matches messages tagged A or B (``*``
matches all); ``MessageSelector.by_sql("a > 5 AND region = 'eu'")`` evaluates
the condition against each message's user properties on the server. The
server compiles the expression when the consumer announces its subscription
and rejects a bad one with :class:`~halfmoon.client.errors.IllegalFilterExpression`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb


@dataclass(frozen=True)
class MessageSelector:
    """A filter expression: ``kind`` is ``"TAG"`` or ``"SQL92"``."""

    kind: str = "TAG"
    expression: str = "*"

    @classmethod
    def by_tag(cls, expression: str = "*") -> MessageSelector:
        """Tags joined by ``||`` (``"TagA || TagB"``); ``"*"`` (or empty) selects everything."""
        return cls("TAG", expression.strip() or "*")

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """An SQL92 condition over user properties (``"a > 5 AND b = 'x'"``)."""
        if not expression.strip():
            raise ValueError('an SQL92 selector needs a condition, e.g. "a > 5"')
        return cls("SQL92", expression.strip())

    @classmethod
    def all(cls) -> MessageSelector:
        """Every message of the topic."""
        return cls()

    def to_wire(self) -> pb.FilterExpression:
        kind = pb.FilterType.SQL if self.kind == "SQL92" else pb.FilterType.TAG
        return pb.FilterExpression(type=kind, expression=self.expression)


ALL = MessageSelector()
