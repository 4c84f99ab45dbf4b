"""A publish confirmed to a connection that also consumes from the queue: the delivery is
written before the confirm, as RabbitMQ orders them.

A client that loses its connection between the two has its publish confirmed and never
sees the delivery; aiormq's test_connection_close_stairway waits for it forever. Raw frames,
so the order on the wire is what is checked, not a client's scheduling of callbacks.
"""

from __future__ import annotations

import socket
import uuid

from pamqp import body, commands, header
from pamqp import frame as pamqp_frame

from tests.amqp.test_listener_fuzz import HANDSHAKE
from tests.server.conftest import ServerProcess

PUBLISHES = 30


class FrameSocket:
    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.buffer = b""

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def next(self) -> object:
        while True:
            if self.buffer:
                try:
                    used, _, value = pamqp_frame.unmarshal(self.buffer)
                except Exception:  # noqa: BLE001 - pamqp: not a whole frame yet
                    used = 0
                if used:
                    self.buffer = self.buffer[used:]
                    return value
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.buffer += chunk

    def until(self, kind: type) -> object:
        while not isinstance(value := self.next(), kind):
            pass
        return value


def test_a_consuming_publisher_gets_each_delivery_before_its_confirm(
    amqp_server: ServerProcess,
) -> None:
    host, port = (amqp_server.amqp_address or "").rsplit(":", 1)
    queue = f"order-{uuid.uuid4().hex[:8]}"
    client = FrameSocket((host, int(port)))
    try:
        client.send(HANDSHAKE)
        client.until(commands.Channel.OpenOk)
        client.send(
            pamqp_frame.marshal(commands.Confirm.Select(), 1),
            pamqp_frame.marshal(commands.Queue.Declare(queue=queue, auto_delete=True), 1),
            pamqp_frame.marshal(commands.Basic.Consume(queue=queue, no_ack=True), 1),
        )
        client.until(commands.Basic.ConsumeOk)
        seen: list[tuple[str, int]] = []
        for n in range(1, PUBLISHES + 1):
            payload = f"m{n}".encode()
            client.send(
                pamqp_frame.marshal(commands.Basic.Publish(routing_key=queue), 1),
                pamqp_frame.marshal(header.ContentHeader(0, len(payload)), 1),
                pamqp_frame.marshal(body.ContentBody(payload), 1),
            )
            # One publish at a time, as the stairway test does: read until both are in.
            got = {"delivery": False, "confirm": False}
            while not all(got.values()):
                value = client.next()
                if isinstance(value, commands.Basic.Deliver):
                    seen.append(("delivery", n))
                    got["delivery"] = True
                elif isinstance(value, commands.Basic.Ack):
                    seen.append(("confirm", value.delivery_tag))
                    got["confirm"] = True
        expected = [(kind, n) for n in range(1, PUBLISHES + 1) for kind in ("delivery", "confirm")]
        assert seen == expected
    finally:
        client.sock.close()
