"""A server killed (SIGKILL) and restarted during production: nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import threading

from halfmoon.client import Backoff, ClientError, Message, MessageSelector, Producer, SimpleConsumer
from tests.client.conftest import run
from tests.waiting import until


def test_producer_survives_server_restart(server_factory) -> None:
    proc = server_factory(settings=("store.flush=sync",)).start()
    proc.create_topic("restart")
    proc.create_group("restart-g")
    acked: list[str] = []
    failed: list[BaseException] = []

    async def scenario() -> None:
        producer = Producer(
            proc.grpc,
            max_attempts=60,
            retry_backoff=Backoff(initial=0.05, maximum=0.3),
            request_timeout=2.0,
        )
        await producer.start()
        stop = asyncio.Event()

        async def sender(worker: int) -> None:
            n = 0
            while not stop.is_set():
                try:
                    receipt = await producer.send(Message("restart", f"{worker}-{n}".encode()))
                    acked.append(receipt.message_id)
                except ClientError as exc:
                    failed.append(exc)
                n += 1

        senders = [asyncio.create_task(sender(w)) for w in range(4)]
        await until(lambda: len(acked) >= 50, 15, "50 acknowledged sends before the kill")
        before_kill = len(acked)
        restarted = threading.Event()

        def kill_and_restart() -> None:
            proc.kill()  # SIGKILL
            proc.start()
            restarted.set()

        await asyncio.to_thread(kill_and_restart)
        await until(
            lambda: len(acked) >= before_kill + 50,
            20,
            "50 more acknowledged sends after the restart",
        )
        stop.set()
        await asyncio.gather(*senders)
        assert producer.stats.retries > 0  # the outage was seen and ridden out
        await producer.close()

        async with SimpleConsumer(
            proc.grpc, "restart-g", {"restart": MessageSelector.all()}
        ) as consumer:
            seen: set[str] = set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while not set(acked) <= seen and loop.time() < deadline:
                batch = await consumer.receive(256, 60, wait=1.0)
                seen.update(m.message_id for m in batch)
            missing = set(acked) - seen
            assert not missing, f"{len(missing)} acknowledged messages lost"

    try:
        run(scenario(), timeout=90)
    finally:
        proc.kill()
    assert not failed, failed[:3]
