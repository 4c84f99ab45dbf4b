"""The AMQP benchmark's scenarios through pika's BlockingConnection (threads, blocking calls).

What a Flask or Django program does: one connection per thread, a publish in
confirm mode returns once the server confirmed it (one in flight per
publisher). Durable queues, persistent messages. The scenarios:

* end to end: a publisher thread and a consumer thread (prefetch 100, acks),
  one message at a time, the publisher idle ``settle`` seconds before each;
* confirmed throughput: N publisher threads, each its own connection;
* tx: a channel in tx mode takes k messages with ``basic_get`` from queue A,
  publishes k to B, acks them and commits.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from bench.load import BODY_SIZE, LATENCY_WARMUP, Throughput, body, seq_of

PREFETCH = 100
ARRIVAL_TIMEOUT = 10.0


def _connect(url: str) -> Any:
    import pika

    return pika.BlockingConnection(pika.URLParameters(url))


def _persistent() -> Any:
    import pika

    return pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)


class PikaScenarios:
    def __init__(self, url: str, queue_arguments: dict[str, Any]) -> None:
        self.url = url
        self._arguments = queue_arguments
        self._prefix = f"halfmoon-bench-{os.getpid()}-pika"
        self._admin_connection = _connect(url)
        self._admin = self._admin_connection.channel()
        self._declared: list[str] = []

    def close(self) -> None:
        for name in self._declared:
            self._admin.queue_delete(name)
        self._admin_connection.close()

    def _queue(self, what: str) -> str:
        name = f"{self._prefix}-{what}"
        self._admin.queue_declare(name, durable=True, arguments=self._arguments)
        self._admin.queue_purge(name)
        if name not in self._declared:
            self._declared.append(name)
        return name

    def end_to_end(self, count: int, settle: float) -> list[float]:
        name = self._queue("e2e")
        producer = _connect(self.url)
        channel = producer.channel()
        channel.confirm_delivery()
        seen: dict[int, float] = {}
        arrived = threading.Condition()
        ready = threading.Event()
        holder: dict[str, Any] = {}

        def consume() -> None:
            connection = _connect(self.url)
            ch = connection.channel()
            ch.basic_qos(prefetch_count=PREFETCH)

            def on_message(ch_: Any, method: Any, _props: Any, payload: bytes) -> None:
                with arrived:
                    seen[seq_of(payload)] = time.perf_counter()
                    arrived.notify_all()
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume(name, on_message)
            holder.update(connection=connection, channel=ch)
            ready.set()
            try:
                ch.start_consuming()
            finally:
                connection.close()

        reader = threading.Thread(target=consume, name="bench-pika-consumer", daemon=True)
        reader.start()
        samples = []
        try:
            if not ready.wait(ARRIVAL_TIMEOUT):
                raise TimeoutError("the pika consumer did not start")
            properties = _persistent()
            for seq in range(LATENCY_WARMUP + count):
                time.sleep(settle)
                started = time.perf_counter()
                channel.basic_publish("", name, body(seq, BODY_SIZE), properties)
                with arrived:
                    if not arrived.wait_for(lambda s=seq: s in seen, ARRIVAL_TIMEOUT):
                        raise TimeoutError(f"message {seq} did not arrive")
                samples.append(seen.pop(seq) - started)
        finally:
            if "connection" in holder:
                holder["connection"].add_callback_threadsafe(holder["channel"].stop_consuming)
            reader.join(ARRIVAL_TIMEOUT)
            producer.close()
        return samples[LATENCY_WARMUP:]

    def confirmed(self, publishers: int, seconds: float) -> Throughput:
        name = self._queue("confirmed")
        counts = [0] * publishers
        errors: list[BaseException] = []
        start = threading.Barrier(publishers + 1)

        def publish(index: int) -> None:
            try:
                connection = _connect(self.url)
                channel = connection.channel()
                channel.confirm_delivery()
                payload, properties = body(0, BODY_SIZE), _persistent()
                start.wait()
                stop_at = time.monotonic() + seconds
                while time.monotonic() < stop_at:
                    channel.basic_publish("", name, payload, properties)
                    counts[index] += 1
                connection.close()
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                errors.append(exc)
                start.abort()

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(publishers)]
        for thread in threads:
            thread.start()
        start.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise errors[0]
        self._admin.queue_purge(name)
        return Throughput(sum(counts), elapsed)

    def tx_fill(self, messages: int) -> str:
        """A source queue for :meth:`tx` holding ``messages`` confirmed messages (filled
        before the run, so its publishes count in neither its time nor its server CPU)."""
        source = self._queue("tx-in")
        filler = _connect(self.url)
        fill_channel = filler.channel()
        fill_channel.confirm_delivery()
        payload, properties = body(0, BODY_SIZE), _persistent()
        for _ in range(messages):
            fill_channel.basic_publish("", source, payload, properties)
        filler.close()
        return source

    def tx(self, source: str, per_tx: int, seconds: float, fill: int) -> Throughput:
        target = self._queue("tx-out")
        properties = _persistent()
        connection = _connect(self.url)
        channel = connection.channel()
        channel.tx_select()
        done = 0
        started = time.perf_counter()
        stop_at = time.monotonic() + seconds
        try:
            while time.monotonic() < stop_at and (done + 1) * per_tx <= fill:
                last = 0
                for _ in range(per_tx):
                    method, _props, taken = channel.basic_get(source)
                    if method is None:
                        raise RuntimeError(f"{source} ran dry after {done} transactions")
                    channel.basic_publish("", target, taken, properties)
                    last = method.delivery_tag
                channel.basic_ack(last, multiple=True)
                channel.tx_commit()
                done += 1
            return Throughput(done, time.perf_counter() - started)
        finally:
            connection.close()
