"""What the transactional messages benchmark's scenarios share (:mod:`bench.txn_bench`):
its constants and settings, a raw-protocol client, and the result types."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from bench import rawstub
from bench.load import (
    percentile,
)
from bench.rawstub import check_status
from bench.server_proc import Flush, HalfmoonServer

PRODUCERS = 16
QUEUES = 8
ORPHAN_BATCH = 256  # half messages per SendMessageRequest when planting orphans
ORPHAN_SENDERS = 4  # concurrent planting requests
CHECK_WORKERS = 64  # concurrent check answers in the TransactionProducer (its default is 4)
LONG_POLL_SECONDS = 5.0
RPC_TIMEOUT = 30.0
LATENCY_WARMUP = 20
STATUS_POLL_SECONDS = 0.05

# The targets of issue 4.
TXN_RATIO_GOAL = 0.5
VISIBLE_P99_MS = 5.0
# The target of issue 15: orphans resolved in at most this many times the producer's answer time.
ORPHAN_RATIO_GOAL = 1.2

names = itertools.count()


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float  # per throughput turn
    rounds: int  # alternating plain / transactional turns
    latency_count: int  # timed commits in the commit-to-visible run
    orphans: int  # half messages left undecided
    timeout_ms: int = 1_000
    check_interval_ms: int = 2_000
    flushes: tuple[Flush, ...] = ("sync", "async")
    orphan_flushes: tuple[Flush, ...] = ("sync",)
    resolve_timeout: float = 120.0  # seconds after the checking producer starts before giving up
    orphans_only: bool = False  # skip the throughput and latency scenarios


# The full run waits up to 10 minutes for 100,000 orphans: at the check rate measured on
# 2 cores (about 400/s, see docs/benchmarks.md) they need about 4 of them.
FULL = Settings(seconds=3.0, rounds=2, latency_count=1000, orphans=100_000, resolve_timeout=600.0)
QUICK = Settings(seconds=1.0, rounds=1, latency_count=200, orphans=2_000)


# -- raw protocol client -------------------------------------------------------------


class RawClient:
    """The protocol stubs on one channel, the requests the official clients send."""

    def __init__(self, target: str, name: str) -> None:
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = service_pb2_grpc.MessagingServiceStub(self._channel)
        self._metadata = (
            ("x-mq-client-id", f"txnbench@{os.getpid()}@{name}"),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.1.2"),
        )
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid():08X}{int(time.time()) & 0xFFFFFFFF:08X}{next(names):04X}"

    async def close(self) -> None:
        await self._channel.close()

    def message(self, topic: str, payload: bytes, *, transactional: bool) -> pb.Message:
        message = pb.Message(topic=pb.Resource(name=topic), body=payload)
        sp = message.system_properties
        sp.message_id = f"{self._id_prefix}{next(self._ids):012X}"
        sp.message_type = pb.MessageType.TRANSACTION if transactional else pb.MessageType.NORMAL
        sp.body_encoding = pb.Encoding.IDENTITY
        sp.born_host = "127.0.0.1"
        sp.born_timestamp.seconds = int(time.time())
        return message

    async def send(self, messages: list[pb.Message]) -> list[svc.SendResultEntry]:
        response = await self._stub.SendMessage(
            svc.SendMessageRequest(messages=messages), metadata=self._metadata, timeout=RPC_TIMEOUT
        )
        check_status(response.status, "SendMessage")
        return list(response.entries)

    async def commit(self, topic: str, entry: svc.SendResultEntry) -> None:
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=entry.message_id,
            transaction_id=entry.transaction_id,
            resolution=pb.TransactionResolution.COMMIT,
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        response = await self._stub.EndTransaction(
            request, metadata=self._metadata, timeout=RPC_TIMEOUT
        )
        check_status(response.status, "EndTransaction")

    async def receive(self, group: str, topic: str) -> list[pb.Message]:
        return await rawstub.receive(
            self._stub, self._metadata, group, topic, batch=32, invisible_seconds=30,
            long_poll=LONG_POLL_SECONDS, rpc_timeout=RPC_TIMEOUT,
        )  # fmt: skip

    async def ack(self, group: str, topic: str, messages: list[pb.Message]) -> None:
        await rawstub.ack(
            self._stub, self._metadata, group, topic, messages, rpc_timeout=RPC_TIMEOUT
        )


def fresh_topic(server: HalfmoonServer, what: str, message_type: str) -> str:
    topic = f"txnbench-{what}-{next(names)}"
    server.create_topic(topic, queues=QUEUES, message_type=message_type)
    return topic


# -- results ---------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """One scenario on one server: throughput, latency samples (seconds) or orphan resolution."""

    key: str
    scenario: str
    system: str  # "halfmoon sync" / "halfmoon async"
    messages: int = 0
    seconds: float = 0.0
    samples: list[float] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def p(self, q: float) -> float:
        return percentile(self.samples, q) * 1000

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "scenario": self.scenario, "system": self.system}
        if self.samples:
            d.update(
                count=len(self.samples),
                p50_ms=self.p(0.5),
                p99_ms=self.p(0.99),
                max_ms=max(self.samples) * 1000,
            )
        else:
            d.update(messages=self.messages, seconds=self.seconds, msgs_per_s=self.per_second)
        return {**d, **self.extra}


@dataclass(slots=True)
class Target:
    name: str
    measured: float
    goal: float
    unit: str
    at_most: bool

    @property
    def passed(self) -> bool:
        return self.measured <= self.goal if self.at_most else self.measured >= self.goal


@dataclass(slots=True)
class Report:
    results: list[Result] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, system: str) -> Result | None:
        return next((r for r in self.results if r.key == key and r.system == system), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "results": [r.to_json() for r in self.results],
            "targets": [{**asdict(t), "passed": t.passed} for t in self.targets],
        }


Log = Callable[[str], None]


def committed_count(server: HalfmoonServer, topic: str) -> int:
    status = server.admin_call("GET", f"/v1/topics/{topic}/status")
    assert isinstance(status, dict)
    return sum(int(q["max_offset"]) - int(q["min_offset"]) for q in status["queues"])


def pending_count(server: HalfmoonServer) -> int:
    status = server.admin_call("GET", "/v1/broker/status")
    assert isinstance(status, dict)
    return int(status.get("pending_transactions") or 0)
