"""Python's gRPC server stacks, each answering with a constant: the floor under any Python server.

    python -m bench.grpc_stacks                      # 2 rounds, ~2 minutes
    python -m bench.grpc_stacks --rounds 4 --json out.json

halfmoon serves the RocketMQ protocol through ``grpc.aio``, and the endpoint
benchmark (``bench/grpc_bench.py``) measures the bare ``grpc.aio`` server
answering SendMessage with a constant as the library's per-call floor. This
benchmark asks whether another Python gRPC server would lower that floor.
It serves the same two methods with a constant answer from each stack:

* ``grpc.aio``: the asyncio server halfmoon uses (generic handlers, raw bytes);
* ``grpc`` (sync): the same C core with its thread-pool server;
* ``grpclib``: a pure-Python HTTP/2 server (the ``h2`` library) on ``uvloop``,
  no C core and no poller thread between the socket and the handler;

and, in the same rounds, ``halfmoon serve`` doing the real work (async flush;
a send stored and answered, a ReceiveMessage long poll woken by the append):
what halfmoon adds to the floor.

RabbitMQ runs in the same rounds as the reference the endpoint benchmark's
latency targets are set against (``bench/amqp_peer.py``: aio-pika, a
persistent publish awaited until confirmed; and end to end, publish →
``basic_consume``, paced like the others). A bare round trip of a stack above RabbitMQ's send, or
above 1.5× its end-to-end time, means no server on that stack can meet those
targets here, whatever it does in its handlers.

Each server decodes ``SendMessageRequest`` and answers one OK entry per
message (what ``bench/grpc_floor.py`` does), and answers ``ReceiveMessage``
with the stream a delivered message makes (status, one 1 KiB message, the
delivery timestamp, then the trailer). The client is one ``grpc.aio``
channel in this process, the same for every stack, and measures, one call at
a time, the p50 and p99 of:

* a single send;
* a whole receive stream, answered at once;
* **end to end**: a receive parked first (its headers sent, nothing else)
  and woken by the next send, from the send's start to the end of the
  poll's stream: the shortest path a message can take through the stack,
  with no store, no queue and no lookup on it. Every system's consumer
  waits idle for 2 ms before each send (``SETTLE_S``), RabbitMQ's too (an
  idle broker wakes slower than a busy one); RabbitMQ is also measured
  back to back, the next send at once, as the endpoint benchmark does;

then 16 concurrent senders for a fixed time: calls per second and the
server's CPU per call (user + system from ``/proc/<pid>/stat``). Every call
carries the four headers a RocketMQ client sends (client id, language,
protocol, version), as halfmoon's calls do. Stacks alternate,
round after round, so a burst of load on the shared machine hits them alike.
Results and what they mean: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from bench.amqp_peer import AmqpPeer
from bench.grpc_floor import READY_LINE, FloorServer, answer_send
from bench.halfmoon_peer import GrpcPeer
from bench.load import machine_info, percentile, process_cpu_seconds
from bench.server_proc import HalfmoonServer

SERVICE = "apache.rocketmq.v2.MessagingService"
SEND = f"/{SERVICE}/SendMessage"
RECEIVE = f"/{SERVICE}/ReceiveMessage"
STACKS = ("grpc.aio", "grpc sync", "grpclib+uvloop")
HALFMOON = "halfmoon (grpc.aio)"
BODY = b"x" * 1024
# Every end-to-end sample starts after the producer was idle this long with the consumer
# waiting (a parked poll, a RabbitMQ consumer): all systems wake from the same idle state.
SETTLE_S = 0.002


def _send_answer(raw: bytes) -> bytes:
    return bytes(answer_send(raw).SerializeToString())


# What a long poll answers when a message arrives: status, the message, the delivery time.
RECEIVE_STREAM = (
    svc.ReceiveMessageResponse(status=pb.Status(code=pb.Code.OK, message="OK")).SerializeToString(),
    svc.ReceiveMessageResponse(message=pb.Message(body=BODY)).SerializeToString(),
    svc.ReceiveMessageResponse(delivery_timestamp={"seconds": 1}).SerializeToString(),
)


# -- the servers, one per stack, each run as `python -m bench.grpc_stacks --serve STACK` --

# A ReceiveMessage request of these bytes parks (headers sent, nothing else) until the next
# SendMessage: a long poll woken by a send, the shortest path a message can take.
PARK = b"park"


def _wake(parked: list[asyncio.Future[None]]) -> None:
    for woken in parked:
        if not woken.done():
            woken.set_result(None)
    parked.clear()


def _serve_messaging(server: Any, port: int, send: Any, receive: Any) -> None:
    """Register SendMessage and ReceiveMessage (raw bytes) on a C-core server, sync or aio."""
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "SendMessage": grpc.unary_unary_rpc_method_handler(send),
                    "ReceiveMessage": grpc.unary_stream_rpc_method_handler(receive),
                },
            ),
        )
    )
    server.add_insecure_port(f"127.0.0.1:{port}")


async def _serve_aio(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
    parked: list[asyncio.Future[None]] = []

    async def send(raw: bytes, context: object) -> bytes:
        _wake(parked)
        return _send_answer(raw)

    async def receive(raw: bytes, context: Any) -> Any:
        if raw == PARK:
            woken = asyncio.get_running_loop().create_future()
            parked.append(woken)
            await context.send_initial_metadata(())
            await woken
        for response in RECEIVE_STREAM:
            yield response

    _serve_messaging(server, port, send, receive)
    await server.start()
    print(READY_LINE, flush=True)
    await _until_sigterm()
    await server.stop(1)


def _serve_sync(port: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(
        ThreadPoolExecutor(max_workers=32), options=[("grpc.max_send_message_length", -1)]
    )

    parked: list[threading.Event] = []
    lock = threading.Lock()

    def send(raw: bytes, context: object) -> bytes:
        with lock:
            woken, parked[:] = list(parked), []
        for event in woken:
            event.set()
        return _send_answer(raw)

    def receive(raw: bytes, context: Any) -> Any:
        if raw == PARK:
            woken = threading.Event()
            with lock:
                parked.append(woken)
            context.send_initial_metadata(())
            woken.wait()
        yield from RECEIVE_STREAM

    _serve_messaging(server, port, send, receive)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(READY_LINE, flush=True)
    stop.wait()
    server.stop(1)


class _RawCodec:
    """grpclib's codec for bytes in, bytes out (the handlers do their own protobuf)."""

    __content_subtype__ = "proto"

    def encode(self, message: bytes, message_type: object) -> bytes:
        return message

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


async def _serve_grpclib(port: int) -> None:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    parked: list[asyncio.Future[None]] = []

    class Messaging:
        async def send(self, stream: Any) -> None:
            raw = await stream.recv_message()
            _wake(parked)
            await stream.send_message(_send_answer(raw))

        async def receive(self, stream: Any) -> None:
            if await stream.recv_message() == PARK:
                woken = asyncio.get_running_loop().create_future()
                parked.append(woken)
                await stream.send_initial_metadata()
                await woken
            for response in RECEIVE_STREAM:
                await stream.send_message(response)

        def __mapping__(self) -> dict[str, Handler]:
            return {
                SEND: Handler(self.send, Cardinality.UNARY_UNARY, None, None),
                RECEIVE: Handler(self.receive, Cardinality.UNARY_STREAM, None, None),
            }

    server = Server([Messaging()], codec=_RawCodec())  # type: ignore[arg-type]
    await server.start("127.0.0.1", port)
    print(READY_LINE, flush=True)
    await _until_sigterm()
    server.close()
    await server.wait_closed()


async def _until_sigterm() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def serve(stack: str, port: int) -> None:
    if stack == "grpc sync":
        _serve_sync(port)
    elif stack == "grpclib+uvloop":
        import uvloop

        uvloop.run(_serve_grpclib(port))
    else:
        asyncio.run(_serve_aio(port))


class StackServer(FloorServer):
    """One stack's server as a subprocess, started and stopped around a round."""

    def __init__(self, stack: str) -> None:
        super().__init__()
        self.stack = stack

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "bench.grpc_stacks", "--serve", self.stack]
        return [*cmd, "--port", str(self.grpc_port)]


# -- the client --------------------------------------------------------------------------


@dataclass
class Round:
    stack: str
    send_p50_ms: float
    send_p99_ms: float
    receive_p50_ms: float
    receive_p99_ms: float
    end_to_end_p50_ms: float
    end_to_end_p99_ms: float
    calls_per_second: float
    server_cpu_us_per_call: float


def send_request() -> bytes:
    message = pb.Message(topic=pb.Resource(name="bench"), body=BODY)
    message.system_properties.message_id = "01BENCH0000000000000000000"
    return bytes(svc.SendMessageRequest(messages=[message]).SerializeToString())


async def _timed(call: Callable[[], Awaitable[None]], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


# The headers a RocketMQ client sends with every call (halfmoon's benchmark peer sends them too).
METADATA = (
    ("x-mq-client-id", "bench@stacks"),
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "v2"),
    ("x-mq-client-version", "5.1.2"),
)


async def measure(server: StackServer, calls: int, seconds: float, senders: int) -> Round:
    request = send_request()
    async with grpc.aio.insecure_channel(server.grpc) as channel:
        bare_send = channel.unary_unary(SEND)
        bare_receive = channel.unary_stream(RECEIVE)

        def send(raw: bytes) -> Any:
            return bare_send(raw, metadata=METADATA)

        def receive(raw: bytes) -> Any:
            return bare_receive(raw, metadata=METADATA)

        async def one_send() -> None:
            await send(request)

        async def one_receive() -> None:
            async for _ in receive(b""):
                pass

        async def one_delivery() -> float:
            """A send into a parked long poll: send start → the poll's stream ended, which is
            when a RocketMQ client (and halfmoon's benchmark consumer) hands the message on."""
            call = receive(PARK)
            await call.initial_metadata()  # the poll is parked
            await asyncio.sleep(SETTLE_S)
            began = time.perf_counter()
            sent = asyncio.ensure_future(send(request))
            async for _ in call:
                pass
            arrived = time.perf_counter()
            await sent
            return (arrived - began) * 1000

        await _timed(one_send, 200)  # connection, warm-up
        sends = await _timed(one_send, calls)
        receives = await _timed(one_receive, calls)
        deliveries = [await one_delivery() for _ in range(calls)]
        done = 0
        stop_at = time.monotonic() + seconds

        async def sender() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                await send(request)
                done += 1

        cpu_before = process_cpu_seconds(server.pid)
        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        elapsed = time.perf_counter() - began
        cpu_after = process_cpu_seconds(server.pid)
    assert cpu_before is not None and cpu_after is not None
    return Round(
        stack=server.stack,
        send_p50_ms=percentile(sends, 0.5),
        send_p99_ms=percentile(sends, 0.99),
        receive_p50_ms=percentile(receives, 0.5),
        receive_p99_ms=percentile(receives, 0.99),
        end_to_end_p50_ms=percentile(deliveries, 0.5),
        end_to_end_p99_ms=percentile(deliveries, 0.99),
        calls_per_second=done / elapsed,
        server_cpu_us_per_call=(cpu_after - cpu_before) / done * 1e6,
    )


@dataclass
class RabbitRound:
    send_p50_ms: float
    send_p99_ms: float
    end_to_end_p50_ms: float  # paced like the other rows (SETTLE_S idle before each send)
    end_to_end_p99_ms: float
    back_to_back_p50_ms: float  # the endpoint benchmark's loop: the next send at once
    back_to_back_p99_ms: float


async def measure_halfmoon(calls: int, seconds: float, senders: int) -> Round:
    """The same rows from ``halfmoon serve`` (async flush) doing the real work: a send stored
    and answered; end to end, a ReceiveMessage long poll parked before the send and woken by
    its append, as the bare stacks' is (:meth:`GrpcPeer.parked_end_to_end_latencies`)."""
    with HalfmoonServer(flush="async") as server:
        peer = GrpcPeer(server, HALFMOON)
        try:
            sends = [s * 1000 for s in await peer.send_latencies(calls)]
            parked = await peer.parked_end_to_end_latencies(calls, settle=SETTLE_S)
            arrivals = [s * 1000 for s in parked]
            cpu_before = process_cpu_seconds(server.pid)
            result = await peer.produce(senders, 1, seconds)
            cpu_after = process_cpu_seconds(server.pid)
        finally:
            await peer.close()
    assert cpu_before is not None and cpu_after is not None
    return Round(
        stack=HALFMOON,
        send_p50_ms=percentile(sends, 0.5),
        send_p99_ms=percentile(sends, 0.99),
        receive_p50_ms=0.0,  # no constant stream to ask for
        receive_p99_ms=0.0,
        end_to_end_p50_ms=percentile(arrivals, 0.5),
        end_to_end_p99_ms=percentile(arrivals, 0.99),
        calls_per_second=result.per_second,
        server_cpu_us_per_call=(cpu_after - cpu_before) / result.messages * 1e6,
    )


async def measure_rabbitmq(calls: int) -> RabbitRound:
    peer = await AmqpPeer.open()
    try:
        sends = [s * 1000 for s in await peer.send_latencies(calls)]
        paced = [s * 1000 for s in await peer.end_to_end_latencies(calls, settle=SETTLE_S)]
        back_to_back = [s * 1000 for s in await peer.end_to_end_latencies(calls)]
    finally:
        await peer.close()
    return RabbitRound(
        send_p50_ms=percentile(sends, 0.5),
        send_p99_ms=percentile(sends, 0.99),
        end_to_end_p50_ms=percentile(paced, 0.5),
        end_to_end_p99_ms=percentile(paced, 0.99),
        back_to_back_p50_ms=percentile(back_to_back, 0.5),
        back_to_back_p99_ms=percentile(back_to_back, 0.99),
    )


def _range(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return (
        format(low, fmt)
        if format(low, fmt) == format(high, fmt)
        else (f"{format(low, fmt)}–{format(high, fmt)}")
    )


@dataclass
class RoundSet:
    """One round: every stack (and halfmoon) once, then RabbitMQ."""

    stacks: list[Round]
    rabbitmq: RabbitRound | None


def _pair(p50s: list[float], p99s: list[float]) -> str:
    return f"{_range(p50s, '.2f')} · {_range(p99s, '.2f')}"


def report(rounds: list[RoundSet]) -> str:
    header = (
        f"{'stack':<20} {'send p50 · p99 (ms)':>22} {'receive p50 · p99 (ms)':>24} "
        f"{'end to end p50 · p99':>24} {'calls/s, 16 senders':>20} {'server CPU/call (us)':>21}"
    )
    lines = [header, "-" * len(header)]
    every = [r for one in rounds for r in one.stacks]
    for stack in (*STACKS, HALFMOON):
        mine = [r for r in every if r.stack == stack]
        if not mine:
            continue
        send = _pair([r.send_p50_ms for r in mine], [r.send_p99_ms for r in mine])
        receive = "-"
        if stack != HALFMOON:
            receive = _pair([r.receive_p50_ms for r in mine], [r.receive_p99_ms for r in mine])
        e2e = _pair([r.end_to_end_p50_ms for r in mine], [r.end_to_end_p99_ms for r in mine])
        rate = _range([r.calls_per_second for r in mine], ",.0f")
        cpu = _range([r.server_cpu_us_per_call for r in mine], ".0f")
        lines.append(f"{stack:<20} {send:>22} {receive:>24} {e2e:>24} {rate:>20} {cpu:>21}")
    rabbit = [one.rabbitmq for one in rounds if one.rabbitmq is not None]
    if rabbit:
        send = _pair([r.send_p50_ms for r in rabbit], [r.send_p99_ms for r in rabbit])
        e2e = _pair([r.end_to_end_p50_ms for r in rabbit], [r.end_to_end_p99_ms for r in rabbit])
        lines.append(f"{'RabbitMQ (aio-pika)':<20} {send:>22} {'-':>24} {e2e:>24}")
        back = _pair(
            [r.back_to_back_p50_ms for r in rabbit], [r.back_to_back_p99_ms for r in rabbit]
        )
        lines.append(f"{'  back to back':<20} {'':>22} {'':>24} {back:>24}")
        lines.append("")
        lines.append(
            "round by round, each p50 over RabbitMQ's in the same round "
            "(send ÷ send, end to end ÷ end to end):"
        )
        for number, one in enumerate(rounds, 1):
            peer = one.rabbitmq
            if peer is None:
                continue
            cells = [
                f"{r.stack} {r.send_p50_ms / peer.send_p50_ms:.2f}×, "
                f"{r.end_to_end_p50_ms / peer.end_to_end_p50_ms:.2f}×"
                for r in one.stacks
            ]
            lines.append(f"  round {number}: " + "; ".join(cells))
    return "\n".join(lines)


async def run(
    stacks: list[str], rounds: int, calls: int, seconds: float, *, rabbitmq: bool, halfmoon: bool
) -> list[RoundSet]:
    done = []
    for number in range(1, rounds + 1):
        results = []
        for stack in stacks:
            with StackServer(stack) as server:
                results.append(await measure(server, calls, seconds, senders=16))
            print(f"round {number}: {results[-1]}", flush=True)
        if halfmoon:
            results.append(await measure_halfmoon(calls, seconds, senders=16))
            print(f"round {number}: {results[-1]}", flush=True)
        peer = await measure_rabbitmq(calls) if rabbitmq else None
        if peer is not None:
            print(f"round {number}: RabbitMQ: {peer}", flush=True)
        done.append(RoundSet(results, peer))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_stacks", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per latency row")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the 16-sender run")
    parser.add_argument("--stacks", default=",".join(STACKS), help="comma-separated subset")
    parser.add_argument("--json", default=None, help="write the rounds to this file")
    parser.add_argument(
        "--no-rabbitmq", action="store_true", help="leave out the RabbitMQ reference rounds"
    )
    parser.add_argument("--no-halfmoon", action="store_true", help="leave out halfmoon's rows")
    parser.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    stacks = [s for s in args.stacks.split(",") if s]
    unknown = set(stacks) - set(STACKS)
    if unknown:
        parser.error(f"unknown stacks {sorted(unknown)}; choose from {list(STACKS)}")
    rounds = asyncio.run(
        run(
            stacks, args.rounds, args.calls, args.seconds,
            rabbitmq=not args.no_rabbitmq, halfmoon=not args.no_halfmoon,
        )
    )  # fmt: skip
    print(report(rounds))
    print(f"machine: {machine_info()}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": [asdict(r) for r in rounds], "machine": machine_info()}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
