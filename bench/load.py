"""Load shapes shared by the endpoint benchmark's systems (halfmoon over gRPC, RabbitMQ).

Each system implements the same few operations (see :class:`EndpointPeer`)
on top of these drivers, so both see exactly the same load: the same body
sizes, the same number of concurrent producers, the same batch shape, the
same clock (``time.perf_counter`` in this one process).
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

BODY_SIZE = 1024
# Latency runs send this many untimed messages first (connections, caches, the JIT-less
# first calls of every code path), so a sample is steady-state behaviour.
LATENCY_WARMUP = 20
_SEQ = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Throughput:
    """``messages`` moved (and confirmed) in ``seconds``."""

    messages: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def body(seq: int, size: int = BODY_SIZE) -> bytes:
    """A ``size``-byte body whose first 8 bytes carry ``seq`` (so a consumer can match it)."""
    return _SEQ.pack(seq) + os.urandom(size - _SEQ.size)


def seq_of(payload: bytes) -> int:
    return int(_SEQ.unpack_from(payload)[0])


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of ``samples``."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


async def timed_producers(
    producers: int,
    seconds: float,
    send_round: Callable[[int], Awaitable[int]],
    latencies: list[float] | None = None,
) -> Throughput:
    """Run ``producers`` concurrent loops of ``send_round(producer_index)`` for ``seconds``.

    ``send_round`` sends one request (or one batch) and returns how many
    messages the system confirmed. The clock stops when the last in-flight
    round is confirmed, so nothing is counted that was not acknowledged.
    Given ``latencies``, each round's duration (seconds) is appended to it.
    """
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    counts = [0] * producers

    async def producer(index: int) -> None:
        while loop.time() < stop_at:
            sent = time.perf_counter()
            counts[index] += await send_round(index)
            if latencies is not None:
                latencies.append(time.perf_counter() - sent)

    started = time.perf_counter()
    await asyncio.gather(*(producer(i) for i in range(producers)))
    return Throughput(sum(counts), time.perf_counter() - started)


async def sequential_latencies(
    count: int, send_one: Callable[[int], Awaitable[object]]
) -> list[float]:
    """Seconds each of ``count`` sequential ``send_one(seq)`` calls took (one in flight)."""
    samples = []
    for seq in range(LATENCY_WARMUP + count):
        started = time.perf_counter()
        await send_one(seq)
        samples.append(time.perf_counter() - started)
    return samples[LATENCY_WARMUP:]


class Arrivals:
    """Send time → receive time on one clock: the consumer calls :meth:`arrived` with a seq."""

    def __init__(self) -> None:
        self._waiting: dict[int, asyncio.Future[float]] = {}

    def expect(self, seq: int) -> asyncio.Future[float]:
        future = asyncio.get_running_loop().create_future()
        self._waiting[seq] = future
        return future

    def arrived(self, seq: int) -> None:
        future = self._waiting.pop(seq, None)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())


async def end_to_end_latencies(
    count: int,
    arrivals: Arrivals,
    send_one: Callable[[int], Awaitable[object]],
    timeout: float = 10.0,
    settle: float = 0.0,
) -> list[float]:
    """Send ``count`` messages one at a time; each sample is send start → consumer saw it.

    The next message goes out only after the previous one arrived, so the
    samples are latency, not queueing behind a backlog; ``settle`` seconds
    after it (outside the sample) when given: the producer idle before each send.
    """
    samples = []
    for seq in range(LATENCY_WARMUP + count):
        if settle:
            await asyncio.sleep(settle)
        received = arrivals.expect(seq)
        started = time.perf_counter()
        await send_one(seq)
        samples.append(await asyncio.wait_for(received, timeout) - started)
    return samples[LATENCY_WARMUP:]


class EndpointPeer(Protocol):
    """What each benchmarked system implements (all bodies are :data:`BODY_SIZE` bytes)."""

    name: str

    async def produce(
        self, producers: int, batch: int, seconds: float, latencies: list[float] | None = None
    ) -> Throughput: ...

    async def send_latencies(self, count: int) -> list[float]: ...

    async def end_to_end_latencies(self, count: int) -> list[float]: ...

    async def consume(self, messages: int, consumers: int) -> Throughput: ...

    def server_cpu(self) -> float | None:
        """CPU seconds the system's server process has used so far (None: not measurable)."""
        ...

    async def close(self) -> None: ...


_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process ``pid`` (every thread) so far, from /proc; None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def find_process(command: str) -> int | None:
    """The pid of a local process whose command name is ``command`` (e.g. RabbitMQ's
    ``beam.smp``), or None: the peer may run elsewhere."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == command:
                    return int(entry.name)
            except OSError:
                continue
    return None


def machine_info() -> dict[str, Any]:
    """What a results table needs to say about where it was measured."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": " ".join(f"{x:.2f}" for x in load),
    }
