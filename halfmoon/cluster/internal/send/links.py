"""The connection a :class:`~halfmoon.cluster.internal.send.stream.StreamSender` carries its
requests on: :class:`TcpLink`, one connection to the broker's send listener
(:mod:`halfmoon.cluster.internal.send.listener`), behind the small :class:`Link` contract
the sender's coalescing, deadlines and failure rules are written (and tested) against.

A link takes request payloads with :meth:`write` (queued until it is
connected), hands each answer payload to ``on_frame``, and when it ends by
itself (the broker closed it, the connection broke or never opened, an
answer did not decode) calls ``on_end(link, error)`` once; ``error`` None
means the broker ended it cleanly. :meth:`cancel` ends it without a call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.send.frames import frame, read_frame
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")


class Link(Protocol):
    def write(self, request: bytes) -> None: ...

    def cancel(self) -> None: ...


OnFrame = Callable[[bytes], None]
OnEnd = Callable[[Link, HalfmoonError | None], None]


class TcpLink:
    """One connection to a broker's send listener at ``host``:``port``: the hello, then requests.

    The hello and the first requests are written together once connected (no round trip
    waits for the hello's answer); a refusal (``WIRE_VERSION_MISMATCH``) ends the link.
    """

    def __init__(
        self,
        host: str,
        port: int,
        hello: dict[str, object],
        on_frame: OnFrame,
        on_end: OnEnd,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self._tls = tls
        self._host = host
        self._port = port
        self._where = f"{host}:{port}"
        self._hello = wire.encode(hello)
        self._on_frame = on_frame
        self._on_end = on_end
        self._pending: list[bytes] = []  # written before the connection is up
        self._writer: asyncio.StreamWriter | None = None
        self._cancelled = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def write(self, request: bytes) -> None:
        if self._writer is None:
            self._pending.append(frame(request))
        elif not self._writer.is_closing():
            self._writer.write(frame(request))

    def cancel(self) -> None:
        self._cancelled = True
        self._task.cancel()
        if self._writer is not None:
            self._writer.close()

    async def _run(self) -> None:
        error: HalfmoonError | None = None
        try:
            error = await self._serve()
        except asyncio.CancelledError:
            return  # cancelled: no report
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if self._writer is None:  # never connected (refused)
                error = wire.BrokerUnavailable(f"the broker at {self._where} is unreachable: {exc}")
            # else the broker closed it: the sender reports its requests' outcome unknown
        except OSError as exc:  # unreachable, or the TLS handshake failed
            error = wire.BrokerUnavailable(f"the broker at {self._where} is unreachable: {exc}")
        except HalfmoonError as exc:  # e.g. a frame too large, an answer that does not decode
            error = exc
        except Exception as exc:  # noqa: BLE001 - an answer that does not decode
            log.exception("event=send_stream_failed broker=%s", self._where)
            error = HalfmoonError(f"the send connection to {self._where} broke: {exc}")
        finally:
            if self._writer is not None:
                self._writer.close()
        if not self._cancelled:
            self._on_end(self, error)

    async def _serve(self) -> HalfmoonError | None:
        tls = self._tls.client_ssl_context()
        if tls is None:
            reader, writer = await asyncio.open_connection(self._host, self._port)
        else:
            context, server_name = tls
            reader, writer = await asyncio.open_connection(
                self._host, self._port, ssl=context, server_hostname=server_name or self._host
            )
        writer.write(frame(self._hello) + b"".join(self._pending))
        self._pending.clear()
        self._writer = writer
        answer = wire.decode(await read_frame(reader))
        if isinstance(answer, HalfmoonError):
            return answer  # refused: another version
        while True:
            self._on_frame(await read_frame(reader))
