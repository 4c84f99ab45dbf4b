"""Child of test_transaction_timeout: receives one message, sends its output in a transaction,
prints ``SENT`` and stalls before the ack (until killed).

Usage: python -m tests.client.stalled_worker ENDPOINT SOURCE SINK GROUP TIMEOUT_S
"""

from __future__ import annotations

import asyncio
import sys

from halfmoon.client import Message, MessageSelector, SimpleConsumer, TransactionProducer


async def main() -> None:
    endpoint, source, sink, group = sys.argv[1:5]
    timeout = float(sys.argv[5])
    async with (
        TransactionProducer(endpoint, "stalled-producers") as producer,
        SimpleConsumer(endpoint, group, {source: MessageSelector.all()}) as consumer,
    ):
        received = []
        while not received:
            received = await consumer.receive(1, 3, wait=1)
        tx = consumer.transaction(producer, timeout=timeout)
        await tx.send(Message(sink, b"out:" + received[0].body))
        print("SENT", flush=True)
        await asyncio.Event().wait()  # killed here, between the first send and the first ack


if __name__ == "__main__":
    asyncio.run(main())
