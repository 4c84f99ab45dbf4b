"""A bare AMQP 0-9-1 server with no store: the floor under any Python AMQP broker.

    python -m bench.amqp_floor --port 5699 [--uvloop]

It answers the frames the AMQP benchmark's clients send (pika and aio-pika:
the connection handshake, channels, declares, binds, purges, qos, consume,
publish with confirms, get, ack, tx) from a plain ``asyncio.Protocol``
(``--uvloop``: on uvloop's loop), routing in memory: a queue is a deque, a
durable flag or a persistent message changes nothing, and nothing is written
anywhere. What it costs per message is what the socket, the event loop and
pamqp's frame codec cost, the part of halfmoon's AMQP endpoint no store work
can remove. It prints :data:`bench.grpc_floor.READY_LINE` when it listens,
so :class:`AmqpFloorServer` starts it as the other floors start.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands as spec
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

from bench.grpc_floor import READY_LINE, FloorServer

FRAME_MAX = 131072
_names = itertools.count(1)


@dataclass(eq=False)
class Message:
    exchange: str
    routing_key: str
    header: ContentHeader
    body: bytes


@dataclass(eq=False)
class Consumer:
    channel: Channel
    tag: str
    no_ack: bool


@dataclass(eq=False)
class Queue:
    name: str
    messages: deque[Message] = field(default_factory=deque)
    consumers: list[Consumer] = field(default_factory=list)
    turn: int = 0


class Broker:
    """Exchanges and queues in memory, shared by every connection."""

    def __init__(self) -> None:
        self.queues: dict[str, Queue] = {}
        self.bindings: dict[str, set[str]] = {}  # exchange -> queue names (any key routes)

    def route(self, message: Message) -> None:
        names = (
            self.bindings.get(message.exchange, set())
            if message.exchange
            else {message.routing_key}
        )
        for name in names:
            queue = self.queues.get(name)
            if queue is not None:
                queue.messages.append(message)
                self.dispatch(queue)

    def dispatch(self, queue: Queue) -> None:
        while queue.messages and queue.consumers:
            ready = [c for c in queue.consumers if c.no_ack or c.channel.has_room()]
            if not ready:
                return
            consumer = ready[queue.turn % len(ready)]
            queue.turn += 1
            consumer.channel.deliver(consumer, queue.messages.popleft())


class Channel:
    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.prefetch = 0
        self.unacked: deque[int] = deque()  # delivery tags not yet acked, in order
        self.delivery_tag = 0
        self.confirming = False
        self.published = 0
        self.pending: tuple[spec.Basic.Publish, ContentHeader | None] | None = None
        self.body: list[bytes] = []
        self.consumers: dict[str, Queue] = {}

    def has_room(self) -> bool:
        return self.prefetch == 0 or len(self.unacked) < self.prefetch

    def deliver(self, consumer: Consumer, message: Message) -> None:
        self.delivery_tag += 1
        if not consumer.no_ack:
            self.unacked.append(self.delivery_tag)
        deliver = spec.Basic.Deliver(
            consumer.tag, self.delivery_tag, False, message.exchange, message.routing_key
        )
        self.connection.send(self.number, deliver, message.header, ContentBody(message.body))

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            while self.unacked and self.unacked[0] <= delivery_tag:
                self.unacked.popleft()
        else:
            self.unacked.remove(delivery_tag)
        for queue in set(self.consumers.values()):
            self.connection.broker.dispatch(queue)


class Connection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.buffer = bytearray()
        self.channels: dict[int, Channel] = {}
        self.transport: asyncio.Transport | None = None
        self.started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        for channel in self.channels.values():
            for queue in set(channel.consumers.values()):
                queue.consumers = [c for c in queue.consumers if c.channel is not channel]

    def send(self, channel: int, *frames: Any) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(amqp_frame.marshal(f, channel) for f in frames))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                del self.buffer[:8]
                self.started = True
                start = spec.Connection.Start(
                    server_properties={
                        "product": "halfmoon-floor",
                        "capabilities": {"publisher_confirms": True, "basic.nack": True},
                    },
                    mechanisms="PLAIN AMQPLAIN",
                )
                self.send(0, start)
                continue
            if len(self.buffer) < 7:
                return
            size = int.from_bytes(self.buffer[3:7], "big")
            if len(self.buffer) < size + 8:
                return
            consumed, channel, value = amqp_frame.unmarshal(bytes(self.buffer[: size + 8]))
            del self.buffer[:consumed]
            self.handle(channel, value)

    def handle(self, number: int, value: Any) -> None:
        if isinstance(value, (Heartbeat, ProtocolHeader)):
            return
        channel = self.channels.get(number)
        if isinstance(value, ContentHeader):
            assert channel is not None and channel.pending is not None
            channel.pending = (channel.pending[0], value)
            if value.body_size == 0:
                self.publish(channel)
            return
        if isinstance(value, ContentBody):
            assert channel is not None and channel.pending is not None
            channel.body.append(value.value)
            header = channel.pending[1]
            if header is not None and sum(map(len, channel.body)) >= header.body_size:
                self.publish(channel)
            return
        self.method(number, channel, value)

    def publish(self, channel: Channel) -> None:
        assert channel.pending is not None
        method, header = channel.pending
        assert header is not None
        body = b"".join(channel.body)
        channel.pending, channel.body = None, []
        self.broker.route(Message(method.exchange, method.routing_key, header, body))
        if channel.confirming:
            channel.published += 1
            self.send(channel.number, spec.Basic.Ack(channel.published))

    def method(self, number: int, channel: Channel | None, m: Any) -> None:
        reply: Any = None
        broker = self.broker
        if isinstance(m, spec.Connection.StartOk):
            reply = spec.Connection.Tune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)
        elif isinstance(m, spec.Connection.TuneOk):
            return
        elif isinstance(m, spec.Connection.Open):
            reply = spec.Connection.OpenOk()
        elif isinstance(m, spec.Connection.Close):
            self.send(0, spec.Connection.CloseOk())
            assert self.transport is not None
            self.transport.close()
            return
        elif isinstance(m, spec.Channel.Open):
            self.channels[number] = Channel(self, number)
            reply = spec.Channel.OpenOk()
        elif isinstance(m, spec.Channel.Close):
            closing = self.channels.pop(number, None)
            if closing is not None:
                for queue in set(closing.consumers.values()):
                    queue.consumers = [c for c in queue.consumers if c.channel is not closing]
            reply = spec.Channel.CloseOk()
        elif channel is None:
            return
        elif isinstance(m, spec.Basic.Publish):
            channel.pending = (m, None)
            return
        elif isinstance(m, spec.Basic.Ack):
            channel.ack(m.delivery_tag, m.multiple)
            return
        elif isinstance(m, spec.Confirm.Select):
            channel.confirming = True
            reply = spec.Confirm.SelectOk() if not m.nowait else None
        elif isinstance(m, spec.Tx.Select):
            reply = spec.Tx.SelectOk()
        elif isinstance(m, spec.Tx.Commit):
            reply = spec.Tx.CommitOk()
        elif isinstance(m, spec.Tx.Rollback):
            reply = spec.Tx.RollbackOk()
        elif isinstance(m, spec.Basic.Qos):
            channel.prefetch = m.prefetch_count
            reply = spec.Basic.QosOk()
        elif isinstance(m, spec.Exchange.Declare):
            broker.bindings.setdefault(m.exchange, set())
            reply = spec.Exchange.DeclareOk()
        elif isinstance(m, spec.Exchange.Delete):
            broker.bindings.pop(m.exchange, None)
            reply = spec.Exchange.DeleteOk()
        elif isinstance(m, spec.Queue.Declare):
            name = m.queue or f"amq.gen-floor-{next(_names)}"
            queue = broker.queues.setdefault(name, Queue(name))
            reply = spec.Queue.DeclareOk(name, len(queue.messages), len(queue.consumers))
        elif isinstance(m, spec.Queue.Bind):
            broker.bindings.setdefault(m.exchange, set()).add(m.queue)
            reply = spec.Queue.BindOk()
        elif isinstance(m, spec.Queue.Purge):
            purged = broker.queues.get(m.queue)
            count = len(purged.messages) if purged else 0
            if purged:
                purged.messages.clear()
            reply = spec.Queue.PurgeOk(count)
        elif isinstance(m, spec.Queue.Delete):
            gone = broker.queues.pop(m.queue, None)
            for names in broker.bindings.values():
                names.discard(m.queue)
            reply = spec.Queue.DeleteOk(len(gone.messages) if gone else 0)
        elif isinstance(m, spec.Basic.Consume):
            queue = broker.queues.setdefault(m.queue, Queue(m.queue))
            tag = m.consumer_tag or f"ctag-floor-{next(_names)}"
            queue.consumers.append(Consumer(channel, tag, m.no_ack))
            channel.consumers[tag] = queue
            self.send(number, spec.Basic.ConsumeOk(tag))
            broker.dispatch(queue)
            return
        elif isinstance(m, spec.Basic.Cancel):
            queue = channel.consumers.pop(m.consumer_tag, None)
            if queue is not None:
                queue.consumers = [c for c in queue.consumers if c.tag != m.consumer_tag]
            reply = spec.Basic.CancelOk(m.consumer_tag)
        elif isinstance(m, spec.Basic.Get):
            source = broker.queues.get(m.queue)
            if source is None or not source.messages:
                reply = spec.Basic.GetEmpty()
            else:
                message = source.messages.popleft()
                channel.delivery_tag += 1
                get_ok = spec.Basic.GetOk(
                    channel.delivery_tag, False, message.exchange, message.routing_key,
                    len(source.messages),
                )  # fmt: skip
                self.send(number, get_ok, message.header, ContentBody(message.body))
                return
        if reply is not None:
            self.send(number, reply)


async def serve(port: int) -> None:
    broker = Broker()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(broker), "127.0.0.1", port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(READY_LINE, flush=True)
    async with server:
        await stop.wait()


class AmqpFloorServer(FloorServer):
    """The floor as a subprocess on a free port; ``url`` is what the clients dial."""

    def __init__(self, *, use_uvloop: bool = False) -> None:
        super().__init__()
        self.use_uvloop = use_uvloop

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.grpc_port}/"

    def command(self) -> list[str]:
        extra = ["--uvloop"] if self.use_uvloop else []
        return [sys.executable, "-m", "bench.amqp_floor", "--port", str(self.grpc_port), *extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.amqp_floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args(argv)
    if args.uvloop:
        import uvloop

        uvloop.run(serve(args.port))
    else:
        asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
