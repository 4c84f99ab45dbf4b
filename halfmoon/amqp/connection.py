"""The socket side of one AMQP connection: a thin loop around its sans-IO state.

Bytes go through :class:`~halfmoon.amqp.framing.FrameReader`; channel 0's
methods drive :class:`~halfmoon.amqp.connection_state.ConnectionState`
(Start, Tune, Open, Close); other channels' frames are assembled by their
:class:`~halfmoon.amqp.channel_state.ChannelState` and handed to their
:class:`~halfmoon.amqp.channel.Channel`. A malformed frame or a method out of
turn closes this connection (Connection.Close with the reply code, then the
socket after Close-Ok or a second), never the server.

Heartbeats run both ways once tuned: the server sends one when it has written
nothing for half the interval, and closes a connection it has heard nothing
from for two intervals. A channel with a long backlog pauses reading from
the socket until it catches up (back-pressure on a fast publisher).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, cast

from pamqp import base, commands

from halfmoon.amqp import disk_alarm, framing
from halfmoon.amqp.authentication import MECHANISMS, credentials
from halfmoon.amqp.channel import Channel
from halfmoon.amqp.channel_state import Phase as ChannelPhase
from halfmoon.amqp.connection_state import CHANNEL_MAX, FRAME_MAX, HEARTBEAT, ConnectionState, Phase
from halfmoon.amqp.names import namespace_of
from halfmoon.amqp.reply_codes import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    AmqpChannelError,
    AmqpConnectionError,
    AmqpError,
)
from halfmoon.amqp.topology import Queue, VHost
from halfmoon.errors import HalfmoonError

if TYPE_CHECKING:
    from halfmoon.amqp.server import AmqpServer

log = logging.getLogger("halfmoon.amqp")

PAUSE_BACKLOG = 256
RESUME_BACKLOG = 32
CLOSE_WAIT_S = 1.0

SERVER_PROPERTIES = {
    "product": "halfmoon",
    "platform": "Python",
    "information": "https://github.com/halfmoon (AMQP 0-9-1 beside RocketMQ 5 gRPC)",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "exchange_exchange_bindings": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
        "connection.blocked": True,
    },
}


class AmqpConnection(asyncio.Protocol):
    def __init__(self, server: AmqpServer) -> None:
        self.server = server
        self.id = server.connection_id()
        self.state = ConnectionState()
        self.reader = framing.FrameReader(framing.MIN_FRAME_MAX)
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: list[Queue] = []
        self.vhost: VHost
        self.user: object | None = None
        self.cancel_notify = False
        # What the client said of itself (product, version, platform): /metrics' clients.
        self.client_properties: dict[str, object] = {}
        self.peer = ""
        self._transport: asyncio.Transport | None = None
        self._paused = False  # not read: its channels' backlogs are long
        self._blocked = False  # not read: it published during the disk alarm
        self.blocked_notify = False  # the client takes Connection.Blocked / Unblocked
        self._last_read = time.monotonic()
        self._last_write = time.monotonic()
        self._heartbeat: asyncio.Task[None] | None = None
        self._closer: asyncio.TimerHandle | None = None
        self._header_done = False
        # This connection's publishes stored and not yet durable (under sync flush, not yet
        # readable either): see writes_seen.
        self._unseen_writes: set[asyncio.Future[object]] = set()
        # Frames written in one loop turn, sent together at its end (see write).
        self._outgoing: list[bytes] = []

    @property
    def frame_max(self) -> int:
        return self.state.tuning.frame_max

    def wrote(self, durable: asyncio.Future[object]) -> None:
        """A publish of this connection is stored; ``durable`` completes when it is readable."""
        self._unseen_writes.add(durable)
        durable.add_done_callback(self._unseen_writes.discard)

    async def writes_seen(self) -> None:
        """Return once every publish this connection stored so far is readable.

        A message is readable once durable (under sync flush, after the fsync that covers
        it), and a publish without confirms is not waited for. A Basic.Get or a message
        count waits for these first, so it sees what the client published before it, as
        with RabbitMQ (pika's TestZ_PublishAndGet publishes and gets at once)."""
        if self._unseen_writes:
            await asyncio.wait(list(self._unseen_writes))

    # -- transport callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's implements asyncio.Transport without subclassing it).
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.server.connections.discard(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self.server.in_background(self._cleanup())

    async def _cleanup(self) -> None:
        for channel in list(self.channels.values()):
            try:
                await channel.close()
            except Exception:  # noqa: BLE001 - every channel gets its chance
                log.exception("event=amqp_channel_cleanup_failed")
        self.channels.clear()
        for queue in self.exclusive_queues:
            with contextlib.suppress(Exception):
                await self.server.delete_queue(self.vhost, queue)
        self.exclusive_queues.clear()

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        try:
            if not self._header_done:
                header = self.reader.take_protocol_header(data)
                if header is None:
                    return
                self._header_done = True
                try:
                    self.state.header_received(header)
                except AmqpConnectionError:
                    # Not AMQP 0-9-1: answer with the header we speak and hang up (the spec).
                    self.write(framing.PROTOCOL_HEADER)
                    self._abort()
                    return
                self._send_start()
                data = self.reader.pending()
            for frame in self.reader.feed(data):
                self._frame(frame)
                if self._transport is None:
                    return
        except AmqpConnectionError as exc:
            self.fail(exc)
        except Exception as exc:  # noqa: BLE001 - this connection ends, the server lives
            log.exception("event=amqp_connection_failed peer=%s", self.peer)
            self.fail(AmqpConnectionError(INTERNAL_ERROR, f"internal error: {exc}"))

    def _frame(self, frame: framing.Frame) -> None:
        if frame.kind == framing.FRAME_HEARTBEAT:
            return
        if frame.channel == 0:
            if frame.kind != framing.FRAME_METHOD:
                raise AmqpConnectionError(
                    framing.FRAME_ERROR if False else 505,
                    "content frame on channel 0",
                )
            self._connection_method(framing.decode_method(frame.payload))
            return
        self.state.check_channel(frame.channel)
        if not self.state.accepting:
            return  # closing: dropped
        if frame.kind == framing.FRAME_METHOD:
            self._channel_method(frame.channel, framing.decode_method(frame.payload))
            return
        channel = self.channels.get(frame.channel)
        if channel is None:
            raise AmqpConnectionError(CHANNEL_ERROR, f"channel {frame.channel} is not open")
        if frame.kind == framing.FRAME_HEADER:
            done = channel.state.header_arrived(framing.decode_content_header(frame.payload))
        else:
            done = channel.state.body_arrived(frame.payload)
        if done is not None:
            self._submit(channel, done)
            if self.server.disk_alarm.active and not self._blocked:
                self._block()

    def _channel_method(self, number: int, m: base.Frame) -> None:
        channel = self.channels.get(number)
        if isinstance(m, commands.Channel.Open):
            if channel is not None:
                raise AmqpConnectionError(
                    CHANNEL_ERROR, f"channel {number} is already open", 20, 10
                )
            self.state.check_open(len(self.channels))
            self.channels[number] = Channel(self, number)
            self.write(framing.encode_method(framing.method(commands.Channel.OpenOk), number))
            return
        if channel is None:
            raise AmqpConnectionError(
                CHANNEL_ERROR, f"channel {number} is not open: send Channel.Open first"
            )
        if isinstance(m, commands.Channel.CloseOk):
            # The number is free at once: a client may reopen it in its next frame.
            self.channels.pop(number, None)
            channel.submit(m)
            return
        if channel.state.phase is ChannelPhase.CLOSING and not isinstance(
            m, commands.Channel.Close | commands.Channel.CloseOk
        ):
            return
        if isinstance(m, commands.Basic.Publish):
            channel.state.start_publish(m)
            return
        channel.state.method_arrived(m.name)
        self._submit(channel, m)

    def _submit(self, channel: Channel, item: object) -> None:
        channel.submit(item)  # type: ignore[arg-type]
        if channel.backlog > PAUSE_BACKLOG and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume_if_drained(self) -> None:
        if self._paused and all(c.backlog < RESUME_BACKLOG for c in self.channels.values()):
            self._paused = False
            if self._transport is not None and not self._blocked:
                self._transport.resume_reading()

    # -- the disk alarm (halfmoon.amqp.disk_alarm) ---------------------------------------

    def _block(self) -> None:
        """A publish during the disk alarm: read no more from this client until it ends (that
        publish, and what else was read with it, is handled)."""
        self._blocked = True
        if self._transport is not None:
            self._transport.pause_reading()
        if self.blocked_notify:
            self.write(
                framing.encode_method(
                    framing.method(commands.Connection.Blocked, reason=disk_alarm.REASON), 0
                )
            )
        log.info("event=amqp_connection_blocked peer=%s", self.peer)

    def alarm_changed(self, active: bool) -> None:
        """The disk alarm went off: a blocked connection is told and read again. (Set, it
        blocks each connection at its next publish.)"""
        if active or not self._blocked:
            return
        self._blocked = False
        self._last_read = time.monotonic()  # its heartbeats were not read meanwhile
        if self.blocked_notify:
            self.write(framing.encode_method(framing.method(commands.Connection.Unblocked), 0))
        if self._transport is not None and not self._paused:
            self._transport.resume_reading()
        log.info("event=amqp_connection_unblocked peer=%s", self.peer)

    # -- channel 0 ---------------------------------------------------------------------

    def _send_start(self) -> None:
        self.write(
            framing.encode_method(
                framing.method(
                    commands.Connection.Start,
                    version_major=0,
                    version_minor=9,
                    server_properties=SERVER_PROPERTIES,
                    mechanisms=" ".join(MECHANISMS),
                    locales="en_US",
                ),
                0,
            )
        )

    def _connection_method(self, m: base.Frame) -> None:
        phase = self.state.method_received(m)
        if isinstance(m, commands.Connection.StartOk):
            self._start_ok(m)
        elif isinstance(m, commands.Connection.TuneOk):
            self.reader.frame_max = self.state.tuning.frame_max
            if self.state.tuning.heartbeat:
                self._heartbeat = asyncio.get_running_loop().create_task(
                    self._beat(self.state.tuning.heartbeat)
                )
        elif isinstance(m, commands.Connection.Open):
            self._open(m)
        elif isinstance(m, commands.Connection.Close):
            self.write(framing.encode_method(framing.method(commands.Connection.CloseOk), 0))
            self._close_transport()
        elif isinstance(m, commands.Connection.CloseOk):
            self._close_transport()
        elif isinstance(m, commands.Connection.UpdateSecret):
            self.write(framing.encode_method(framing.method(commands.Connection.UpdateSecretOk), 0))
        del phase

    def _start_ok(self, m: commands.Connection.StartOk) -> None:
        properties = m.client_properties if isinstance(m.client_properties, dict) else {}
        self.client_properties = dict(properties)
        capabilities = properties.get("capabilities")
        self.cancel_notify = isinstance(capabilities, dict) and bool(
            capabilities.get("consumer_cancel_notify")
        )
        self.blocked_notify = isinstance(capabilities, dict) and bool(
            capabilities.get("connection.blocked")
        )
        mechanism = m.mechanism or "PLAIN"
        response = m.response if isinstance(m.response, bytes) else str(m.response).encode()
        user, password = credentials(mechanism, response)
        guard = self.server.guard
        if guard is not None and guard.enabled:
            try:
                self.user = guard.authenticate_password(user, password, self.peer, "amqp.connect")
            except HalfmoonError:
                raise AmqpConnectionError(
                    ACCESS_REFUSED,
                    f"Login was refused using authentication mechanism {mechanism}: user "
                    f"{user[:64]!r} is unknown, disabled, or the password is wrong",
                ) from None
        self.write(
            framing.encode_method(
                framing.method(
                    commands.Connection.Tune,
                    channel_max=CHANNEL_MAX,
                    frame_max=FRAME_MAX,
                    heartbeat=HEARTBEAT,
                ),
                0,
            )
        )

    def _open(self, m: commands.Connection.Open) -> None:
        namespace = namespace_of(m.virtual_host)
        self.vhost = self.server.topology.vhost(m.virtual_host or "/", namespace)
        self.write(framing.encode_method(framing.method(commands.Connection.OpenOk), 0))

    async def _beat(self, interval: int) -> None:
        while self._transport is not None:
            await asyncio.sleep(interval / 2)
            now = time.monotonic()
            if self._blocked:  # not reading, as it was told: its heartbeats wait unread
                self._last_read = now
            if now - self._last_read > 2 * interval:
                log.info("event=amqp_heartbeat_missed peer=%s interval_s=%d", self.peer, interval)
                self._abort()
                return
            if now - self._last_write >= interval / 2:
                self.write(framing.HEARTBEAT_FRAME)

    # -- output and closing -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the client; what one loop turn writes is sent at its end, in
        one socket write (and under TLS one record).

        RabbitMQ's writer does the same (it flushes when its mailbox is empty). Beside the
        syscalls it saves, it keeps a publish's confirm and the delivery that publish caused,
        which the consumer writes one turn later, in one segment: sent apart, a client that
        loses the connection between them has its publish confirmed and never sees the
        delivery (aiormq's test_connection_close_stairway waits for it forever)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(data)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        transport = self._transport
        if outgoing and transport is not None and not transport.is_closing():
            transport.write(b"".join(outgoing) if len(outgoing) > 1 else outgoing[0])
            self._last_write = time.monotonic()

    def channel_closed(self, channel: Channel) -> None:
        if self.channels.get(channel.number) is channel:  # not a new channel of that number
            del self.channels[channel.number]

    def fail(self, error: AmqpError) -> None:
        """Close the connection for ``error``: Connection.Close, then the socket."""
        if isinstance(error, AmqpChannelError):  # raised where only a channel was known
            error = AmqpConnectionError(error.code, error.text, error.class_id, error.method_id)
        if self.state.phase in (Phase.CLOSING, Phase.CLOSED):
            return
        log.info(
            "event=amqp_connection_error peer=%s code=%d text=%s",
            self.peer,
            error.code,
            ascii(error.text),
        )
        if self.state.phase is Phase.AWAIT_HEADER:
            self._abort()
            return
        self.state.closing()
        self.write(framing.encode_method(framing.close_for(commands.Connection.Close, error), 0))
        self._closer = asyncio.get_running_loop().call_later(CLOSE_WAIT_S, self._abort)

    def shutdown(self) -> None:
        """The server is stopping: 320 CONNECTION_FORCED."""
        self.fail(AmqpConnectionError(CONNECTION_FORCED, "broker forced connection closure"))

    def _close_transport(self) -> None:
        if self._closer is not None:
            self._closer.cancel()
        self._flush()  # a closing transport still sends what it holds; ours first
        if self._transport is not None:
            self._transport.close()

    def _abort(self) -> None:
        self._flush()  # what the socket takes at once still goes (the protocol header)
        if self._transport is not None:
            self._transport.abort()

    # -- authorization (see docs/security.md) ----------------------------------------------

    def authorize_configure(self, name: str, exchange: bool) -> None:
        self.server.authorize(self, "configure", name, exchange)

    def authorize_write(self, queue: Queue) -> None:
        if self.user is not None:
            self.server.authorize(self, "write", queue.name, False)

    def authorize_read(self, queue: Queue) -> None:
        if self.user is not None:
            self.server.authorize(self, "read", queue.name, False)
