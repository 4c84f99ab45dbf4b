"""halfmoon/amqp/connection_state.py and channel_state.py: the tables, with no socket."""

from __future__ import annotations

import pytest
from pamqp import commands

from halfmoon.amqp.channel_state import ChannelState, Mode
from halfmoon.amqp.connection_state import ConnectionState, Phase
from halfmoon.amqp.framing import ContentHeader
from halfmoon.amqp.reply_codes import (
    COMMAND_INVALID,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    AmqpChannelError,
    AmqpConnectionError,
)


def opened() -> ConnectionState:
    state = ConnectionState()
    state.header_received(b"AMQP\x00\x00\x09\x01")
    state.method_received(commands.Connection.StartOk(response="\0u\0p"))
    state.method_received(commands.Connection.TuneOk(channel_max=10, frame_max=8192, heartbeat=5))
    state.method_received(commands.Connection.Open())
    return state


def test_start_tune_open_then_channels() -> None:
    state = opened()
    assert state.phase is Phase.OPEN
    assert (state.tuning.channel_max, state.tuning.frame_max, state.tuning.heartbeat) == (
        10,
        8192,
        5,
    )
    state.check_channel(65535)  # any number, as RabbitMQ opens it: channel_max is a count
    state.check_open(9)
    with pytest.raises(AmqpConnectionError) as info:
        state.check_open(10)
    assert info.value.code == NOT_ALLOWED


def test_a_method_out_of_turn_is_command_invalid() -> None:
    state = ConnectionState()
    state.header_received(b"AMQP\x00\x00\x09\x01")
    with pytest.raises(AmqpConnectionError) as info:
        state.method_received(commands.Connection.Open())
    assert info.value.code == COMMAND_INVALID


def test_a_channel_before_open_and_a_tiny_frame_max_are_refused() -> None:
    state = ConnectionState()
    state.header_received(b"AMQP\x00\x00\x09\x01")
    with pytest.raises(AmqpConnectionError):
        state.check_channel(1)
    state.method_received(commands.Connection.StartOk(response="\0u\0p"))
    with pytest.raises(AmqpConnectionError) as info:
        state.method_received(commands.Connection.TuneOk(frame_max=1024))
    assert info.value.code == NOT_ALLOWED


def test_after_our_close_only_close_and_close_ok_count() -> None:
    state = opened()
    state.closing()
    assert state.method_received(commands.Connection.UpdateSecret()) is Phase.CLOSING
    assert state.method_received(commands.Connection.CloseOk()) is Phase.CLOSED


def test_tx_and_confirm_exclude_each_other() -> None:
    channel = ChannelState(1)
    channel.select(Mode.TX)
    channel.select(Mode.TX)
    with pytest.raises(AmqpChannelError) as info:
        channel.select(Mode.CONFIRM)
    assert info.value.code == PRECONDITION_FAILED


def test_content_must_follow_its_publish() -> None:
    channel = ChannelState(1)
    with pytest.raises(AmqpConnectionError) as info:
        channel.body_arrived(b"x")
    assert info.value.code == UNEXPECTED_FRAME
    channel.start_publish(commands.Basic.Publish(exchange="", routing_key="q"))
    with pytest.raises(AmqpConnectionError):
        channel.method_arrived("Queue.Declare")
    header = ContentHeader(60, 3, b"\x00\x00", commands.Basic.Properties())
    assert channel.header_arrived(header) is None
    assert channel.body_arrived(b"ab") is None
    done = channel.body_arrived(b"c")
    assert done is not None and b"".join(done.parts) == b"abc"
    assert not channel.expects_content()
