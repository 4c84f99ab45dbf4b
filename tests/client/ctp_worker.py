"""Child of test_consume_transaction_crash: a consume-transform-produce loop until killed.

Usage: python -m tests.client.ctp_worker ENDPOINT SOURCE SINK GROUP BATCH SEED

Receives up to BATCH messages of SOURCE, and in one transaction sends
``out:<body>`` to SINK for each (the input's message id in the ``input``
property) and acks it; commits; prints ``C <n>`` after each commit. Any
client error (the broker was killed, a fence, a restart during the
transaction) abandons the transaction and goes on: what was not committed
comes back after its invisible time. Every few transactions it pauses
between the sends and the commit, so a kill often lands mid-transaction.
"""

from __future__ import annotations

import asyncio
import random
import sys

from halfmoon.client import (
    ClientError,
    Message,
    MessageSelector,
    SimpleConsumer,
    TransactionProducer,
)

INVISIBLE = 2.0


async def main() -> None:
    endpoint, source, sink, group = sys.argv[1:5]
    batch, rng = int(sys.argv[5]), random.Random(int(sys.argv[6]))
    options = {"request_timeout": 3.0}
    async with (
        TransactionProducer(endpoint, "ctp-producers", **options) as producer,
        SimpleConsumer(endpoint, group, {source: MessageSelector.all()}, **options) as consumer,
    ):
        print("ready", flush=True)
        while True:
            try:
                received = await consumer.receive(batch, INVISIBLE, wait=1.0)
                if not received:
                    continue
                tx = consumer.transaction(producer)
                for message in received:
                    await tx.send(
                        Message(
                            sink,
                            b"out:" + message.body,
                            properties={"input": message.message_id},
                        )
                    )
                    await tx.ack(message)
                if rng.random() < 0.2:
                    await asyncio.sleep(rng.uniform(0.0, 0.05))
                await tx.commit()
                print(f"C {len(received)}", flush=True)
            except ClientError as error:
                print(f"E {error.code}", flush=True)
                await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main())
