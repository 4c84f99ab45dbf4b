"""An in-process gRPC endpoint over the in-memory store, for fast servicer tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.broker.broker import Broker
from halfmoon.config import ServerConfig
from halfmoon.server.grpc_service import MessagingServicer
from halfmoon.server.handlers import messaging_handler
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.store.memory import MemoryStore


class InProcess:
    def __init__(
        self,
        broker: Broker,
        registry: ClientRegistry,
        notifier: ArrivalNotifier,
        stub: service_pb2_grpc.MessagingServiceStub,
        servicer: MessagingServicer,
    ) -> None:
        self.broker = broker
        self.registry = registry
        self.notifier = notifier
        self.stub = stub
        self.servicer = servicer

    async def until_parked(self, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``count`` long polls are parked on the server."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.notifier.parked() < count:
            assert asyncio.get_running_loop().time() < deadline, "no poll parked"
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def in_process() -> AsyncIterator[InProcess]:
    loop = asyncio.get_running_loop()
    store = MemoryStore()
    broker = Broker(store, None)
    broker.create_topic("orders", queue_count=2)
    registry = ClientRegistry()
    registry.bind_loop(loop)
    notifier = ArrivalNotifier(loop)
    broker.add_arrival_listener(notifier.on_arrival)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    servicer = MessagingServicer(
        broker, ServerConfig(), registry, notifier, advertised=("127.0.0.1", port)
    )
    server.add_generic_rpc_handlers((messaging_handler(servicer),))
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        yield InProcess(broker, registry, notifier, stub, servicer)
    finally:
        await channel.close()
        registry.close_all()
        await server.stop(0)
        broker.close()
        store.close()


def run(scenario: Callable[[InProcess], Awaitable[None]]) -> None:
    """Run ``scenario`` against a fresh endpoint on a fresh event loop."""

    async def main() -> None:
        async with in_process() as endpoint:
            await scenario(endpoint)

    asyncio.run(main())
