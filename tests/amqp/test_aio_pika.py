"""The AMQP endpoint through aio-pika (aiormq underneath): the asyncio clients' view."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq.exceptions
import pamqp.commands
import pytest


def name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


async def connect(url: str) -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(url, timeout=10)


def test_publish_consume_ack_with_confirms_and_properties(amqp_url: str) -> None:
    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.declare_exchange(name("ex"), aio_pika.ExchangeType.TOPIC, durable=True)
            q = await ch.declare_queue(name("q"), durable=True)
            await q.bind(ex, "orders.#")
            for i in range(5):
                confirmation = await ex.publish(
                    aio_pika.Message(
                        f"m{i}".encode(),
                        headers={"i": i},
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        correlation_id=f"c{i}",
                    ),
                    routing_key="orders.eu",
                )
                assert isinstance(confirmation, aiormq.abc.ConfirmationFrameType)
            await ch.set_qos(prefetch_count=2)
            got = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.headers["i"], message.correlation_id))
                    if len(got) == 5:
                        break
            assert got == [(f"m{i}".encode(), i, f"c{i}") for i in range(5)]

    asyncio.run(main())


def test_reject_requeue_redelivers_and_get_sees_redelivered(amqp_url: str) -> None:
    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(name("rq"))
            await ch.default_exchange.publish(aio_pika.Message(b"again"), routing_key=q.name)
            first = await q.get(timeout=5)
            assert not first.redelivered
            await first.reject(requeue=True)
            for _ in range(50):
                second = await q.get(fail=False)
                if second is not None:
                    break
                await asyncio.sleep(0.1)
            assert second is not None and second.body == b"again" and second.redelivered
            await second.ack()

    asyncio.run(main())


def test_passive_declare_of_a_missing_queue_is_404(amqp_url: str) -> None:
    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await ch.declare_queue(name("missing"), passive=True)
            ch2 = await conn.channel()
            await ch2.declare_queue(name("fine"))

    asyncio.run(main())


def test_deleting_a_queue_or_exchange_that_is_not_there_is_delete_ok(amqp_url: str) -> None:
    """As RabbitMQ answers it: aio-pika's own suite deletes in its cleanup what a test
    already deleted, and expects no channel error."""

    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel()
            queue = await ch.declare_queue(name("twice"))
            await ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=queue.name)
            exchange = await ch.declare_exchange(name("twice"), aio_pika.ExchangeType.FANOUT)
            assert (await queue.delete(if_unused=False, if_empty=False)).message_count == 1
            await exchange.delete()
            raw = await ch.get_underlay_channel()  # aio-pika's objects forget a deleted one
            assert (await raw.queue_delete(queue.name)).message_count == 0
            assert isinstance(
                await raw.exchange_delete(exchange.name), pamqp.commands.Exchange.DeleteOk
            )
            assert not ch.is_closed
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await ch.declare_queue(queue.name, passive=True)
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await (await conn.channel()).declare_exchange(exchange.name, passive=True)

    asyncio.run(main())


def test_unbinding_an_auto_delete_queue_gone_with_its_consumer_is_unbind_ok(
    amqp_url: str,
) -> None:
    """aio-pika's RPC pattern closes so: cancel the result queue's only consumer (the
    auto-delete queue goes), then unbind it. RabbitMQ answers Unbind-Ok."""

    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel()
            queue = await ch.declare_queue(None, auto_delete=True)
            dlx = await ch.declare_exchange(
                name("dlx"), aio_pika.ExchangeType.HEADERS, auto_delete=True
            )
            arguments = {"From": queue.name, "x-match": "any"}
            await queue.bind(dlx, "", arguments=arguments)
            tag = await queue.consume(lambda message: None, exclusive=True, no_ack=True)
            await queue.cancel(tag)
            await queue.unbind(dlx, "", arguments=arguments)
            raw = await ch.get_underlay_channel()
            await raw.queue_unbind(queue.name, name("missing"), "")
            assert not ch.is_closed
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await ch.declare_queue(queue.name, passive=True)

    asyncio.run(main())


def test_transaction_commit_and_rollback(amqp_url: str) -> None:
    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel(publisher_confirms=False)
            a = await ch.declare_queue(name("ta"))
            b = await ch.declare_queue(name("tb"))
            c = await ch.declare_queue(name("tc"))
            await ch.default_exchange.publish(aio_pika.Message(b"in"), routing_key=a.name)
            tx = ch.transaction()
            await tx.select()
            msg = await a.get(timeout=5)
            await ch.default_exchange.publish(aio_pika.Message(b"out-b"), routing_key=b.name)
            await ch.default_exchange.publish(aio_pika.Message(b"out-c"), routing_key=c.name)
            await msg.ack()
            await tx.rollback()
            assert await b.get(fail=False) is None and await c.get(fail=False) is None
            await ch.default_exchange.publish(aio_pika.Message(b"out-b"), routing_key=b.name)
            await ch.default_exchange.publish(aio_pika.Message(b"out-c"), routing_key=c.name)
            # The rollback left the delivery unacked: ack it again (aio-pika refuses a second
            # ack of one message object, so through the aiormq channel underneath).
            underlay = await ch.get_underlay_channel()
            await underlay.basic_ack(msg.delivery_tag)
            await tx.commit()
            got_b = await b.get(timeout=5)
            got_c = await c.get(timeout=5)
            assert got_b.body == b"out-b" and got_c.body == b"out-c"
            assert a.declaration_result.message_count in (0, 1)
            again = await ch.declare_queue(a.name, passive=True)
            assert again.declaration_result.message_count == 0

    asyncio.run(main())


def test_a_consumer_nack_dead_letters_through_a_dead_letter_exchange(amqp_url: str) -> None:
    """The consuming pattern aio-pika users write: process() without requeue on failure."""

    async def main() -> None:
        conn = await connect(amqp_url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            dlx = await ch.declare_exchange(name("dlx"), aio_pika.ExchangeType.DIRECT)
            parked = await ch.declare_queue(name("parked"))
            await parked.bind(dlx, "failed")
            work = await ch.declare_queue(
                name("work"),
                arguments={
                    "x-dead-letter-exchange": dlx.name,
                    "x-dead-letter-routing-key": "failed",
                },
            )
            await ch.default_exchange.publish(
                aio_pika.Message(b"poison", priority=1), routing_key=work.name
            )
            async with work.iterator() as it:
                async for message in it:
                    with pytest.raises(ValueError):
                        async with message.process(requeue=False):
                            raise ValueError("cannot handle it")
                    break
            dead = None
            for _ in range(100):
                dead = await parked.get(fail=False)
                if dead is not None:
                    break
                await asyncio.sleep(0.1)
            assert dead is not None and dead.body == b"poison" and dead.priority == 1
            await dead.ack()
            [death] = dead.headers["x-death"]
            assert death["reason"] == "rejected" and death["queue"] == work.name
            assert death["count"] == 1 and dead.routing_key == "failed"
            assert dead.exchange == dlx.name

    asyncio.run(main())
