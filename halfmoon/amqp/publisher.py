"""A channel's publishes: route, cap, store, and confirm (Confirm.Select) once durable.

A publish is routed through the vhost's topology, filtered by the target
queues' length limits (:mod:`halfmoon.amqp.length_limit`), and stored once for
all its target queues (``Broker.send_fanout``: one record, indexed into each;
or, in a transaction, as one half message per queue). In
confirm mode each publish gets a sequence number; it is acked when the
broker's durable future completes (nacked when refused), in order, and
consecutive acks are coalesced into one with ``multiple``. An unroutable
``mandatory`` publish comes back as Basic.Return 312 NO_ROUTE before its ack.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pamqp import commands

from halfmoon.amqp import framing, length_limit
from halfmoon.amqp.channel_state import Content, Mode, Phase
from halfmoon.amqp.dead_letter import Original
from halfmoon.amqp.message import delay_ms, encode_envelope, expires_at, outgoing, priority_in
from halfmoon.amqp.reply_codes import NO_ROUTE
from halfmoon.errors import HalfmoonError

if TYPE_CHECKING:
    from halfmoon.amqp.channel import Channel
    from halfmoon.amqp.topology import Queue

log = logging.getLogger("halfmoon.amqp")


class Publisher:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        # The next sequence number, the highest confirmed, and completions not yet sent.
        self._seq = 0
        self._confirmed = 0
        self._completed: dict[int, bool] = {}

    async def publish(self, content: Content) -> None:
        p = content.publish
        assert content.header is not None
        body = b"".join(content.parts)
        seq = 0
        if self._channel.state.mode is Mode.CONFIRM:
            self._seq += 1
            seq = self._seq
        headers = content.header.properties.headers or {}
        targets = await self._channel.server.route(
            self._channel.vhost, p.exchange, p.routing_key, headers
        )
        for queue in targets:
            self._channel.connection.authorize_write(queue)
        if not targets:
            if p.mandatory:
                self._channel.connection.write(
                    framing.encode_method(
                        framing.method(
                            commands.Basic.Return,
                            reply_code=NO_ROUTE,
                            reply_text="NO_ROUTE",
                            exchange=p.exchange,
                            routing_key=p.routing_key,
                        ),
                        self._channel.number,
                    )
                    + framing.encode_content(
                        self._channel.number,
                        content.header.raw_properties,
                        body,
                        self._channel.connection.frame_max,
                    )
                )
            if seq:
                self._complete(seq, True)
            return
        envelope = encode_envelope(p.exchange, p.routing_key, content.header.raw_properties)
        original = Original(p.exchange, p.routing_key, content.header.raw_properties, body)
        if self._channel.transaction is not None:
            await self._channel.transaction.publish(
                targets, original, envelope, content.header.properties.priority, delay_ms(headers)
            )
            return
        server = self._channel.server
        connection = self._channel.connection
        if any(length_limit.capped(q) for q in targets):
            await connection.writes_seen()  # a capped queue counts this client's publishes
        targets, refused, to_trim = await length_limit.admit(server.queues, targets, len(body))
        now = int(time.time() * 1000)
        dead_lettered = length_limit.refusal_copies(self._channel.vhost, refused, original, now)
        if not targets and not dead_lettered:
            if seq:
                self._complete(seq, not refused)
            return
        props = content.header.properties
        delay = delay_ms(headers)
        messages = [
            outgoing(
                q.stored,
                body,
                envelope,
                delivery_timestamp=now + delay if delay else None,
                expires=expires_at(props.expiration, q.arguments.get("x-message-ttl"), now),
                priority=priority_in(q, props.priority),
            )
            for q in targets
        ] + dead_lettered
        try:
            durable = await self._channel.server.queues.fanout(messages)
        except HalfmoonError as exc:
            if not seq:
                raise
            log.info("event=amqp_publish_refused code=%s", exc.code)
            self._complete(seq, False)
            return
        if durable is not None:
            connection.wrote(durable)
        if to_trim:
            await connection.writes_seen()  # trimmed with this message counted
        for queue in to_trim:
            await length_limit.trim(
                server.queues,
                server.dead_letters,
                self._channel.vhost,
                queue,
                self._channel.client_id,
            )
        if not seq:
            return
        if durable is None:
            self._confirm_after_deliveries(seq, not refused, targets)
            return
        durable.add_done_callback(lambda f: self._durable(f, seq, bool(refused), targets))

    def _durable(
        self, future: asyncio.Future[Any], seq: int, refused: bool, targets: Sequence[Queue]
    ) -> None:
        failed = refused or future.cancelled() or future.exception() is not None
        if self._channel.state.phase is Phase.OPEN:
            self._confirm_after_deliveries(seq, not failed, targets)

    def _confirm_after_deliveries(self, seq: int, ok: bool, targets: Sequence[Queue]) -> None:
        """Confirm ``seq`` once this connection's consumers of ``targets`` have had their
        pass over the stored (and now readable) message, so its delivery to them is written
        before the confirm, as RabbitMQ orders them (see Consumer.next_pass). Consumers on
        other connections are not waited for: between connections there is no order."""
        stored = {q.stored for q in targets}
        passes = [
            consumer.next_pass()
            for channel in list(self._channel.connection.channels.values())
            for consumer in list(channel.consumers.values())
            if consumer.queue.stored in stored
        ]
        if not ok or not passes:
            self._complete(seq, ok)
            return

        def passed(_: asyncio.Future[Any]) -> None:
            if self._channel.state.phase is Phase.OPEN:
                self._complete(seq, ok)

        asyncio.gather(*passes).add_done_callback(passed)

    def _complete(self, seq: int, ok: bool) -> None:
        """Confirm every publish up to the highest one completed in order, coalesced."""
        self._completed[seq] = ok
        run_end = 0
        nacks: list[int] = []
        while self._confirmed + 1 in self._completed:
            nxt = self._confirmed + 1
            if self._completed.pop(nxt):
                run_end = nxt
            else:
                if run_end:
                    self._send_confirm(run_end, True)
                    run_end = 0
                nacks.append(nxt)
                self._send_confirm(nxt, False)
            self._confirmed = nxt
        if run_end:
            self._send_confirm(run_end, True)

    def _send_confirm(self, tag: int, ok: bool) -> None:
        self._channel.connection.write(
            framing.encode_confirm(self._channel.number, tag, multiple=ok, ack=ok)
        )
