"""The send listener's bound on in-flight work, in process, over a service whose writes
stay not durable until the test says so.

A connection has at most ``MAX_IN_FLIGHT_PER_CONNECTION`` requests waiting for
durability; the listener reads its next frame only when one of them is
answered, so a peer that sends faster than the store makes writes durable is
held back by its own socket instead of piling work up in the broker.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from halfmoon.broker import OutgoingMessage
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.send.frames import HEADER, frame
from halfmoon.cluster.internal.send.listener import MAX_IN_FLIGHT_PER_CONNECTION, SendListener
from tests.waiting import wait_until

WAIT_S = 10.0
EXTRA = 6  # requests sent beyond the bound


class HeldService:
    """What the listener asks of InternalService; every write stays pending until released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.durable: list[concurrent.futures.Future[None]] = []

    def version_refusal(self, sent: object) -> wire.WireVersionMismatch | None:
        return None if sent == wire.version_token() else wire.WireVersionMismatch("mismatch")

    def hello_answer(self) -> dict[str, Any]:
        return {"broker": "held", "version": wire.version_token()}

    def store_batches(
        self, batches: list[list[OutgoingMessage]], epoch: int | None = None
    ) -> tuple[list[object], list[concurrent.futures.Future[None]]]:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self.lock:
            self.durable.append(future)
        return [f"stored-{len(b)}" for b in batches], [future]

    def remember_half_senders(self, batches: object, answers: object, peer: object) -> None:
        pass

    def stored(self) -> int:
        with self.lock:
            return len(self.durable)


@pytest.fixture
def held() -> Iterator[tuple[HeldService, SendListener]]:
    service = HeldService()
    listener = SendListener(service, "127.0.0.1")  # type: ignore[arg-type]
    listener.start()
    yield service, listener
    listener.close()


def read_frame(sock: socket.socket) -> Any:
    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    (size,) = HEADER.unpack(exactly(HEADER.size))
    return wire.decode(exactly(size))


def test_a_connection_has_at_most_the_bound_of_requests_waiting_for_durability(
    held: tuple[HeldService, SendListener],
) -> None:
    service, listener = held
    total = MAX_IN_FLIGHT_PER_CONNECTION + EXTRA
    with socket.create_connection(("127.0.0.1", listener.port), timeout=WAIT_S) as sock:
        sock.sendall(frame(wire.encode({"version": wire.version_token(), "peer": "test"})))
        assert read_frame(sock)["broker"] == "held"
        message = OutgoingMessage("orders", b"x", message_id="m")
        sock.sendall(b"".join(frame(wire.encode([i, 60_000, [[message]]])) for i in range(total)))

        wait_until(
            lambda: service.stored() >= MAX_IN_FLIGHT_PER_CONNECTION,
            WAIT_S,
            "the first requests",
            interval=0.01,
        )
        # Every frame is in the listener's socket buffer; the ones past the bound stay
        # unread while the first ones wait (watched for a while: nothing else is due).
        watch_until = time.monotonic() + 0.5
        while time.monotonic() < watch_until:
            assert service.stored() == MAX_IN_FLIGHT_PER_CONNECTION
            time.sleep(0.01)

        # One write becomes durable: its request is answered and one more frame is read.
        service.durable[0].set_result(None)
        assert read_frame(sock) == [0, ["stored-1"]]
        wait_until(
            lambda: service.stored() == MAX_IN_FLIGHT_PER_CONNECTION + 1,
            WAIT_S,
            "one more request",
            interval=0.01,
        )

        # The rest become durable as they arrive: every request is answered once.
        answered = {0}
        while len(answered) < total:
            with service.lock:
                pending = [f for f in service.durable if not f.done()]
            for future in pending:
                future.set_result(None)
            request_id, answers = read_frame(sock)
            assert answers == ["stored-1"] and request_id not in answered
            answered.add(request_id)
        assert answered == set(range(total))
        assert service.stored() == total
