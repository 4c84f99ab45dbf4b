"""The AMQP listener against malformed input: every connection that sends garbage is closed,
the server stays up, and a connection opened before the fuzzing still works, with the
message it had confirmed still there (hypothesis drives the input)."""

from __future__ import annotations

import socket
import struct
import uuid

import pika
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pamqp_frame

from tests.server.conftest import ServerProcess

HEADER = b"AMQP\x00\x00\x09\x01"


def _handshake() -> bytes:
    parts = [
        commands.Connection.StartOk(
            client_properties={"product": "fuzz"}, mechanism="PLAIN", response="\0guest\0guest"
        ),
        commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0),
        commands.Connection.Open(virtual_host="/"),
        commands.Channel.Open(),
    ]
    return HEADER + b"".join(
        pamqp_frame.marshal(p, 1 if isinstance(p, commands.Channel.Open) else 0) for p in parts
    )


HANDSHAKE = _handshake()


def raw_frame(kind: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + bytes((end,))


frames = st.builds(
    raw_frame,
    st.sampled_from([1, 2, 3, 4, 8, 0, 255]),
    st.sampled_from([0, 1, 2, 65535]),
    st.binary(max_size=64),
    st.sampled_from([0xCE, 0xCE, 0xCE, 0x00, 0xFF]),
)
# Method frames with a real method index and a garbled argument list.
methods = st.builds(
    lambda index, body, channel: raw_frame(1, channel, struct.pack(">I", index) + body),
    st.sampled_from(sorted(commands.INDEX_MAPPING)),
    st.binary(max_size=48),
    st.sampled_from([0, 1]),
)
inputs = st.one_of(
    st.binary(max_size=200),  # no protocol header at all
    st.builds(lambda b: HEADER + b, st.binary(max_size=200)),
    st.builds(
        lambda fs: HANDSHAKE + b"".join(fs), st.lists(st.one_of(frames, methods), max_size=4)
    ),
    st.builds(lambda b: HANDSHAKE + b, st.binary(min_size=1, max_size=200)),
)


def _send(address: tuple[str, int], data: bytes) -> None:
    with socket.create_connection(address, timeout=5) as sock:
        sock.settimeout(0.2)
        try:
            sock.sendall(data)
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError, OSError):
            pass


def test_malformed_frames_close_only_their_connection(
    amqp_server: ServerProcess, amqp_url: str
) -> None:
    host, port = amqp_server.amqp_address.rsplit(":", 1)
    address = (host, int(port))
    witness = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = witness.channel()
    queue = f"fuzz.{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"confirmed before the fuzzing")

    @settings(
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(inputs)
    def attack(data: bytes) -> None:
        _send(address, data)

    attack()
    assert amqp_server.alive(), amqp_server.log_tail()
    assert not [line for line in amqp_server.lines if "Traceback" in line], amqp_server.log_tail()
    # The connection opened before is untouched and the confirmed message is still there.
    method, _props, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"confirmed before the fuzzing"
    witness.close()
    fresh = pika.BlockingConnection(pika.URLParameters(amqp_url))
    fresh.channel().queue_declare(queue, passive=True)
    fresh.close()
