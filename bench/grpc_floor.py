"""The floor under halfmoon's per-call cost: a bare ``grpc.aio`` server answering SendMessage.

    python -m bench.grpc_floor --port 0        # serve until SIGTERM (the benchmark starts it)

It decodes each ``SendMessageRequest`` and answers a constant OK entry per
message, through the same generic-handler registration (raw bytes in,
``SerializeToString`` out) and the keepalive options of ``halfmoon
serve``, with no store, no broker and no metrics. Whatever CPU a send costs
here is grpc.aio's (its Cython layer on the event loop, the completion-queue
poller thread, the C core's I/O threads) and protobuf's; what halfmoon spends
above it is its own. :class:`FloorServer` runs it as a subprocess shaped
like :class:`bench.server_proc.HalfmoonServer`, so :class:`bench.halfmoon_peer.GrpcPeer`
drives both the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import threading
import time

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from bench.server_proc import REPO_ROOT, ServerError, free_port

READY_LINE = "grpc floor ready"
SERVICE = "apache.rocketmq.v2.MessagingService"


def answer_send(raw: bytes) -> svc.SendMessageResponse:
    """The constant answer to one SendMessageRequest: OK for each of its messages."""
    request = svc.SendMessageRequest.FromString(raw)
    ok = pb.Status(code=pb.Code.OK, message="OK")
    entries = [
        svc.SendResultEntry(
            status=ok,
            message_id=m.system_properties.message_id,
            transaction_id=m.system_properties.message_id,
        )
        for m in request.messages
    ]
    return svc.SendMessageResponse(status=ok, entries=entries)


async def serve(port: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ]
    )

    async def send_message(raw: bytes, context: grpc.aio.ServicerContext) -> object:
        return answer_send(raw)

    handler = grpc.unary_unary_rpc_method_handler(
        send_message, response_serializer=svc.SendMessageResponse.SerializeToString
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"SendMessage": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(READY_LINE, flush=True)
    await stop.wait()
    await server.stop(1)


class FloorServer:
    """The floor server as a subprocess; ``grpc`` and ``pid`` as HalfmoonServer's. A subclass
    runs another server that prints :data:`READY_LINE` when it listens (:meth:`command`)."""

    def __init__(self) -> None:
        self.grpc_port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def create_topic(self, name: str, *, queues: int = 8, message_type: str = "normal") -> None:
        """Nothing to create: the floor answers every topic."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench.grpc_floor", "--port", str(self.grpc_port)]

    def start(self) -> FloorServer:
        self.proc = subprocess.Popen(
            self.command(), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        ready = threading.Event()
        lines: list[str] = []

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.append(line)
                if READY_LINE in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 30
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"{self.command()} did not start:\n" + "".join(lines))
        return self

    def __enter__(self) -> FloorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
