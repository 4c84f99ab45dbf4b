"""Child of test_tx_ctp_crash: an aio-pika consume-transform-produce loop, in ``tx``, until killed.

Usage: python -m tests.amqp.ctp_worker URL SOURCE SINK_B SINK_C BATCH SEED

Consumes SOURCE with prefetch BATCH on a channel in Tx.Select. Each transaction takes
1 to BATCH deliveries and, for each, publishes ``b:<body>`` to SINK_B and ``c:<body>``
to SINK_C (persistent, default exchange) and acks it, then commits; it prints
``C <n>`` after each Commit-Ok. The steps are spread out by short random pauses, so a
SIGKILL from the parent lands before, inside and after commits. Any error (the broker
was killed, a commit refused) drops the connection and starts over: what was not
committed comes back to SOURCE.
"""

from __future__ import annotations

import asyncio
import random
import sys

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractQueueIterator


async def take(messages: AbstractQueueIterator, most: int) -> list[AbstractIncomingMessage]:
    """One delivery (waiting for it), then whatever else arrives without waiting long."""
    batch = [await messages.__anext__()]
    while len(batch) < most:
        try:
            batch.append(await asyncio.wait_for(messages.__anext__(), 0.05))
        except TimeoutError:
            break
    return batch


async def pause(rng: random.Random) -> None:
    if rng.random() < 0.3:
        await asyncio.sleep(rng.uniform(0.0, 0.02))


async def run(
    url: str, source: str, sinks: tuple[str, str], batch: int, rng: random.Random
) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=batch)
        tx = channel.transaction()
        await tx.select()
        queue = await channel.get_queue(source)
        exchange = channel.default_exchange
        print("ready", flush=True)
        async with queue.iterator() as messages:
            while True:
                taken = await take(messages, rng.randint(1, batch))
                for message in taken:
                    for prefix, sink in zip((b"b:", b"c:"), sinks, strict=True):
                        out = aio_pika.Message(
                            prefix + message.body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        )
                        await exchange.publish(out, routing_key=sink)
                        await pause(rng)
                    await message.ack()
                await pause(rng)
                await tx.commit()
                print(f"C {len(taken)}", flush=True)


async def main() -> None:
    url, source, sink_b, sink_c = sys.argv[1:5]
    batch, rng = int(sys.argv[5]), random.Random(int(sys.argv[6]))
    while True:
        try:
            await run(url, source, (sink_b, sink_c), batch, rng)
        except Exception as error:  # the broker went away, a commit was refused: start over
            print(f"E {type(error).__name__}: {error}", flush=True)
            await asyncio.sleep(0.2)


if __name__ == "__main__":
    asyncio.run(main())
