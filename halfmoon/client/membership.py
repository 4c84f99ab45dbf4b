"""Who is in a pull-consumer group right now, learned over the messaging protocol itself.

RocketMQ 5's gRPC protocol has no "list the group's consumers" call, and
halfmoon's QueryAssignment gives every consumer of a group the same answer
(one broker-balanced assignment in the pop model, every queue for a FIFO
group), so pull consumers find each other through a small coordination
topic (``HALFMOON_PULL_MEMBERS`` by default, one queue is enough): each member
sends a heartbeat message tagged with its group every ``interval`` seconds
(key = its client id; body ``alive`` or ``leaving``) and reads the topic by
offset, with a tag filter for its group. A member is alive while its latest
heartbeat is younger than ``ttl`` (3 intervals) and was not ``leaving``.
Starting members read back ``ttl`` seconds of history (QueryOffset by
timestamp) so they see the members already there.

The view is eventually consistent: for one heartbeat interval after a change,
two members may disagree, which is the same window RocketMQ's client-side
rebalancing has. The topic must exist (create it once, or run the server
with auto-created topics).
"""

from __future__ import annotations

import asyncio
import logging
import time

from halfmoon.client.consumer import ConsumerBase
from halfmoon.client.errors import ClientClosed, ClientError
from halfmoon.client.message import Message
from halfmoon.client.producer import Producer
from halfmoon.client.selector import MessageSelector

log = logging.getLogger("halfmoon.client.membership")

MEMBERS_TOPIC = "HALFMOON_PULL_MEMBERS"


class TopicMembership:
    """Heartbeats of one member and the live member set of its group.

    ``consumer`` (the member) reads the coordination topic; ``producer`` sends
    the member's heartbeats to it.
    """

    def __init__(
        self,
        consumer: ConsumerBase,
        producer: Producer,
        topic: str = MEMBERS_TOPIC,
        interval: float = 1.0,
    ) -> None:
        self.consumer = consumer
        self.producer = producer
        self.topic = topic
        self.interval = interval
        self.ttl = 3 * interval
        self._last_seen: dict[str, float] = {}
        self._offsets: dict[str, int] = {}
        self.changed = asyncio.Event()

    def members(self) -> list[str]:
        """Live member ids, sorted (always including this member while it runs)."""
        now = time.time()
        alive = {m for m, seen in self._last_seen.items() if now - seen < self.ttl}
        alive.add(self.consumer.client_id)
        return sorted(alive)

    async def start(self) -> None:
        route = await self.consumer.routes.get(self.topic)
        since = int((time.time() - self.ttl) * 1000)
        for queue in route.readable():
            self._offsets[queue.key] = await self.consumer._query_offset(queue, "timestamp", since)
        await self.beat("alive")
        await self.poll(wait=0.0)

    async def beat(self, state: str) -> None:
        message = Message(
            self.topic, state.encode(), tag=self.consumer.group, keys=[self.consumer.client_id]
        )
        await self.producer.send(message)

    async def poll(self, wait: float) -> bool:
        """Read new heartbeats; True when the member set changed."""
        before = self.members()
        selector = MessageSelector.by_tag(self.consumer.group)
        route = await self.consumer.routes.get(self.topic)
        for queue in route.readable():
            offset = self._offsets.get(queue.key, 0)
            messages, next_offset = await self.consumer._pull(
                queue, offset, 256, selector, wait if len(route.readable()) == 1 else 0.0
            )
            for message in messages:
                member = message.keys[0] if message.keys else ""
                if not member or member == self.consumer.client_id:
                    continue
                if message.body == b"leaving":
                    self._last_seen.pop(member, None)
                else:
                    self._last_seen[member] = max(
                        self._last_seen.get(member, 0.0), message.store_timestamp / 1000
                    )
            self._offsets[queue.key] = next_offset
        return self.members() != before

    async def run(self) -> None:
        """Heartbeat and watch until cancelled; sets :attr:`changed` on every change."""
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.interval
        while True:
            try:
                if loop.time() >= next_beat:
                    next_beat = loop.time() + self.interval
                    await self.beat("alive")
                if await self.poll(wait=max(min(next_beat - loop.time(), self.interval), 0.0)):
                    self.changed.set()
                elif any(time.time() - seen >= self.ttl for seen in self._last_seen.values()):
                    self._last_seen = {
                        m: s for m, s in self._last_seen.items() if time.time() - s < self.ttl
                    }
                    self.changed.set()
            except asyncio.CancelledError:
                raise
            except ClientClosed:
                return
            except ClientError as exc:
                log.info("event=membership_poll_failed group=%s error=%s", self.consumer.group, exc)
                await asyncio.sleep(self.interval / 2)

    async def leave(self) -> None:
        try:
            await self.beat("leaving")
        except ClientError as exc:
            log.info("event=membership_leave_failed group=%s error=%s", self.consumer.group, exc)
