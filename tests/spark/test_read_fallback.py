"""The source's tasks read through BulkRead, and through PullMessage from a server without it.

Runs the tasks' read code (``read_range``) directly against an in-process
server that serves MessagingService only (as Apache RocketMQ, or a halfmoon
before BulkRead): the first BulkRead call fails with UNIMPLEMENTED and the
task reads the same rows with PullMessage.
"""

from __future__ import annotations

import asyncio

import grpc

from halfmoon.broker.broker import Broker
from halfmoon.broker.message import OutgoingMessage
from halfmoon.config import ServerConfig
from halfmoon.server.grpc_service import MessagingServicer
from halfmoon.server.handlers import messaging_handler
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.spark import source
from halfmoon.spark.options import source_options
from halfmoon.spark.plan import QueueRange
from halfmoon.spark.source import read_range
from halfmoon.store.memory import MemoryStore


def test_a_server_without_bulk_read_is_read_with_pull_message() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        broker = Broker(store, None)
        broker.create_topic("old-server", queue_count=1)
        broker.send(
            [OutgoingMessage("old-server", b"%d" % i, tag="t", queue_id=0) for i in range(2500)]
        )
        loop = asyncio.get_running_loop()
        registry = ClientRegistry()
        registry.bind_loop(loop)
        notifier = ArrivalNotifier(loop)
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        servicer = MessagingServicer(
            broker, ServerConfig(), registry, notifier, advertised=("127.0.0.1", port)
        )
        server.add_generic_rpc_handlers((messaging_handler(servicer),))  # no BulkRead
        await server.start()
        endpoint = f"127.0.0.1:{port}"
        try:
            options = source_options({"endpoint": endpoint, "topic": "old-server"}, streaming=False)

            def read() -> list[int]:
                batches = read_range(options, QueueRange("old-server", 0, 10, 2400))
                return [o for b in batches for o in b.column("queue_offset").to_pylist()]

            assert await asyncio.to_thread(read) == list(range(10, 2400))
            assert endpoint in source._NO_BULK_READ
        finally:
            source._NO_BULK_READ.discard(endpoint)
            registry.close_all()
            await server.stop(0)
            broker.close()
            store.close()

    asyncio.run(scenario())
