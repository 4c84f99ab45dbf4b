"""A channel's state as a table, with no I/O: open / closing, normal / confirm / tx, content.

- Phase: ``OPEN`` until either side sends Channel.Close; after the server's
  Close the channel is ``CLOSING`` and drops every frame but Close / Close-Ok.
- Mode: ``normal``, then ``confirm`` (Confirm.Select) or ``tx`` (Tx.Select),
  never both: the other one is 406 PRECONDITION_FAILED, as the spec says.
- Content: a Basic.Publish must be followed by its content header and then
  body frames up to the header's size; any other frame in between is 505
  UNEXPECTED_FRAME, a connection error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pamqp import commands

from halfmoon.amqp.framing import ContentHeader
from halfmoon.amqp.reply_codes import (
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    AmqpChannelError,
    AmqpConnectionError,
)

MAX_BODY = 128 * 1024 * 1024  # RabbitMQ's default max_message_size


class Phase(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"


class Mode(enum.Enum):
    NORMAL = "normal"
    CONFIRM = "confirm"
    TX = "tx"


@dataclass
class Content:
    """A publish being assembled from its method, header and body frames."""

    publish: commands.Basic.Publish
    header: ContentHeader | None = None
    parts: list[bytes] = field(default_factory=list)
    received: int = 0

    @property
    def complete(self) -> bool:
        return self.header is not None and self.received >= self.header.body_size


class ChannelState:
    def __init__(self, number: int) -> None:
        self.number = number
        self.phase = Phase.OPEN
        self.mode = Mode.NORMAL
        self.content: Content | None = None

    def select(self, mode: Mode) -> None:
        if self.mode is mode or self.mode is Mode.NORMAL:
            self.mode = mode
            return
        raise AmqpChannelError(
            PRECONDITION_FAILED,
            f"cannot switch from {self.mode.value} to {mode.value} mode: a channel is in "
            "transactional or in confirm mode, not both",
            90 if mode is Mode.TX else 85,
            10,
        )

    # -- content assembly ---------------------------------------------------------

    def expects_content(self) -> bool:
        return self.content is not None

    def start_publish(self, publish: commands.Basic.Publish) -> None:
        self._no_content_pending("method Basic.Publish")
        self.content = Content(publish)

    def method_arrived(self, name: str) -> None:
        """Any other method: must not interrupt a publish's content."""
        self._no_content_pending(f"method {name}")

    def _no_content_pending(self, what: str) -> None:
        if self.content is not None:
            raise AmqpConnectionError(
                UNEXPECTED_FRAME,
                f"expected content header/body for Basic.Publish on channel {self.number}, "
                f"got {what}",
            )

    def header_arrived(self, header: ContentHeader) -> Content | None:
        """The finished content when the body is empty, else None."""
        content = self.content
        if content is None or content.header is not None:
            raise AmqpConnectionError(
                UNEXPECTED_FRAME,
                f"content header on channel {self.number} without a Basic.Publish before it",
            )
        if header.class_id != 60:
            raise AmqpConnectionError(
                UNEXPECTED_FRAME, f"content header of class {header.class_id}, expected 60"
            )
        if header.body_size > MAX_BODY:
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"message size {header.body_size} is larger than the maximum {MAX_BODY}",
                60,
                40,
            )
        content.header = header
        return self._finish() if content.complete else None

    def body_arrived(self, piece: bytes) -> Content | None:
        content = self.content
        if content is None or content.header is None:
            raise AmqpConnectionError(
                UNEXPECTED_FRAME, f"content body on channel {self.number} without a header"
            )
        content.parts.append(piece)
        content.received += len(piece)
        if content.received > content.header.body_size:
            raise AmqpConnectionError(
                UNEXPECTED_FRAME,
                f"content body longer than the header's {content.header.body_size} bytes",
            )
        return self._finish() if content.complete else None

    def _finish(self) -> Content:
        content = self.content
        assert content is not None
        self.content = None
        return content
