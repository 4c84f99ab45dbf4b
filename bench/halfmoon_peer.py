"""halfmoon over its RocketMQ 5 gRPC endpoint, driven the way the official clients drive it.

Two front ends on the same server:

* :class:`GrpcPeer`: a raw ``grpc.aio`` channel with the protocol stubs
  from ``rocketmq.grpc_protocol``, sending the requests the official
  clients send (``SendMessageRequest`` with 1 or 32 entries,
  ``ReceiveMessage`` with long polling, ``AckMessage`` with entries). This
  measures the server, with as little client cost as Python allows.
* :func:`official_client_produce`: the official Python client's
  ``rocketmq.Producer`` with concurrent sender threads, so the table shows
  the client's own overhead beside the raw numbers.

Every producer shares one channel (as the official clients share one
channel per endpoint; HTTP/2 multiplexes the calls). A send counts only
once its answer came back with status OK.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from bench import rawstub
from bench.load import (
    BODY_SIZE,
    LATENCY_WARMUP,
    Arrivals,
    Throughput,
    body,
    end_to_end_latencies,
    process_cpu_seconds,
    seq_of,
    sequential_latencies,
    timed_producers,
)
from bench.rawstub import check_status
from bench.server_proc import HalfmoonServer

QUEUES = 8
RECEIVE_BATCH = 32
INVISIBLE_SECONDS = 30
LONG_POLL_SECONDS = 5
RPC_TIMEOUT = 15.0
_names = itertools.count()


class GrpcPeer:
    """halfmoon through a raw gRPC channel; topics and groups are made per scenario."""

    def __init__(self, server: HalfmoonServer, name: str, *, own_connection: bool = False) -> None:
        self.name = name
        self._server = server
        # gRPC shares one connection among a process's channels to the same address unless
        # told not to: own_connection makes this peer's its own (a worker of its own, maybe).
        options = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
        self._channel = grpc.aio.insecure_channel(server.grpc, options=options)
        self._stub = service_pb2_grpc.MessagingServiceStub(self._channel)
        self._client_id = f"bench@{os.getpid()}@{name}"
        self._metadata = (
            ("x-mq-client-id", self._client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.1.2"),
        )
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid():08X}{int(time.time()) & 0xFFFFFFFF:08X}"

    async def close(self) -> None:
        await self._channel.close()

    def server_cpu(self) -> float | None:
        """CPU seconds the server process has used so far."""
        return process_cpu_seconds(self._server.pid)

    # -- plumbing ---------------------------------------------------------------

    def _fresh_topic(self, what: str) -> str:
        topic = f"bench-{what}-{next(_names)}"
        self._server.create_topic(topic, queues=QUEUES)
        return topic

    def _fresh_group(self, what: str) -> str:
        group = f"bench-{what}-{next(_names)}"
        self._server.create_group(group, consume_from="earliest")
        return group

    def _message(self, topic: str, payload: bytes) -> pb.Message:
        message = pb.Message(topic=pb.Resource(name=topic), body=payload)
        sp = message.system_properties
        sp.message_id = f"{self._id_prefix}{next(self._ids):016X}"
        sp.message_type = pb.MessageType.NORMAL
        sp.body_encoding = pb.Encoding.IDENTITY
        sp.born_host = "127.0.0.1"
        sp.born_timestamp.seconds = int(time.time())
        return message

    async def _send(self, topic: str, payloads: list[bytes]) -> int:
        request = svc.SendMessageRequest(messages=[self._message(topic, p) for p in payloads])
        response = await self._stub.SendMessage(
            request, metadata=self._metadata, timeout=RPC_TIMEOUT
        )
        check_status(response.status, "SendMessage")
        return len(response.entries)

    async def _receive(
        self, group: str, topic: str, batch: int, long_poll: float
    ) -> list[pb.Message]:
        return await rawstub.receive(
            self._stub, self._metadata, group, topic, batch=batch,
            invisible_seconds=INVISIBLE_SECONDS, long_poll=long_poll, rpc_timeout=RPC_TIMEOUT,
        )  # fmt: skip

    async def _ack(self, group: str, topic: str, messages: list[pb.Message]) -> None:
        await rawstub.ack(
            self._stub, self._metadata, group, topic, messages, rpc_timeout=RPC_TIMEOUT
        )

    # -- scenarios ----------------------------------------------------------------

    async def produce(
        self, producers: int, batch: int, seconds: float, latencies: list[float] | None = None
    ) -> Throughput:
        topic = self._fresh_topic("produce")
        payloads = [body(0, BODY_SIZE)] * batch

        async def send_round(index: int) -> int:
            return await self._send(topic, payloads)

        return await timed_producers(producers, seconds, send_round, latencies)

    async def send_latencies(self, count: int) -> list[float]:
        topic = self._fresh_topic("latency")

        async def send_one(seq: int) -> None:
            await self._send(topic, [body(seq)])

        return await sequential_latencies(count, send_one)

    async def end_to_end_latencies(self, count: int) -> list[float]:
        topic, group = self._fresh_topic("e2e"), self._fresh_group("e2e")
        arrivals = Arrivals()
        acks: set[asyncio.Task[None]] = set()

        async def consumer() -> None:
            while True:
                messages = await self._receive(group, topic, RECEIVE_BATCH, LONG_POLL_SECONDS)
                for message in messages:
                    arrivals.arrived(seq_of(message.body))
                if messages:
                    # Ack off the critical path, as a consumer that processes first would.
                    task = asyncio.create_task(self._ack(group, topic, messages))
                    acks.add(task)
                    task.add_done_callback(acks.discard)

        polling = asyncio.create_task(consumer())
        try:
            return await end_to_end_latencies(
                count, arrivals, lambda seq: self._send(topic, [body(seq)])
            )
        finally:
            polling.cancel()
            await asyncio.gather(polling, *acks, return_exceptions=True)

    async def parked_end_to_end_latencies(self, count: int, settle: float = 0.002) -> list[float]:
        """Seconds from a send's start to the end of the ReceiveMessage stream it woke, the
        consumer's long poll issued ``settle`` seconds before the send (pacing, outside the
        sample: the poll is parked on the server when the message arrives). Each message is
        acked before the next poll, outside the sample too."""
        topic, group = self._fresh_topic("parked"), self._fresh_group("parked")

        async def poll() -> tuple[list[pb.Message], float]:
            messages = await self._receive(group, topic, RECEIVE_BATCH, LONG_POLL_SECONDS)
            return messages, time.perf_counter()

        samples = []
        for seq in range(LATENCY_WARMUP + count):
            parked = asyncio.create_task(poll())
            await asyncio.sleep(settle)
            began = time.perf_counter()
            await self._send(topic, [body(seq)])
            messages, ended = await parked
            samples.append(ended - began)
            if [seq_of(m.body) for m in messages] != [seq]:
                raise RuntimeError(f"expected message {seq}, received {len(messages)}")
            await self._ack(group, topic, messages)
        return samples[LATENCY_WARMUP:]

    async def consume(self, messages: int, consumers: int) -> Throughput:
        """Receive (batches of 32) and ack (one AckMessage per batch) ``messages`` pre-sent
        messages."""
        topic, group = self._fresh_topic("consume"), self._fresh_group("consume")
        await self._fill(topic, messages)
        loop = asyncio.get_running_loop()
        acked = 0
        done = asyncio.Event()
        finished_at = 0.0

        async def consumer() -> None:
            nonlocal acked, finished_at
            while not done.is_set():
                got = await self._receive(group, topic, RECEIVE_BATCH, 1.0)
                if got:
                    await self._ack(group, topic, got)
                    acked += len(got)
                    if acked >= messages and not done.is_set():
                        finished_at = loop.time()
                        done.set()

        started = loop.time()
        tasks = [asyncio.create_task(consumer()) for _ in range(consumers)]
        try:
            await asyncio.wait_for(done.wait(), timeout=max(30.0, messages / 500))
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return Throughput(acked, finished_at - started)

    async def _fill(self, topic: str, messages: int) -> None:
        """Pre-send ``messages`` messages (16 producers, batches of 32)."""
        payload = body(0, BODY_SIZE)
        remaining = messages

        async def fill() -> None:
            nonlocal remaining
            while remaining > 0:
                n = min(32, remaining)
                remaining -= n
                await self._send(topic, [payload] * n)

        await asyncio.gather(*(fill() for _ in range(16)))


def official_client_produce(
    server: HalfmoonServer, producers: int, seconds: float, latencies: list[float] | None = None
) -> Throughput:
    """``rocketmq.Producer.send`` from ``producers`` threads for ``seconds`` (blocking; run in a
    thread); given ``latencies``, each send's duration (seconds) is appended to it."""
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    topic = f"bench-official-{next(_names)}"
    server.create_topic(topic, queues=QUEUES)
    # The client's request_timeout must be an int (a float breaks its route query).
    configuration = ClientConfiguration(
        server.grpc, Credentials(), request_timeout=int(RPC_TIMEOUT)
    )
    producer = Producer(configuration, (topic,))
    producer.startup()
    payload = body(0, BODY_SIZE)
    counts = [0] * producers
    errors: list[BaseException] = []
    stop_at = time.monotonic() + seconds

    def sender(index: int) -> None:
        try:
            while time.monotonic() < stop_at:
                message = Message()
                message.topic = topic
                message.body = payload
                sent = time.perf_counter()
                producer.send(message)
                if latencies is not None:
                    latencies.append(time.perf_counter() - sent)  # list.append is atomic
                counts[index] += 1
        except BaseException as exc:  # noqa: BLE001 - reported after the join
            errors.append(exc)

    try:
        # Warm the route and the channel before the clock starts.
        warm = Message()
        warm.topic, warm.body = topic, payload
        producer.send(warm)
        threads = [
            threading.Thread(target=sender, args=(i,), daemon=True) for i in range(producers)
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
    finally:
        producer.shutdown()
    if errors:
        raise errors[0]
    return Throughput(sum(counts), elapsed)
