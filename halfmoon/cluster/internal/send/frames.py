"""The framing of the broker's send listener: length-prefixed frames over one TCP connection.

Grammar (every frame is a 4-byte big-endian length, then that many bytes of
:mod:`halfmoon.cluster.internal.wire` encoding)::

    connection := hello hello-answer (request | answer)*
    hello      := {"version": "<WIRE_VERSION>:<fingerprint>", "peer": "<peer name>"[, "epoch": N]}
    hello-answer := {"broker": "<name>", "version": "<token>"} | WireVersionMismatch
    request    := [request_id, timeout_ms, [[OutgoingMessage, ...], ...]]
    answer     := [request_id, [[SendResult, ...] | HalfmoonError, ...] | HalfmoonError]

The requests and answers are exactly those of the gRPC ``SendStream``
(:mod:`halfmoon.cluster.internal.internal_service`); answers may come in any order
(each names its request). ``epoch``, sent to a member of a broker group, is
the group epoch every request of the connection is meant for
(:mod:`halfmoon.cluster.internal.fencing`). A peer writes its hello and its first requests
without waiting for the hello's answer; the broker reads the hello first and,
on a version mismatch, answers the error and closes the connection.

Why not gRPC: measured (``bench/internal_floor.py``), an echo of an 8 KiB
frame costs the server 80–110 µs of CPU per request over a gRPC stream on a
thread-pool server and 13–20 µs over an asyncio stream; the broker's share of
a single-message send is mostly that per-request cost.

A frame longer than :data:`MAX_FRAME_BYTES` is refused (the broker answers
``[None, MalformedRequest]`` and closes: the rest of the connection cannot
be framed any more); so is anything that does not decode.
"""

from __future__ import annotations

import asyncio
import struct

from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.connection import MAX_MESSAGE_BYTES

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES  # what a gRPC message may carry, the same here


class FrameTooLarge(wire.MalformedRequest):
    """A frame longer than :data:`MAX_FRAME_BYTES`."""


def frame(payload: bytes) -> bytes:
    """``payload`` with its length prefix."""
    return HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes:
    """The next frame's payload; IncompleteReadError at the end, FrameTooLarge beyond ``limit``."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > limit:
        raise FrameTooLarge(f"a frame of {size} bytes exceeds the limit of {limit} bytes")
    return await reader.readexactly(size)


def too_large(size: int, limit: int = MAX_FRAME_BYTES) -> FrameTooLarge | None:
    """The error for sending a payload of ``size`` bytes, None when it fits."""
    if size > limit:
        return FrameTooLarge(
            f"a send request of {size} bytes exceeds the internal frame limit of {limit} bytes"
        )
    return None
