"""SimpleConsumer: receive a batch, process at your own pace, ack (or push back) each message.

Each received message stays invisible to the rest of the group for
``invisible_duration``; :meth:`SimpleConsumer.ack` consumes it for good,
:meth:`SimpleConsumer.change_invisible_duration` asks for more time (or, with
a short duration, for an earlier redelivery). A message neither acked nor
extended comes back to the group after its invisible time.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.client.client import as_config
from halfmoon.client.connection import ClientConfig
from halfmoon.client.consumer import ConsumerBase
from halfmoon.client.message import MessageView
from halfmoon.client.selector import MessageSelector


class SimpleConsumer(ConsumerBase):
    """Receive / ack / change invisible duration, RocketMQ 5's SimpleConsumer.

    ``subscriptions`` maps topic → :class:`MessageSelector`. ``await_duration``
    is how long a receive waits (long polling) when nothing is there.
    """

    client_type = pb.ClientType.SIMPLE_CONSUMER

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        subscriptions: Mapping[str, MessageSelector] | None = None,
        *,
        await_duration: float = 5.0,
        **options: Any,
    ) -> None:
        super().__init__(as_config(config, **options), group, subscriptions)
        self.await_duration = await_duration
        self._next_topic = itertools.count()

    async def receive(
        self,
        max_messages: int = 16,
        invisible_duration: float = 30.0,
        *,
        topic: str | None = None,
        wait: float | None = None,
    ) -> list[MessageView]:
        """Up to ``max_messages`` messages, invisible to others for ``invisible_duration`` seconds.

        Without ``topic`` the subscribed topics are taken in turn. Waits up to
        ``wait`` (default ``await_duration``) for a message; returns ``[]`` if none came.
        """
        self._check_open()
        if not self.subscriptions:
            raise ValueError(
                "the consumer has no subscription; pass subscriptions or call subscribe()"
            )
        if max_messages <= 0:
            raise ValueError("max_messages must be positive")
        if topic is None:
            topics = list(self.subscriptions)
            topic = topics[next(self._next_topic) % len(topics)]
        selector = self.subscriptions.get(topic)
        if selector is None:
            raise ValueError(f"topic {topic!r} is not subscribed; call subscribe({topic!r}) first")
        return await self._receive(
            topic,
            selector,
            max_messages,
            invisible_duration,
            self.await_duration if wait is None else wait,
        )

    async def ack(self, message: MessageView) -> None:
        """Consume ``message`` for good (raises InvalidReceiptHandle if its invisible time ran
        out)."""
        self._check_open()
        await self._ack(message)

    async def change_invisible_duration(
        self, message: MessageView, invisible_duration: float
    ) -> MessageView:
        """Keep ``message`` invisible for ``invisible_duration`` more seconds; its receipt handle
        is renewed in place."""
        self._check_open()
        await self._change_invisible(message, invisible_duration)
        return message
