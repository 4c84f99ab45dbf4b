"""halfmoon/amqp/framing.py: frames cut from a stream, bad frames refused, server frames
encoded as pamqp decodes them."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame

from halfmoon.amqp import framing
from halfmoon.amqp.reply_codes import FRAME_ERROR, SYNTAX_ERROR, AmqpConnectionError


def raw(kind: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + end


def test_frames_split_anywhere_come_out_whole() -> None:
    stream = raw(1, 1, b"abc") + raw(3, 2, b"x" * 100) + raw(8, 0, b"")
    for cut in range(len(stream)):
        reader = framing.FrameReader(4096)
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [(f.kind, f.channel, f.payload) for f in got] == [
            (1, 1, b"abc"),
            (3, 2, b"x" * 100),
            (8, 0, b""),
        ]


def test_a_wrong_frame_end_octet_is_a_frame_error() -> None:
    with pytest.raises(AmqpConnectionError) as info:
        framing.FrameReader(4096).feed(raw(1, 1, b"abc", end=b"\x00"))
    assert info.value.code == FRAME_ERROR and "0xce" in info.value.text


def test_a_frame_larger_than_frame_max_is_refused_before_it_is_buffered() -> None:
    head = struct.pack(">BHI", 3, 1, 10_000)  # only the header arrived
    with pytest.raises(AmqpConnectionError) as info:
        framing.FrameReader(4096).feed(head)
    assert info.value.code == FRAME_ERROR and "frame_max" in info.value.text


def test_an_unknown_frame_type_is_a_frame_error() -> None:
    with pytest.raises(AmqpConnectionError) as info:
        framing.FrameReader(4096).feed(raw(7, 0, b""))
    assert info.value.code == FRAME_ERROR


def test_an_unknown_method_or_a_truncated_one_is_a_syntax_error() -> None:
    with pytest.raises(AmqpConnectionError) as info:
        framing.decode_method(struct.pack(">I", 0x00FF00FF))
    assert info.value.code == SYNTAX_ERROR
    with pytest.raises(AmqpConnectionError) as info:
        framing.decode_method(struct.pack(">I", commands.Queue.Declare.index) + b"\x00")
    assert info.value.code == SYNTAX_ERROR


def test_server_methods_encode_names_pamqp_would_refuse() -> None:
    name = "odd name/with:chars é"  # RabbitMQ accepts any UTF-8 name up to 255 bytes
    data = framing.encode_method(
        framing.method(commands.Queue.DeclareOk, queue=name, message_count=3, consumer_count=1),
        5,
    )
    _, channel, decoded = pamqp_frame.unmarshal(data)
    assert channel == 5 and isinstance(decoded, commands.Queue.DeclareOk)
    assert (decoded.queue, decoded.message_count, decoded.consumer_count) == (name, 3, 1)


def test_hand_encoded_deliver_and_confirm_match_pamqp() -> None:
    data = framing.encode_deliver(3, "ctag", 42, True, "ex", "rk")
    _, channel, decoded = pamqp_frame.unmarshal(data)
    assert channel == 3 and isinstance(decoded, commands.Basic.Deliver)
    assert (decoded.consumer_tag, decoded.delivery_tag, decoded.redelivered) == ("ctag", 42, True)
    assert (decoded.exchange, decoded.routing_key) == ("ex", "rk")
    _, _, ack = pamqp_frame.unmarshal(framing.encode_confirm(1, 7, multiple=True))
    assert isinstance(ack, commands.Basic.Ack) and ack.delivery_tag == 7 and ack.multiple
    _, _, nack = pamqp_frame.unmarshal(framing.encode_confirm(1, 8, multiple=False, ack=False))
    assert isinstance(nack, commands.Basic.Nack) and nack.delivery_tag == 8


def test_content_round_trips_its_property_bytes_and_splits_the_body() -> None:
    props = commands.Basic.Properties(headers={"a": 1}, content_type="text/plain")
    raw_props = framing.encode_properties(props)
    body = b"z" * 10_000
    data = framing.encode_content(1, raw_props, body, 4096)
    frames = framing.FrameReader(4096).feed(data)
    assert [f.kind for f in frames] == [2, 3, 3, 3]
    header = framing.decode_content_header(frames[0].payload)
    assert header.body_size == len(body) and header.raw_properties == raw_props
    assert header.properties.headers == {"a": 1}
    assert b"".join(f.payload for f in frames[1:]) == body
