"""End-to-end and send latency through blocking clients: the official RocketMQ Python client
against halfmoon, pika against RabbitMQ.

The same loop on both sides, the way an application using these clients
writes it (threads, blocking calls):

* halfmoon: ``rocketmq.Producer.send`` (one message, waits for the answer)
  → a ``rocketmq.SimpleConsumer`` parked in ``receive(32, ...)`` on its own
  thread (long polling, ``await_duration`` below); each message is acked
  from a second thread, off the critical path (the client's ``ack_async``
  needs an asyncio loop in the calling thread, so a plain thread calls ``ack``).
* RabbitMQ: pika ``BlockingConnection`` with publisher confirms
  (``basic_publish`` returns once the confirm is in) on a durable queue,
  persistent messages → a consumer on its own connection and thread,
  ``basic_qos(prefetch_count=32)`` + ``basic_consume``, acking every message.

One message is in flight at a time: the next goes out only once the
previous one was seen by the consumer, so a sample is latency, not queueing.
A sample runs from the start of the send call to the consumer thread seeing
the message (``time.perf_counter`` in this one process). The send row times
the same ``send`` / ``basic_publish`` calls alone, one after another.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bench.load import BODY_SIZE, LATENCY_WARMUP, body, seq_of
from bench.server_proc import HalfmoonServer

QUEUES = 8
RECEIVE_BATCH = 32
INVISIBLE_SECONDS = 30
AWAIT_SECONDS = 5  # the consumer's long poll; a message ends it at once
ARRIVAL_TIMEOUT = 10.0
RPC_TIMEOUT = 10  # the official client wants an int
PREFETCH = 32
_names = itertools.count()


@dataclass(slots=True)
class Latencies:
    """Seconds per sample: sequential sends alone, then send → seen by the consumer."""

    send: list[float] = field(default_factory=list)
    end_to_end: list[float] = field(default_factory=list)


class _Arrivals:
    """Thread-safe: the consumer thread marks a seq seen; the sender waits for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[threading.Event, list[float]]] = {}

    def expect(self, seq: int) -> tuple[threading.Event, list[float]]:
        entry = (threading.Event(), [])
        with self._lock:
            self._waiting[seq] = entry
        return entry

    def arrived(self, seq: int) -> None:
        seen = time.perf_counter()
        with self._lock:
            entry = self._waiting.pop(seq, None)
        if entry is not None:
            entry[1].append(seen)
            entry[0].set()


def _sequential(count: int, send_one: Callable[[int], object]) -> list[float]:
    samples = []
    for seq in range(LATENCY_WARMUP + count):
        started = time.perf_counter()
        send_one(seq)
        samples.append(time.perf_counter() - started)
    return samples[LATENCY_WARMUP:]


def _end_to_end(count: int, arrivals: _Arrivals, send_one: Callable[[int], object]) -> list[float]:
    samples = []
    for seq in range(LATENCY_WARMUP + count):
        event, seen = arrivals.expect(seq)
        started = time.perf_counter()
        send_one(seq)
        if not event.wait(ARRIVAL_TIMEOUT):
            raise TimeoutError(f"message {seq} not seen by the consumer in {ARRIVAL_TIMEOUT}s")
        samples.append(seen[0] - started)
    return samples[LATENCY_WARMUP:]


# -- halfmoon through the official client -----------------------------------------------


def official_latencies(server: HalfmoonServer, send_count: int, e2e_count: int) -> Latencies:
    """Blocking (run it in a thread): the official client's send and end-to-end latency."""
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    # The send row writes to a topic of its own, so the consumer starts on an empty one.
    send_topic = f"bench-official-send-{next(_names)}"
    topic = f"bench-official-e2e-{next(_names)}"
    group = f"bench-official-e2e-{next(_names)}"
    server.create_topic(send_topic, queues=QUEUES)
    server.create_topic(topic, queues=QUEUES)
    server.create_group(group, consume_from="earliest")
    config = ClientConfiguration(server.grpc, Credentials(), request_timeout=RPC_TIMEOUT)
    producer = Producer(config, (send_topic, topic))
    consumer = SimpleConsumer(
        config, group, {topic: FilterExpression()}, await_duration=AWAIT_SECONDS
    )
    arrivals = _Arrivals()
    acks = ThreadPoolExecutor(1, thread_name_prefix="bench-official-ack")
    stopping = threading.Event()
    failures: list[BaseException] = []

    def consume() -> None:
        while not stopping.is_set():
            try:
                messages = consumer.receive(RECEIVE_BATCH, INVISIBLE_SECONDS)
            except Exception as exc:  # noqa: BLE001 - reported by the sender's timeout
                if not stopping.is_set():
                    failures.append(exc)
                return
            for message in messages:
                arrivals.arrived(seq_of(message.body))
                acks.submit(consumer.ack, message)

    def send_to(to: str, seq: int) -> None:
        message = Message()
        message.topic = to
        message.body = body(seq, BODY_SIZE)
        producer.send(message)

    producer.startup()
    consumer.startup()
    reader = threading.Thread(target=consume, name="bench-official-consumer", daemon=True)
    try:
        result = Latencies(send=_sequential(send_count, lambda seq: send_to(send_topic, seq)))
        reader.start()
        result.end_to_end = _end_to_end(e2e_count, arrivals, lambda seq: send_to(topic, seq))
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; consumer failures: {failures!r}") from None
    finally:
        stopping.set()
        acks.shutdown(wait=True)
        producer.shutdown()
        consumer.shutdown()  # ends the parked receive
        reader.join(ARRIVAL_TIMEOUT + AWAIT_SECONDS)
    return result


# -- RabbitMQ through pika ----------------------------------------------------------------


def pika_latencies(url: str, send_count: int, e2e_count: int) -> Latencies:
    """Blocking (run it in a thread): pika's confirmed publish and end-to-end latency."""
    import pika

    params = pika.URLParameters(url)
    queue = f"halfmoon-bench-{os.getpid()}-pika-e2e"
    producer_conn = pika.BlockingConnection(params)
    channel = producer_conn.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-expires": 15 * 60 * 1000})
    channel.queue_purge(queue)
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)

    def send(seq: int) -> None:
        channel.basic_publish("", queue, body(seq, BODY_SIZE), persistent, mandatory=False)

    arrivals = _Arrivals()
    ready = threading.Event()
    holder: dict[str, object] = {}

    def consume() -> None:
        connection = pika.BlockingConnection(params)
        ch = connection.channel()
        ch.basic_qos(prefetch_count=PREFETCH)

        def on_message(ch_: object, method: object, _props: object, payload: bytes) -> None:
            arrivals.arrived(seq_of(payload))
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        ch.basic_consume(queue, on_message, auto_ack=False)
        holder.update(connection=connection, channel=ch)
        ready.set()
        try:
            ch.start_consuming()
        finally:
            connection.close()

    try:
        result = Latencies(send=_sequential(send_count, send))
        channel.queue_purge(queue)
        reader = threading.Thread(target=consume, name="bench-pika-consumer", daemon=True)
        reader.start()
        if not ready.wait(ARRIVAL_TIMEOUT):
            raise TimeoutError("the pika consumer did not start")
        result.end_to_end = _end_to_end(e2e_count, arrivals, send)
        connection, ch = holder["connection"], holder["channel"]
        connection.add_callback_threadsafe(ch.stop_consuming)  # type: ignore[attr-defined]
        reader.join(ARRIVAL_TIMEOUT)
    finally:
        channel.queue_delete(queue)
        producer_conn.close()
    return result
