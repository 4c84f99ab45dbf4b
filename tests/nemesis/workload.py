"""The clients of the nemesis run: producers of plain, FIFO and transactional messages and of
transaction groups, and consumers draining every topic, all recording into one
:class:`~halfmoon.verify.History`.

Producers use the raw RocketMQ 5 gRPC stub, one attempt per operation through
a proxy drawn at random: a client library's retries would hide what each
attempt answered. Every send carries its key in the body; consumers
(halfmoon's own client, given both proxies) record each body they receive,
then ack it.

How an attempt's answer becomes an :class:`Outcome`: ``OK`` is ``ok``; gRPC's
``UNAVAILABLE`` before any connection was made (the request never left) is
``fail``; anything else is ``unknown``: a timeout, a lost connection, or a
server error such as ``HA_NOT_AVAILABLE``, which a master may answer after
its own log already holds the message.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.client import MessageSelector, SyncSimpleConsumer
from halfmoon.verify import Decision, History, Outcome, Send
from tests.waiting import wait_until

OP_TIMEOUT_S = 3.0
GROUP_PROPERTY = "__HM_TXN_GROUP"
NOT_SENT = ("failed to connect to all addresses", "Connection refused")


def outcome_of(code: str, details: str) -> Outcome:
    if code == "OK":
        return Outcome.OK
    if code == "UNAVAILABLE" and any(text in details for text in NOT_SENT):
        return Outcome.FAIL
    return Outcome.UNKNOWN


class Proxies:
    """One channel per proxy; each call goes through one drawn at random."""

    def __init__(self, endpoints: list[str], rng: random.Random) -> None:
        self.channels = [grpc.insecure_channel(e) for e in endpoints]
        self.stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in self.channels]
        self.rng = rng

    def call(self, method: str, request: object) -> tuple[str, str, object]:
        stub = self.rng.choice(self.stubs)
        try:
            answer = getattr(stub, method)(request, timeout=OP_TIMEOUT_S)
        except grpc.RpcError as error:
            return error.code().name, str(error.details()), None  # type: ignore[attr-defined]
        return pb.Code.Name(answer.status.code), answer.status.message, answer

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


class Producer:
    """A thread running ``step`` until stopped; every step one or more recorded operations."""

    def __init__(self, name: str, endpoints: list[str], history: History, seed: int) -> None:
        self.name = name
        self.history = history
        self.rng = random.Random(seed)
        self.proxies = Proxies(endpoints, self.rng)
        self.stopping = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def key(self) -> str:
        self.count += 1
        return f"{self.name}-{self.count}"

    def send(
        self,
        topic: str,
        kind: int,
        *,
        group: str | None = None,
        txn_group: str | None = None,
        txn: bool = False,
    ) -> tuple[Send, object]:
        key = self.key()
        message_id = uuid.uuid4().hex
        properties = {"message_id": message_id, "message_type": kind}
        if group is not None:
            properties["message_group"] = group
        message = pb.Message(
            topic=pb.Resource(name=topic),
            body=key.encode(),
            user_properties={GROUP_PROPERTY: txn_group} if txn_group else {},
            system_properties=pb.SystemProperties(**properties),  # type: ignore[arg-type]
        )
        invoked = time.time()
        code, details, answer = self.proxies.call(
            "SendMessage", svc.SendMessageRequest(messages=[message])
        )
        record = Send(
            key, outcome_of(code, details), invoked, time.time(), producer=self.name,
            message_group=group, txn=key if txn else None, txn_group=txn_group,
            message_id=message_id, error="" if code == "OK" else f"{code}: {details[:80]}",
        )  # fmt: skip
        self.history.send(record)
        return record, answer

    def end(self, request: svc.EndTransactionRequest, commit: bool, **unit: str) -> Outcome:
        invoked = time.time()
        code, details, _ = self.proxies.call("EndTransaction", request)
        outcome = outcome_of(code, details)
        self.history.decide(
            Decision(
                commit,
                outcome,
                invoked,
                time.time(),
                error="" if code == "OK" else f"{code}: {details[:80]}",
                **unit,
            )  # fmt: skip
        )
        return outcome

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.step()

    def start(self) -> Producer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.proxies.close()


class PlainProducer(Producer):
    def step(self) -> None:
        record, _ = self.send("plain", pb.MessageType.NORMAL)
        if record.outcome is not Outcome.OK:
            self.stopping.wait(0.05)  # a refusal comes at once: do not spin


class FifoProducer(Producer):
    """Sends to its own message groups in turn, one message after the other."""

    GROUPS = 3

    def step(self) -> None:
        group = f"{self.name}-g{self.count % self.GROUPS}"
        record, _ = self.send("fifo", pb.MessageType.FIFO, group=group)
        if record.outcome is not Outcome.OK:
            self.stopping.wait(0.05)


def resolution(commit: bool) -> int:
    return pb.TransactionResolution.COMMIT if commit else pb.TransactionResolution.ROLLBACK


class TransactionProducer(Producer):
    """One half message, then a commit (three times in four) or a rollback."""

    def step(self) -> None:
        record, answer = self.send("txn", pb.MessageType.TRANSACTION, txn=True)
        if record.outcome is not Outcome.OK:
            self.stopping.wait(0.05)
            return  # no transaction id to end it with: it must never be delivered
        commit = self.rng.random() < 0.75
        entry = answer.entries[0]  # type: ignore[attr-defined]
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name="txn"), message_id=entry.message_id,
            transaction_id=entry.transaction_id, resolution=resolution(commit),
            source=pb.TransactionSource.SOURCE_CLIENT,
        )  # fmt: skip
        for _ in range(3):  # an unknown end is repeated: the same decision again is a no-op
            if self.end(request, commit, txn=record.key) is Outcome.OK:
                return


class GroupProducer(Producer):
    """Three half messages of one transaction group, then the group's commit or rollback."""

    MEMBERS = 3

    def step(self) -> None:
        group = f"{self.name}-G{self.count}"
        for _ in range(self.MEMBERS):
            record, _ = self.send("txn", pb.MessageType.TRANSACTION, txn_group=group)
            if record.outcome is not Outcome.OK:
                self.stopping.wait(0.05)
        commit = self.rng.random() < 0.75
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name="txn"), transaction_id=f"hm-group:{group}",
            resolution=resolution(commit), source=pb.TransactionSource.SOURCE_CLIENT,
        )  # fmt: skip
        for _ in range(3):
            if self.end(request, commit, txn_group=group) is Outcome.OK:
                return


class Consumer:
    """Receives from one topic through both proxies, recording each body, until stopped."""

    def __init__(
        self,
        topic: str,
        endpoints: list[str],
        history: History,
        *,
        group: str | None = None,
        final: bool = False,
    ) -> None:
        self.topic = topic
        self.history = history
        self.final = final  # the final read's: its deliveries say what the store holds
        self.name = group or f"c-{topic}"
        self.stopping = threading.Event()
        self.last_delivery = time.monotonic()
        self.errors = 0
        self.last_error = ""
        self.consumer = SyncSimpleConsumer(
            ";".join(endpoints), self.name, {topic: MessageSelector.all()},
            request_timeout=OP_TIMEOUT_S,
        )  # fmt: skip
        self.thread = threading.Thread(target=self._run, name=f"consume-{topic}", daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                views = self.consumer.receive(32, 10, wait=1)
            except Exception as error:  # noqa: BLE001  # any failure of a receive: it goes on
                self.last_error = f"receive: {error!r}"
                self.errors += 1
                self.stopping.wait(0.1)
                continue
            for view in views:
                self.history.deliver(view.body.decode(), time.time(), self.name, final=self.final)
                self.last_delivery = time.monotonic()
            for view in views:
                try:
                    self.consumer.ack(view)
                except Exception as error:  # noqa: BLE001
                    self.last_error = f"ack: {error!r}"
                    self.errors += 1  # redelivered later: a duplicate, which is allowed

    def start(self) -> Consumer:
        self.consumer.start()
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.consumer.close()


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    """:func:`~tests.waiting.wait_until` that answers instead of failing: the history
    checker says afterwards what is missing, which a timeout here could not."""
    try:
        wait_until(condition, seconds, "the workload's condition", interval=0.2)
    except AssertionError:
        return False
    return True
