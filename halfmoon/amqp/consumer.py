"""A Basic.Consume: pops deliveries from its queue while it has credit, pushes them out.

Credit is ``prefetch_count`` unacked deliveries of this consumer (0: no limit)
and, when the channel has a global prefetch, the channel's unacked total.
With credit and nothing to deliver, the consumer parks until the queue's
topic gets an arrival (the broker's arrival listener, through
:class:`halfmoon.amqp.server.Arrivals`), a requeue on this server, or the
next time an in-flight message may be due again (at most a second), so a
redelivery after a timeout is found without an arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from halfmoon.amqp.topology import Queue
from halfmoon.broker.message import MessageView
from halfmoon.errors import HalfmoonError, Unavailable

if TYPE_CHECKING:
    from halfmoon.amqp.channel import Channel

log = logging.getLogger("halfmoon.amqp")

IDLE_RECHECK_S = 1.0
BATCH = 64
STOP_WAIT_S = 5.0  # a stopping consumer's receive and returns in flight get this long


class Consumer:
    def __init__(
        self,
        channel: Channel,
        tag: str,
        queue: Queue,
        no_ack: bool,
        prefetch: int,
        exclusive: bool,
    ) -> None:
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch
        self.exclusive = exclusive
        self.unacked = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._pass_waiters: list[asyncio.Future[None]] = []  # see next_pass
        self._awaiting_credit = False  # parked with no credit: a settle wakes it

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    def credit_freed(self) -> None:
        """A settle on its channel: wake it only if it is waiting for credit (one with
        credit already is woken by arrivals; a wake-up would cost it an empty receive)."""
        if self._awaiting_credit:
            self._wake.set()

    def next_pass(self) -> asyncio.Future[None]:
        """Done once this consumer has looked at its queue again and written what it found
        there (or found it has no credit, or stopped).

        A publish of this connection to this consumer's queue is confirmed after it
        (:class:`~halfmoon.amqp.publisher.Publisher`), so the delivery goes out before the
        confirm, the order RabbitMQ's queues give (a queue hands a message to its consumers,
        then confirms it). aiormq's own tests rely on that order: one that loses the
        connection after a confirm would wait forever for its delivery."""
        waiter = asyncio.get_running_loop().create_future()
        if self._stopped or self._task is None:
            waiter.set_result(None)
            return waiter
        self._pass_waiters.append(waiter)
        self._wake.set()
        return waiter

    def _passed(self, waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def stop(self) -> None:
        """Stop delivering, and return once nothing of this consumer is in flight.

        A receive in flight is let finish rather than cancelled: the broker has handed out
        what it took, and cancelling the await would drop those deliveries on the floor,
        hidden for the delivery timeout. Finished, they go back to the queue (``deliver``
        returns each view of a consumer no longer on its channel) before the caller answers
        Basic.CancelOk or Channel.CloseOk, so the next Basic.Get finds them. Only a loop
        still busy after ``STOP_WAIT_S`` is cancelled."""
        self._stopped = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None or task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        except Exception:  # noqa: BLE001 - the loop logged its own failure
            pass

    def credit(self) -> int:
        if not self.channel.server.may_deliver(self):
            return 0
        limits = [BATCH]
        if self.prefetch:
            limits.append(self.prefetch - self.unacked)
        channel_limit = self.channel.global_credit()
        if channel_limit is not None:
            limits.append(channel_limit)
        return min(limits)

    async def _run(self) -> None:
        arrivals = self.channel.server.arrivals
        stored = self.queue.stored
        unavailable = False  # the last receive found the queue's broker away
        passing: list[asyncio.Future[None]] = []
        try:
            # The flag, not only the cancellation, ends the loop: a cancellation that meets a
            # wake-up in the same turn can be lost.
            while not self._stopped:
                # The publishes waiting on this pass (next_pass) were stored before it began.
                passing, self._pass_waiters = self._pass_waiters, []
                credit = self.credit()
                if credit <= 0 or self.channel.flow_paused:
                    self._passed(passing)
                    self._wake.clear()
                    self._awaiting_credit = True
                    try:
                        await self._wake.wait()
                    finally:
                        self._awaiting_credit = False
                    continue
                self._wake.clear()
                # Watched from before the receive until the next one: an arrival while the
                # receive or the deliveries run sets the flag, and the loop reads again.
                arrivals.watch(stored, self._wake)
                try:
                    try:
                        views, next_due = await self.channel.server.queues.receive(
                            stored, credit, self.channel.client_id
                        )
                        unavailable = False
                    except Unavailable as exc:
                        # The queue's broker is down or restarting (through a cluster proxy):
                        # the consumer, its channel and its deliveries wait for it, as quorum
                        # queues' consumers outlive a leader's change.
                        if not unavailable:
                            log.info(
                                "event=amqp_consumer_waiting tag=%s reason=%s", self.tag, exc.code
                            )
                        unavailable = True
                        self._passed(passing)
                        await self._park(None)
                        continue
                    if not views:
                        self._passed(passing)
                        await self._park(next_due)
                        continue
                    await self._deliver_all(views)
                    self._passed(passing)
                    if len(views) < credit and not self._wake.is_set():
                        # The queue held no more when it was read, and nothing arrived or
                        # asked for a pass since: reading it again now would find nothing.
                        await self._park(None)
                finally:
                    arrivals.unwatch(stored, self._wake)
        except asyncio.CancelledError:
            raise
        except HalfmoonError as exc:
            # The queue's topic went away (deleted under us): the channel tells the client.
            log.info("event=amqp_consumer_ended tag=%s reason=%s", self.tag, exc.code)
            self.channel.consumer_lost(self)
        except Exception:
            log.exception("event=amqp_consumer_failed tag=%s", self.tag)
            self.channel.consumer_lost(self)
        finally:
            self._stopped = True  # a next_pass from now on is done at once
            self._passed(passing + self._pass_waiters)

    async def _park(self, next_due: int | None) -> None:
        # next_due is epoch ms; the recheck bound covers it (deliveries are hidden 30 min).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(IDLE_RECHECK_S):
                await self._wake.wait()

    async def _deliver_all(self, views: list[MessageView]) -> None:
        deliver: Callable[[Consumer, MessageView], Awaitable[None]] = self.channel.deliver
        for view in views:
            await deliver(self, view)  # after a stop, deliver returns each to the queue
