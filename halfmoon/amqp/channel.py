"""One AMQP channel: its methods in order, mapped onto the topology and the broker facade.

Frames reach the channel through :meth:`Channel.submit` (the connection has
already assembled a publish's content) and are handled one at a time by the
channel's task, so replies keep the order of requests. Errors the client
caused close the channel (``AmqpChannelError``) or the connection
(``AmqpConnectionError``); a broker error is mapped by
:func:`halfmoon.amqp.reply_codes.from_halfmoon`.

Delivery tags, unacked deliveries and how an ack, nack or reject settles
them are :mod:`halfmoon.amqp.settlement`'s; unacked deliveries return to
their queue when the channel closes. A delivery or Basic.Get that finds its
message expired dead-letters or drops it unseen
(:mod:`halfmoon.amqp.dead_letter`). Publishes and their confirms are
:mod:`halfmoon.amqp.publisher`'s. Transactions (Tx.Select) are :mod:`halfmoon.amqp.transaction`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

from pamqp import base, commands

from halfmoon.amqp import framing, queue_arguments
from halfmoon.amqp.channel_state import ChannelState, Content, Mode, Phase
from halfmoon.amqp.consumer import Consumer
from halfmoon.amqp.dead_letter import EXPIRED
from halfmoon.amqp.message import decode_envelope, expired, max_priority
from halfmoon.amqp.names import check_name
from halfmoon.amqp.publisher import Publisher
from halfmoon.amqp.reply_codes import (
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    AmqpChannelError,
    AmqpConnectionError,
    AmqpError,
    from_halfmoon,
)
from halfmoon.amqp.settlement import Settlement
from halfmoon.amqp.topology import Exchange, Queue
from halfmoon.amqp.transaction import Transaction
from halfmoon.broker.message import MessageView
from halfmoon.errors import HalfmoonError

if TYPE_CHECKING:
    from halfmoon.amqp.connection import AmqpConnection

log = logging.getLogger("halfmoon.amqp")


class Channel:
    def __init__(self, connection: AmqpConnection, number: int) -> None:
        self.connection = connection
        self.server = connection.server
        self.number = number
        self.state = ChannelState(number)
        self.client_id = f"{connection.id}-{number}"
        self.consumers: dict[str, Consumer] = {}
        self.prefetch = 0  # for consumers started from now on
        self.global_prefetch = 0
        self.flow_paused = False
        self.settlement = Settlement(self)
        self.publisher = Publisher(self)
        self.transaction: Transaction | None = None
        self.released = False  # closing: no consumer starts from now on
        self._inbox: asyncio.Queue[base.Frame | Content | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())

    # -- intake -------------------------------------------------------------------

    def submit(self, item: base.Frame | Content) -> None:
        self._inbox.put_nowait(item)

    @property
    def backlog(self) -> int:
        return self._inbox.qsize()

    async def _run(self) -> None:
        while True:
            item = await self._inbox.get()
            if item is None:
                return
            if self.state.phase is Phase.CLOSING and not isinstance(
                item, commands.Channel.Close | commands.Channel.CloseOk
            ):
                continue  # dropped after our Channel.Close, as the spec says
            if not self.connection.state.accepting:
                # After the server's Connection.Close every frame but Close-Ok is dropped:
                # a Tx.Commit queued behind a publish that failed must not commit the rest.
                if isinstance(item, commands.Channel.CloseOk):
                    return  # the channel is gone from its connection: nothing else ends it
                continue
            try:
                if isinstance(item, Content):
                    await self.publisher.publish(item)
                else:
                    await self._handle(item)
            except AmqpChannelError as exc:
                await self.fail(exc)
            except AmqpConnectionError as exc:
                self.connection.fail(exc)
            except HalfmoonError as exc:
                ids = _ids(item)
                error = from_halfmoon(exc, *ids)
                if isinstance(error, AmqpChannelError):
                    await self.fail(error)
                else:
                    self.connection.fail(error)
            except Exception as exc:  # noqa: BLE001 - one bad request must not kill the loop
                log.exception("event=amqp_channel_failed channel=%d", self.number)
                self.connection.fail(AmqpConnectionError(541, f"internal error: {exc}"))
            self.connection.resume_if_drained()

    def send(self, method: base.Frame) -> None:
        self.connection.write(framing.encode_method(method, self.number))

    # -- closing ------------------------------------------------------------------

    async def fail(self, error: AmqpError) -> None:
        """Close the channel for ``error`` (the server's Channel.Close)."""
        if self.state.phase is Phase.CLOSING:
            return
        self.state.phase = Phase.CLOSING
        log.info(
            "event=amqp_channel_error channel=%d code=%d text=%s",
            self.number,
            error.code,
            ascii(error.text),
        )
        # Its unacked deliveries go back first: a client told of the close may at once get
        # from the queue on another channel, and must find them there (aiormq's suite does).
        try:
            await self.release()
        finally:
            self.send(framing.close_for(commands.Channel.Close, error))

    async def release(self) -> None:
        """Stop consuming and return every unacked delivery to its queue (channel closed)."""
        self.released = True
        for consumer in list(self.consumers.values()):
            await self._drop_consumer(consumer)
        if self.transaction is not None:
            await self.transaction.abandon()
        await self.settlement.return_all()

    async def close(self) -> None:
        """The connection is going: release and end the task."""
        await self.release()
        self._inbox.put_nowait(None)
        if self._task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 5)

    # -- dispatch -------------------------------------------------------------------

    async def _handle(self, m: base.Frame) -> None:
        handler = _HANDLERS.get(type(m))
        if handler is None:
            raise AmqpConnectionError(NOT_IMPLEMENTED, f"{m.name} is not implemented", *_ids(m))
        # In cluster mode another proxy may have changed the topology a moment ago.
        await self.server.catch_up_before(self.vhost, m)
        try:
            await handler(self, m)
        except AmqpChannelError as exc:
            if not await self.server.caught_up_after(self.vhost, m, exc):
                raise
            await handler(self, m)

    async def _channel_close(self, m: commands.Channel.Close) -> None:
        if self.state.phase is not Phase.CLOSING:
            await self.release()
        self.send(framing.method(commands.Channel.CloseOk))
        self.connection.channel_closed(self)
        self._inbox.put_nowait(None)

    async def _channel_close_ok(self, m: commands.Channel.CloseOk) -> None:
        self.connection.channel_closed(self)
        self._inbox.put_nowait(None)

    async def _channel_flow(self, m: commands.Channel.Flow) -> None:
        self.flow_paused = not m.active
        self.send(framing.method(commands.Channel.FlowOk, active=m.active))
        self.wake_consumers()

    async def _channel_open(self, m: commands.Channel.Open) -> None:
        raise AmqpConnectionError(
            504, f"channel {self.number} is already open", 20, 10
        )  # CHANNEL_ERROR

    # -- exchanges -------------------------------------------------------------------

    async def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        name = check_name(m.exchange, "exchange")
        self.connection.authorize_configure(name, exchange=True)
        wanted = Exchange(
            name, m.exchange_type, m.durable, m.auto_delete, m.internal, dict(m.arguments or {})
        )
        before = name in self.vhost.exchanges
        self.vhost.declare_exchange(wanted, m.passive)
        if not before:
            await self.server.topology.save()
        if not m.nowait:
            self.send(framing.method(commands.Exchange.DeclareOk))

    async def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self.connection.authorize_configure(m.exchange, exchange=True)
        if self.vhost.delete_exchange(m.exchange, m.if_unused):
            await self.server.topology.save()
        if not m.nowait:
            self.send(framing.method(commands.Exchange.DeleteOk))

    async def _exchange_bind(self, m: commands.Exchange.Bind) -> None:
        self.vhost.bind(
            m.source, m.destination, True, m.routing_key, m.arguments, self.connection.id
        )
        await self.server.topology.save()
        if not m.nowait:
            self.send(framing.method(commands.Exchange.BindOk))

    async def _exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        self.vhost.bind(
            m.source, m.destination, True, m.routing_key, m.arguments, self.connection.id, True
        )
        await self.server.topology.save()
        if not m.nowait:
            self.send(framing.method(commands.Exchange.UnbindOk))

    # -- queues ------------------------------------------------------------------------

    @property
    def vhost(self):  # -> VHost
        return self.connection.vhost

    async def _queue_declare(self, m: commands.Queue.Declare) -> None:
        name = check_name(m.queue, "queue") or "amq.gen-" + secrets.token_urlsafe(16)
        arguments = dict(m.arguments or {})
        queue_arguments.check(name, arguments)
        self.connection.authorize_configure(name, exchange=False)
        queue, created = self.vhost.declare_queue(
            name,
            self.connection.id,
            passive=m.passive,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=arguments,
        )
        if created:
            try:
                await self.server.queues.create(queue.stored, max_priority(queue))
                await self.server.created(queue)
            except BaseException:
                self.vhost.remove_queue(queue.name)
                raise
            if queue.exclusive_owner is not None:
                self.connection.exclusive_queues.append(queue)
            await self.server.topology.save()
        if not m.passive:  # a redeclare renews an x-expires lease; a passive look does not
            self.server.used(queue)
        if not m.nowait:
            await self.connection.writes_seen()
            # The broker's message count and (in cluster mode) etcd's consumer count at once.
            count, consumer_count = await asyncio.gather(
                self.server.queues.counts(queue.stored), self.server.consumer_count(queue)
            )
            self.send(
                framing.method(
                    commands.Queue.DeclareOk,
                    queue=queue.name,
                    message_count=count,
                    consumer_count=consumer_count,
                )
            )

    async def _queue_bind(self, m: commands.Queue.Bind) -> None:
        self.vhost.bind(m.exchange, m.queue, False, m.routing_key, m.arguments, self.connection.id)
        await self.server.topology.save()
        if not m.nowait:
            self.send(framing.method(commands.Queue.BindOk))

    async def _queue_unbind(self, m: commands.Queue.Unbind) -> None:
        self.vhost.bind(
            m.exchange, m.queue, False, m.routing_key, m.arguments, self.connection.id, True
        )
        await self.server.topology.save()
        self.send(framing.method(commands.Queue.UnbindOk))

    async def _queue_purge(self, m: commands.Queue.Purge) -> None:
        queue = self.vhost.queue(m.queue, self.connection.id, (50, 30))
        await self.connection.writes_seen()
        count = await self.server.queues.purge(queue.stored)
        if not m.nowait:
            self.send(framing.method(commands.Queue.PurgeOk, message_count=count))

    async def _queue_delete(self, m: commands.Queue.Delete) -> None:
        if m.queue not in self.vhost.queues:
            # RabbitMQ answers Delete-Ok (0 messages) for a queue that is not there: a
            # client's cleanup deleting what was already deleted is no error.
            if not m.nowait:
                self.send(framing.method(commands.Queue.DeleteOk, message_count=0))
            return
        queue = self.vhost.queue(m.queue, self.connection.id, (50, 40))
        if m.if_unused and await self.server.in_use(queue, (50, 40)):
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"queue {queue.name!r} in vhost {self.vhost.name!r} in use",
                50,
                40,
            )
        await self.connection.writes_seen()
        count = await self.server.queues.counts(queue.stored)
        if m.if_empty and count:
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"queue {queue.name!r} in vhost {self.vhost.name!r} is not empty ({count} "
                "messages)",
                50,
                40,
            )
        await self.server.delete_queue(self.vhost, queue)
        if not m.nowait:
            self.send(framing.method(commands.Queue.DeleteOk, message_count=count))

    # -- basic: consuming ----------------------------------------------------------------

    async def _basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch = m.prefetch_count
            for consumer in self.consumers.values():
                consumer.prefetch = m.prefetch_count
        self.send(framing.method(commands.Basic.QosOk))
        self.wake_consumers()

    def global_credit(self) -> int | None:
        if not self.global_prefetch:
            return None
        return self.global_prefetch - len(self.settlement.unacked)

    async def _basic_consume(self, m: commands.Basic.Consume) -> None:
        queue = self.vhost.queue(m.queue, self.connection.id, (60, 20))
        self.connection.authorize_read(queue)
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.consumers:
            raise AmqpConnectionError(
                NOT_ALLOWED, f"attempt to reuse consumer tag {tag!r} on this channel", 60, 20
            )
        consumer = Consumer(self, tag, queue, m.no_ack, self.prefetch, m.exclusive)
        self.consumers[tag] = consumer  # a second consume of this tag meanwhile is refused
        try:
            await self.server.add_consumer(queue, consumer)  # 403 if exclusively held
        except BaseException:
            self.consumers.pop(tag, None)
            raise
        if self.released:  # closed while the cluster recorded it (an etcd round trip)
            await self.server.remove_consumer(consumer)
            return
        if not m.nowait:
            self.send(framing.method(commands.Basic.ConsumeOk, consumer_tag=tag))
        consumer.start()

    async def _basic_cancel(self, m: commands.Basic.Cancel) -> None:
        consumer = self.consumers.get(m.consumer_tag or "")
        if consumer is not None:
            await self._drop_consumer(consumer)
        if not m.nowait:
            self.send(framing.method(commands.Basic.CancelOk, consumer_tag=m.consumer_tag))

    async def _drop_consumer(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.tag, None)
        await consumer.stop()
        await self.server.remove_consumer(consumer)

    async def cancel_from_server(self, consumer: Consumer) -> None:
        """The queue went away: tell the client (consumer_cancel_notify) and forget it."""
        self.consumers.pop(consumer.tag, None)
        await consumer.stop()
        if self.state.phase is Phase.OPEN and self.connection.cancel_notify:
            self.send(framing.method(commands.Basic.Cancel, consumer_tag=consumer.tag, nowait=True))

    def consumer_lost(self, consumer: Consumer) -> None:
        self.server.in_background(self.cancel_from_server(consumer))

    def wake_consumers(self) -> None:
        for consumer in self.consumers.values():
            consumer.wake()

    async def _expire(self, queue: Queue, view: MessageView) -> bool:
        """Whether ``view`` had expired: then it is dead-lettered or dropped, unseen."""
        now = int(time.time() * 1000)
        if not expired(view, now):
            return False
        await self.server.dead_letters.move(self.vhost, [(queue, view)], EXPIRED, now)
        return True

    async def deliver(self, consumer: Consumer, view: MessageView) -> None:
        if consumer.tag not in self.consumers:  # cancelled meanwhile: back to the queue
            await self.server.queues.requeue(consumer.queue.stored, [view.receipt_handle or ""])
            return
        if await self._expire(consumer.queue, view):
            return
        envelope = decode_envelope(view)
        if consumer.no_ack:
            tag = self.settlement.next_tag()
        else:
            tag = self.settlement.track(consumer.queue, view, consumer)
        self.connection.write(
            framing.encode_deliver(
                self.number,
                consumer.tag,
                tag,
                view.delivery_attempt > 1,
                envelope.exchange,
                envelope.routing_key,
            )
            + framing.encode_content(
                self.number, envelope.raw_properties, view.body, self.connection.frame_max
            )
        )
        if consumer.no_ack:
            await self.server.queues.ack(consumer.queue.stored, [view.receipt_handle or ""])

    async def _basic_get(self, m: commands.Basic.Get) -> None:
        queue = self.vhost.queue(m.queue, self.connection.id, (60, 70))
        self.connection.authorize_read(queue)
        self.server.used(queue)
        await self.connection.writes_seen()
        views, _ = await self.server.queues.receive(queue.stored, 1, self.client_id)
        while views and await self._expire(queue, views[0]):
            views, _ = await self.server.queues.receive(queue.stored, 1, self.client_id)
        if not views:
            self.send(framing.method(commands.Basic.GetEmpty))
            return
        view = views[0]
        envelope = decode_envelope(view)
        if m.no_ack and self.transaction is not None:
            tag = self.settlement.track(queue, view, None)
            await self.transaction.take(self.settlement.unacked[tag])
        elif m.no_ack:
            tag = self.settlement.next_tag()
            await self.server.queues.ack(queue.stored, [view.receipt_handle or ""])
        else:
            tag = self.settlement.track(queue, view, None)
        remaining = await self.server.queues.counts(queue.stored)
        self.connection.write(
            framing.encode_method(
                framing.method(
                    commands.Basic.GetOk,
                    delivery_tag=tag,
                    redelivered=view.delivery_attempt > 1,
                    exchange=envelope.exchange,
                    routing_key=envelope.routing_key,
                    message_count=remaining,
                ),
                self.number,
            )
            + framing.encode_content(
                self.number, envelope.raw_properties, view.body, self.connection.frame_max
            )
        )

    # -- basic: settling -------------------------------------------------------------

    async def _settle(
        self, tag: int, multiple: bool, class_method: tuple[int, int], requeue: bool | None
    ) -> None:
        await self.settlement.settle(self.settlement.take(tag, multiple, class_method), requeue)

    async def _basic_ack(self, m: commands.Basic.Ack) -> None:
        await self._settle(m.delivery_tag, m.multiple, (60, 80), None)

    async def _basic_nack(self, m: commands.Basic.Nack) -> None:
        await self._settle(m.delivery_tag, m.multiple, (60, 120), m.requeue)

    async def _basic_reject(self, m: commands.Basic.Reject) -> None:
        await self._settle(m.delivery_tag or 0, False, (60, 90), m.requeue)

    async def _basic_recover(self, m: commands.Basic.Recover) -> None:
        await self._settle(0, True, (60, 110), True)
        if isinstance(m, commands.Basic.Recover):
            self.send(framing.method(commands.Basic.RecoverOk))

    # -- basic: publishing -----------------------------------------------------------------

    async def _confirm_select(self, m: commands.Confirm.Select) -> None:
        self.state.select(Mode.CONFIRM)
        if not m.nowait:
            self.send(framing.method(commands.Confirm.SelectOk))

    # -- transactions -------------------------------------------------------------------

    async def _tx_select(self, m: commands.Tx.Select) -> None:
        self.state.select(Mode.TX)
        if self.transaction is None:
            self.transaction = Transaction(self)
        self.send(framing.method(commands.Tx.SelectOk))

    async def _tx_commit(self, m: commands.Tx.Commit) -> None:
        if self.transaction is None:
            raise AmqpChannelError(
                PRECONDITION_FAILED, "channel is not transactional: send Tx.Select first", 90, 20
            )
        await self.transaction.commit()
        self.send(framing.method(commands.Tx.CommitOk))

    async def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if self.transaction is None:
            raise AmqpChannelError(
                PRECONDITION_FAILED, "channel is not transactional: send Tx.Select first", 90, 30
            )
        await self.transaction.rollback()
        self.send(framing.method(commands.Tx.RollbackOk))


def _ids(item: object) -> tuple[int, int]:
    index = getattr(item, "index", 0)
    if isinstance(item, Content):
        index = commands.Basic.Publish.index
    return index >> 16, index & 0xFFFF


_HANDLERS: dict[type[base.Frame], Any] = {
    commands.Channel.Close: Channel._channel_close,
    commands.Channel.CloseOk: Channel._channel_close_ok,
    commands.Channel.Flow: Channel._channel_flow,
    commands.Channel.Open: Channel._channel_open,
    commands.Exchange.Declare: Channel._exchange_declare,
    commands.Exchange.Delete: Channel._exchange_delete,
    commands.Exchange.Bind: Channel._exchange_bind,
    commands.Exchange.Unbind: Channel._exchange_unbind,
    commands.Queue.Declare: Channel._queue_declare,
    commands.Queue.Bind: Channel._queue_bind,
    commands.Queue.Unbind: Channel._queue_unbind,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: Channel._queue_delete,
    commands.Basic.Qos: Channel._basic_qos,
    commands.Basic.Consume: Channel._basic_consume,
    commands.Basic.Cancel: Channel._basic_cancel,
    commands.Basic.Get: Channel._basic_get,
    commands.Basic.Ack: Channel._basic_ack,
    commands.Basic.Nack: Channel._basic_nack,
    commands.Basic.Reject: Channel._basic_reject,
    commands.Basic.Recover: Channel._basic_recover,
    commands.Basic.RecoverAsync: Channel._basic_recover,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}
