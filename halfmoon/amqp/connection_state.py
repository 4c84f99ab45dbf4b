"""A connection's life as a table, with no I/O: header → start → tune → open → closing.

The server speaks first once the protocol header arrived (Connection.Start);
then each phase accepts exactly the methods in :data:`TRANSITIONS` on
channel 0, and channel frames only once the connection is open. Anything
else is the peer's error: ``COMMAND_INVALID`` (503) for a method out of
turn, ``CHANNEL_ERROR`` (504) for a channel frame before Open. ``channel_max``
bounds how many channels are open at once (``NOT_ALLOWED``, 530, for one more),
not their numbers: as RabbitMQ does, any number from 1 to 65535 may be opened.
After a Connection.Close (either side) only Close / Close-Ok matter and
everything else is dropped, as the spec says.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pamqp import base, commands

from halfmoon.amqp.framing import MIN_FRAME_MAX
from halfmoon.amqp.reply_codes import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    NOT_ALLOWED,
    SYNTAX_ERROR,
    AmqpConnectionError,
)

# What the server proposes in Tune; the client may lower each (0 = no limit for the two
# maxima; heartbeat 0 = none).
CHANNEL_MAX = 2047
FRAME_MAX = 131_072
HEARTBEAT = 60


class Phase(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_SECURE_OK = "await-secure-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSING = "closing"  # we sent Connection.Close: wait for Close-Ok
    CLOSED = "closed"


TRANSITIONS: dict[tuple[Phase, type[base.Frame]], Phase] = {
    (Phase.AWAIT_START_OK, commands.Connection.StartOk): Phase.AWAIT_TUNE_OK,
    (Phase.AWAIT_TUNE_OK, commands.Connection.TuneOk): Phase.AWAIT_OPEN,
    (Phase.AWAIT_OPEN, commands.Connection.Open): Phase.OPEN,
    (Phase.OPEN, commands.Connection.Close): Phase.CLOSED,
    (Phase.OPEN, commands.Connection.UpdateSecret): Phase.OPEN,
    (Phase.OPEN, commands.Connection.Blocked): Phase.OPEN,
    (Phase.OPEN, commands.Connection.Unblocked): Phase.OPEN,
    (Phase.CLOSING, commands.Connection.Close): Phase.CLOSED,
    (Phase.CLOSING, commands.Connection.CloseOk): Phase.CLOSED,
}


@dataclass
class Tuning:
    channel_max: int = CHANNEL_MAX
    frame_max: int = FRAME_MAX
    heartbeat: int = HEARTBEAT


class ConnectionState:
    def __init__(self) -> None:
        self.phase = Phase.AWAIT_HEADER
        self.tuning = Tuning()

    def header_received(self, header: bytes) -> None:
        if header != b"AMQP\x00\x00\x09\x01":
            raise AmqpConnectionError(
                SYNTAX_ERROR, "not AMQP 0-9-1: send the protocol header AMQP 0 0 9 1"
            )
        self.phase = Phase.AWAIT_START_OK

    def method_received(self, method: base.Frame) -> Phase:
        """Move on ``method`` (channel 0); the new phase. Raises on a method out of turn."""
        if self.phase is Phase.CLOSED:
            return self.phase
        nxt = TRANSITIONS.get((self.phase, type(method)))
        if nxt is None:
            if self.phase is Phase.CLOSING:
                return self.phase  # dropped: only Close / Close-Ok count now
            raise AmqpConnectionError(
                COMMAND_INVALID,
                f"{method.name} is not expected on channel 0 in phase {self.phase.value}",
                method.index >> 16,
                method.index & 0xFFFF,
            )
        if isinstance(method, commands.Connection.TuneOk):
            self._tune(method)
        self.phase = nxt
        return nxt

    def _tune(self, ok: commands.Connection.TuneOk) -> None:
        if ok.frame_max and ok.frame_max < MIN_FRAME_MAX:
            raise AmqpConnectionError(
                NOT_ALLOWED, f"frame_max {ok.frame_max} is below the minimum {MIN_FRAME_MAX}"
            )
        if ok.frame_max > FRAME_MAX or ok.channel_max > CHANNEL_MAX:
            raise AmqpConnectionError(
                NOT_ALLOWED,
                f"tune-ok asks for more than offered (frame_max {FRAME_MAX}, channel_max "
                f"{CHANNEL_MAX})",
            )
        self.tuning = Tuning(
            channel_max=ok.channel_max or CHANNEL_MAX,
            frame_max=ok.frame_max or FRAME_MAX,
            heartbeat=ok.heartbeat,
        )

    def check_channel(self, channel: int) -> None:
        """A frame on ``channel`` (not 0) is allowed now."""
        if self.phase is not Phase.OPEN:
            if self.phase in (Phase.CLOSING, Phase.CLOSED):
                return
            raise AmqpConnectionError(
                CHANNEL_ERROR, f"channel {channel} used before the connection is open"
            )

    def check_open(self, open_channels: int) -> None:
        """One more channel may open beside ``open_channels`` (RabbitMQ's count, and text)."""
        if open_channels >= self.tuning.channel_max:
            raise AmqpConnectionError(
                NOT_ALLOWED,
                f"number of channels opened ({open_channels}) has reached the negotiated "
                f"channel_max ({self.tuning.channel_max})",
                20,
                10,
            )

    def closing(self) -> None:
        """We sent Connection.Close."""
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.CLOSING

    @property
    def accepting(self) -> bool:
        """Channel frames are processed (not closing or closed)."""
        return self.phase is Phase.OPEN
