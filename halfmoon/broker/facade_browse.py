"""The broker facade's browsing role: reading stored messages, for operators, with no
consumer state changed (see :mod:`halfmoon.broker.facade`)."""

from __future__ import annotations

from typing import Any, Protocol

from halfmoon.broker.browse import ScanResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView


class Browsing(Protocol):
    """Reading stored messages without consuming them."""

    # -- reading stored messages (operators; no consumer state changes) -----------------------

    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        """Messages with this id in ``topic`` (or in every listed topic: dead-letter copies keep
        the id); MessageNotFound when there is none, TopicNotFound for an unknown topic."""
        ...

    def message_trace(self, message_id: str) -> list[dict[str, Any]]:
        """What the broker recorded about the message with this id, oldest first
        (halfmoon/broker/trace.py): deliveries, acks, retries, dead-lettering of every stored
        copy, and a transactional message's history. Each event is a map with ``time_ms``,
        ``event`` and its fields; [] when nothing was recorded."""
        ...

    def messages_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int
    ) -> list[MessageView]:
        """Up to ``limit`` messages of ``topic`` with ``key``, stored within [begin_ms, end_ms]."""
        ...

    def message_at(self, topic: str, queue_id: int, offset: int) -> MessageView:
        """The message at ``offset`` of a queue; MessageNotFound when there is none."""
        ...

    def scan(
        self,
        topic: str,
        queue_id: int | None,
        offset: int | None,
        begin_ms: int,
        end_ms: int,
        limit: int,
        filter: FilterSpec,
        with_messages: bool = True,
    ) -> ScanResult:
        """Read a range of one queue (or every readable queue) without any group.

        From ``offset`` (one queue only), else the first message stored at or
        after ``begin_ms``, else the queue's start; stops at ``end_ms``, after
        ``limit`` messages (when ``with_messages``) or after examining
        ``browse.MAX_SCAN_ENTRIES`` entries. ``next_offsets`` and ``complete``
        say where to continue.
        """
        ...
