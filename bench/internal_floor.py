"""The floor under a proxy → broker send request: an echo over each transport a broker could serve.

    .venv/bin/python -m bench.internal_floor [--seconds 3] [--size 8192] [--concurrency 1]

A server process answers each frame of ``--size`` bytes with the same frame,
over:

- ``grpc stream``: a bidirectional stream on a ``grpc.server`` with a thread
  pool, the options and shape of ``halfmoon broker``'s internal server (the
  ``SendStream`` method without the store);
- ``tcp stream``: an asyncio TCP server reading length-prefixed frames
  (4-byte big-endian length, then the frame), the shape of the broker's
  internal send listener (:mod:`halfmoon.cluster.internal.send.listener`).

The client (this process, one event loop) keeps ``--concurrency`` requests in
flight on one connection, for ``--seconds``. Printed: requests per second and
the server's CPU per request (user + system of the whole server process, from
/proc, over the measured interval): what the broker pays per internal request
before it looks at the payload. The machine is shared: run it more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio

from bench.proxy_bench import cpu_seconds
from bench.server_proc import REPO_ROOT, free_port

READY_LINE = "internal floor ready"
METHOD = "/bench.Floor/Echo"
HEADER = struct.Struct(">I")


def serve_grpc(port: int) -> None:
    executor = ThreadPoolExecutor(8)
    server = grpc.server(
        executor,
        maximum_concurrent_rpcs=256,
        options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ],
    )

    def echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    handler = grpc.stream_stream_rpc_method_handler(echo)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Floor", {"Echo": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(READY_LINE, flush=True)
    stop.wait()
    server.stop(0)


async def _serve_tcp(port: int) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = HEADER.unpack(await reader.readexactly(4))
                frame = await reader.readexactly(size)
                writer.write(HEADER.pack(len(frame)) + frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(READY_LINE, flush=True)
    async with server:
        await stop.wait()


def serve_tcp(port: int) -> None:
    asyncio.run(_serve_tcp(port))


class FloorProcess:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "bench.internal_floor",
            "--serve",
            kind,
            "--port",
            str(self.port),
        ]
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if READY_LINE not in line:
            self.stop()
            raise RuntimeError(f"the {kind} floor server did not start: {line!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def _drive(
    exchange: object, frame: bytes, seconds: float, concurrency: int, pid: int
) -> tuple[int, float]:
    """Requests answered and the server's CPU seconds over ``seconds`` (after a warm-up)."""
    assert callable(exchange)
    count = 0
    measuring = False

    async def one_flow(stop_at: float) -> None:
        nonlocal count
        while time.monotonic() < stop_at:
            await exchange(frame)
            if measuring:
                count += 1

    warm = time.monotonic() + 0.5
    await asyncio.gather(*(one_flow(warm) for _ in range(concurrency)))
    measuring = True
    cpu0 = cpu_seconds(pid)
    await asyncio.gather(*(one_flow(time.monotonic() + seconds) for _ in range(concurrency)))
    return count, cpu_seconds(pid) - cpu0


async def run_grpc(
    frame: bytes, seconds: float, concurrency: int, pid: int, port: int
) -> tuple[int, float]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_stream(METHOD)()
    waiting: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()
    write_lock = asyncio.Lock()

    async def reader() -> None:
        while True:
            raw = await call.read()
            if raw is grpc.aio.EOF:
                return
            (await waiting.get()).set_result(raw)

    task = asyncio.create_task(reader())

    async def exchange(data: bytes) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        async with write_lock:
            waiting.put_nowait(future)
            await call.write(data)
        return await future

    try:
        return await _drive(exchange, frame, seconds, concurrency, pid)
    finally:
        task.cancel()
        call.cancel()
        await channel.close()


async def run_tcp(
    frame: bytes, seconds: float, concurrency: int, pid: int, port: int
) -> tuple[int, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    waiting: asyncio.Queue[asyncio.Future[bytes]] = asyncio.Queue()

    async def read_answers() -> None:
        while True:
            (size,) = HEADER.unpack(await reader.readexactly(4))
            (await waiting.get()).set_result(await reader.readexactly(size))

    task = asyncio.create_task(read_answers())

    async def exchange(data: bytes) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        waiting.put_nowait(future)
        writer.write(HEADER.pack(len(data)) + data)
        return await future

    try:
        return await _drive(exchange, frame, seconds, concurrency, pid)
    finally:
        task.cancel()
        writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.internal_floor", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", choices=["grpc", "tcp"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve == "grpc":
        serve_grpc(args.port)
        return 0
    if args.serve == "tcp":
        serve_tcp(args.port)
        return 0
    frame = bytes(range(256)) * (args.size // 256) + b"x" * (args.size % 256)
    print(f"echo of {args.size} B, {args.concurrency} in flight, {args.seconds} s per row")
    print(f"{'transport':<12} {'round':>5} {'req/s':>9} {'server µs/req':>14}")
    for round_ in range(1, args.rounds + 1):
        for kind, run in (("grpc stream", run_grpc), ("tcp stream", run_tcp)):
            server = FloorProcess("grpc" if kind.startswith("grpc") else "tcp")
            try:
                count, cpu = asyncio.run(
                    run(frame, args.seconds, args.concurrency, server.proc.pid, server.port)
                )
            finally:
                server.stop()
            per = cpu / count * 1e6 if count else float("nan")
            print(f"{kind:<12} {round_:>5} {count / args.seconds:>9.0f} {per:>14.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
