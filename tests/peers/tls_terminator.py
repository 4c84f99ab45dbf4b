"""A TLS front for RabbitMQ, whose listener on this machine speaks plain AMQP only.

aiormq's TLS tests need an AMQPS port on the reference server too. This
terminator accepts TLS on a free loopback port with a certificate made at
test time and relays the bytes to RabbitMQ's plain port, so RabbitMQ's
protocol behaviour is what the TLS tests see. Client certificates are accepted
and not checked (the suite's ``amqps-client`` case only presents one).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.server.certificates import CertificateAuthority


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.contextmanager
def tls_terminator(directory: Path, upstream: tuple[str, int]) -> Iterator[int]:
    """Serve TLS on a free loopback port (yielded) in front of ``upstream``."""
    directory.mkdir(parents=True, exist_ok=True)
    issued = CertificateAuthority(directory).issue("server")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(issued.cert, issued.key)
    context.verify_mode = ssl.CERT_NONE
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[int] = loop.create_future()
    stopping = asyncio.Event()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def main() -> None:
        server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=context)
        ready.set_result(server.sockets[0].getsockname()[1])
        async with server:
            await stopping.wait()
        # What is still relaying ends with the front: cancel it and wait, so no task
        # outlives the loop.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    port = asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(ready), 10), loop)
    try:
        yield port.result(15)
    finally:
        loop.call_soon_threadsafe(stopping.set)
        thread.join(10)
        loop.close()
