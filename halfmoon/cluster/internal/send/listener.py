"""The broker's send listener: proxies' send requests over plain TCP streams, on one event loop.

The same requests as the gRPC ``SendStream`` (framing and handshake in
:mod:`halfmoon.cluster.internal.send.frames`), served by an asyncio loop in a thread
of its own: a request is read, decoded and stored on the loop, and answered
once durable (at once under ``async`` flush; under ``sync``, when the flush
thread completes its fsync), with no thread hand-off on the way. Measured,
that is what makes it cheaper than the stream: the gRPC server's per-request
machinery (its poller thread, the thread pool, the GIL passing between them)
was most of the broker's CPU per proxied send.

The rules of the gRPC port hold here too:

- mutual TLS with the ``[internal]`` certificates when configured (the
  context is reloaded with the gRPC port's on SIGHUP); a peer without a
  certificate the internal CA signed never gets past the handshake;
- the version token is checked once, in the hello; a mismatch is answered
  with ``WIRE_VERSION_MISMATCH`` and the connection closed;
- on a member of a broker group, the epoch the hello names (the group epoch
  the proxy routes for) is checked at every request, as on the stream
  (:mod:`halfmoon.cluster.internal.fencing`): a refused request stores nothing;
- each request waits for its durability within its own ``timeout_ms``
  (``BROKER_DEADLINE_EXCEEDED`` beyond it), as on the stream;
- in-flight work is bounded: at most :data:`MAX_IN_FLIGHT_PER_CONNECTION`
  requests of a connection wait for durability at a time (its next frames
  are not read meanwhile), and at most :data:`MAX_CONNECTIONS` connections
  are served (the next ones are closed at once);
- a frame too large, a hello or request that does not decode, or a
  handshake that fails closes that connection (after an error answer where
  one can still be framed); no input takes the listener or the broker down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import ssl
import threading
from typing import Any

from halfmoon.cluster.internal import fencing, wire
from halfmoon.cluster.internal.internal_service import InternalService
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.send.frames import frame, read_frame
from halfmoon.cluster.internal.send.requests import stream_request
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")

MAX_IN_FLIGHT_PER_CONNECTION = 64
MAX_CONNECTIONS = 256  # as the gRPC port's maximum_concurrent_rpcs
HELLO_TIMEOUT_S = 10.0  # a connection that says nothing this long after connecting is closed
WRITE_BUFFER_HIGH = 1 << 20  # answers buffered beyond this wait for the peer to read


class SendListener:
    """Serves ``service``'s sends on ``host``:``port`` (0: any free port) until :meth:`close`."""

    def __init__(
        self, service: InternalService, host: str, port: int = 0, *, tls: InternalTls = PLAINTEXT
    ) -> None:
        self._service = service
        self._host = host
        self._requested_port = port
        self._ssl: ssl.SSLContext | None = tls.server_ssl_context()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="halfmoon-send-listener", daemon=True
        )
        self.port = 0

    def start(self) -> int:
        """Listen and serve; the bound port (OSError when it cannot listen)."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        try:
            self.port = future.result(timeout=30)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        return self.port

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(
            self._accepted,
            self._host,
            self._requested_port,
            ssl=self._ssl,
            ssl_handshake_timeout=HELLO_TIMEOUT_S if self._ssl else None,
            reuse_address=True,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every connection (requests in flight get no answer: their
        peers report the outcome unknown, as for a broker that stops), stop the loop."""
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            future.result(timeout=timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=2)

    # -- one connection ----------------------------------------------------------------------

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS:
            log.warning("event=send_listener_full connections=%d", len(self._connections))
            writer.close()
            return
        self._connections.add(task)
        try:
            await _Connection(self._service, reader, writer).serve()
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - one connection's failure, never the listener's
            log.exception("event=send_connection_failed")
        finally:
            self._connections.discard(task)
            writer.close()


class _Connection:
    def __init__(
        self, service: InternalService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._service = service
        self._reader = reader
        self._writer = writer
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT_PER_CONNECTION)
        self._waiting: set[asyncio.Task[None]] = set()
        self._peer: str | None = None
        self._epoch: int | None = None  # the group epoch the peer's requests are meant for

    async def serve(self) -> None:
        try:
            if not await self._hello():
                return
            while True:
                await self._slots.acquire()  # bounded: the next frame waits for a free slot
                raw = await read_frame(self._reader)
                self._request(raw)
                if self._writer.transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
                    await self._writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the peer went away
        except HalfmoonError as error:  # a frame too large or one that does not decode
            log.warning("event=send_connection_refused peer=%s error=%s", self._peer, error)
            self._writer.write(frame(wire.encode([None, error])))
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await self._writer.drain()
        finally:
            for task in self._waiting:
                task.cancel()

    async def _hello(self) -> bool:
        try:
            hello = wire.decode(await asyncio.wait_for(read_frame(self._reader), HELLO_TIMEOUT_S))
        except (TimeoutError, asyncio.IncompleteReadError):
            return False
        sent = hello.get("version") if isinstance(hello, dict) else None
        refusal: HalfmoonError | None = self._service.version_refusal(sent)
        if refusal is None and not isinstance(hello, dict):
            refusal = wire.MalformedRequest("the hello is {version, peer[, epoch]}")
        if refusal is None:
            try:
                self._epoch = fencing.parse_epoch(hello.get("epoch"))
            except HalfmoonError as error:
                refusal = error
        if refusal is not None:
            self._writer.write(frame(wire.encode(refusal)))
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await self._writer.drain()
            return False
        assert isinstance(hello, dict)
        peer = hello.get("peer")
        self._peer = peer if isinstance(peer, str) else None
        self._writer.write(frame(wire.encode(self._service.hello_answer())))
        return True

    def _request(self, raw: bytes) -> None:
        """Store one request now (on the loop) and answer it once durable."""
        request_id, timeout_ms, batches = stream_request(wire.decode(raw))
        answers, durable = self._service.store_batches(batches, self._epoch)
        pending = [f for f in durable if not f.done()]
        if not pending:
            self._answer(request_id, batches, answers, durable)
            return
        task = asyncio.get_running_loop().create_task(
            self._answer_when_durable(request_id, timeout_ms, batches, answers, durable)
        )
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _answer_when_durable(
        self,
        request_id: int,
        timeout_ms: int,
        batches: list[Any],
        answers: list[object],
        durable: list[concurrent.futures.Future[None]],
    ) -> None:
        waited = [asyncio.wrap_future(f) for f in durable]
        _, late = await asyncio.wait(waited, timeout=timeout_ms / 1000)
        if late:
            for future in late:
                future.cancel()
            error = wire.BrokerDeadlineExceeded(
                "written, but not yet durable when the call's deadline passed"
            )
            self._slots.release()
            self._write(request_id, [a if isinstance(a, HalfmoonError) else error for a in answers])
            return
        self._answer(request_id, batches, answers, durable)

    def _answer(
        self,
        request_id: int,
        batches: list[Any],
        answers: list[object],
        durable: list[concurrent.futures.Future[None]],
    ) -> None:
        self._slots.release()
        for future in durable:
            error = future.exception()
            if error is not None:
                failed = (
                    error
                    if isinstance(error, HalfmoonError)
                    else HalfmoonError(f"the store could not make the write durable: {error}")
                )
                answers = [a if isinstance(a, HalfmoonError) else failed for a in answers]
                self._write(request_id, answers)
                return
        self._service.remember_half_senders(batches, answers, self._peer)
        self._write(request_id, answers)

    def _write(self, request_id: int, answers: list[object]) -> None:
        if not self._writer.is_closing():
            self._writer.write(frame(wire.encode([request_id, answers])))
