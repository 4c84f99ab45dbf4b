"""EndTransactions arriving together are decided together (one append), each answered alone."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import Future

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.facade_types import ALREADY_DURABLE, Answer, Pending, Written
from halfmoon.broker.message import MessageType
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import EndRequest, EndResult, TransactionAlreadyEnded
from halfmoon.errors import HalfmoonError
from halfmoon.server.end_batching import EndBatcher
from tests.server.inprocess import InProcess, run

TOPIC = "txn-orders"


async def halves(endpoint: InProcess, count: int) -> list[svc.SendResultEntry]:
    messages = [
        pb.Message(
            topic=pb.Resource(name=TOPIC),
            body=f"m{i}".encode(),
            system_properties=pb.SystemProperties(
                message_id=uuid.uuid4().hex, message_type=pb.MessageType.TRANSACTION
            ),
        )
        for i in range(count)
    ]
    answer = await endpoint.stub.SendMessage(svc.SendMessageRequest(messages=messages))
    assert answer.status.code == pb.Code.OK, answer.status.message
    return list(answer.entries)


def end(
    entry: svc.SendResultEntry, resolution: int, transaction_id: str = ""
) -> svc.EndTransactionRequest:
    return svc.EndTransactionRequest(
        topic=pb.Resource(name=TOPIC),
        message_id=entry.message_id,
        transaction_id=transaction_id or entry.transaction_id,
        resolution=resolution,
        source=pb.TransactionSource.SOURCE_SERVER_CHECK,
    )


def counting_appends(endpoint: InProcess) -> list[int]:
    """Wrap the store's append: the list holds one count per append call."""
    store = endpoint.broker.store
    calls: list[int] = []
    append = store.append

    def counted(messages):  # type: ignore[no-untyped-def]
        calls.append(len(messages))
        return append(messages)

    store.append = counted  # type: ignore[method-assign]
    return calls


class SlowDisk:
    """Makes the in-memory store's ``durable`` futures complete a few ms later, from a thread, as
    a sync flush's fsync does: decisions that arrive meanwhile queue up for one append."""

    def __init__(self, endpoint: InProcess, fsync_s: float = 0.003) -> None:
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._fsync_s = fsync_s
        endpoint.broker.store.durable = self.durable  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def durable(self, end_offset: int) -> Future[None]:
        future: Future[None] = Future()
        with self._lock:
            self._pending.append(future)
        return future

    def _run(self) -> None:
        while not self._stop.wait(self._fsync_s):  # one "fsync" per period, for all waiters
            with self._lock:
                done, self._pending = self._pending, []
            for future in done:
                future.set_result(None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def test_concurrent_end_transactions_share_appends() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_topic(TOPIC, MessageType.TRANSACTION, queue_count=2)
        entries = await halves(endpoint, 200)
        appends = counting_appends(endpoint)
        disk = SlowDisk(endpoint)
        answers = await asyncio.gather(
            *(
                endpoint.stub.EndTransaction(
                    end(
                        e,
                        pb.TransactionResolution.COMMIT
                        if i % 4
                        else pb.TransactionResolution.ROLLBACK,
                    )
                )
                for i, e in enumerate(entries)
            )
        )
        disk.close()
        assert all(a.status.code == pb.Code.OK for a in answers), answers
        stats = endpoint.broker.transaction_stats()
        assert (stats.pending, stats.committed_total, stats.rolled_back_total) == (0, 150, 50)
        assert sum(s.max_offset for s in endpoint.broker.topic_status(TOPIC)) == 150
        # While one batch waited for its "fsync" the next ones queued: one append per batch.
        assert sum(appends) == 200 and len(appends) < 100, appends

    run(scenario)


def test_a_bad_end_transaction_fails_alone_in_its_batch() -> None:
    async def scenario(endpoint: InProcess) -> None:
        endpoint.broker.create_topic(TOPIC, MessageType.TRANSACTION, queue_count=2)
        first, good, rolled, other = await halves(endpoint, 4)
        await endpoint.stub.EndTransaction(end(rolled, pb.TransactionResolution.ROLLBACK))
        appends = counting_appends(endpoint)
        disk = SlowDisk(endpoint, fsync_s=0.3)
        # The first decision goes alone; the others arrive while it waits for its fsync.
        opening = asyncio.ensure_future(
            endpoint.stub.EndTransaction(end(first, pb.TransactionResolution.COMMIT))
        )
        deadline = asyncio.get_running_loop().time() + 10
        while not appends:
            assert asyncio.get_running_loop().time() < deadline, "the first decision never came"
            await asyncio.sleep(0.001)
        answers = await asyncio.gather(
            endpoint.stub.EndTransaction(end(good, pb.TransactionResolution.COMMIT)),
            endpoint.stub.EndTransaction(
                end(good, pb.TransactionResolution.COMMIT, transaction_id="T" + "0" * 24)
            ),
            endpoint.stub.EndTransaction(end(rolled, pb.TransactionResolution.COMMIT)),
            endpoint.stub.EndTransaction(end(other, pb.TransactionResolution.ROLLBACK)),
        )
        assert (await opening).status.code == pb.Code.OK
        disk.close()
        codes = [a.status.code for a in answers]
        assert codes == [
            pb.Code.OK,
            pb.Code.INVALID_TRANSACTION_ID,  # no such transaction
            pb.Code.BAD_REQUEST,  # rolled back already
            pb.Code.OK,
        ], answers
        assert appends == [1, 2]  # the good commit and the rollback shared one append
        assert sum(s.max_offset for s in endpoint.broker.topic_status(TOPIC)) == 2
        assert endpoint.broker.list_transactions() == []

    run(scenario)


def test_a_decision_left_pending_is_written_off_the_loop_and_holds_up_no_batch() -> None:
    """The broker answers a decision it cannot make at once (an index lookup, a network hop)
    with a Pending: the batcher writes it on a worker thread by itself, and the decisions
    beside it, and the batches after it, are answered meanwhile."""

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        written_on: list[int] = []
        release = threading.Event()

        def lookup() -> Written[EndResult]:
            written_on.append(threading.get_ident())
            assert release.wait(10)
            return Written(EndResult(TxnState.COMMITTED, 0, True), ALREADY_DURABLE)

        def refused() -> Written[EndResult]:
            raise TransactionAlreadyEnded("TRANSACTION_ALREADY_ENDED: rolled back")

        batches: list[list[str]] = []

        def end_many(requests: Sequence[EndRequest]) -> list[Answer[EndResult] | HalfmoonError]:
            batches.append([r.transaction_id for r in requests])
            pending = {"old": Pending(lookup), "gone": Pending(refused)}
            return [
                pending.get(r.transaction_id)
                or Written(EndResult(TxnState.ROLLED_BACK, 0, True), ALREADY_DURABLE)
                for r in requests
            ]

        batcher = EndBatcher(end_many)
        old = batcher.end(EndRequest("old", "commit"))
        gone = batcher.end(EndRequest("gone", "commit"))
        beside = await batcher.end(EndRequest("beside", "rollback"))
        assert beside.result.state is TxnState.ROLLED_BACK and not old.done()
        after = await batcher.end(EndRequest("after", "rollback"))  # a batch of its own
        assert after.result.state is TxnState.ROLLED_BACK and not old.done()
        assert batches == [["old", "gone", "beside"], ["after"]]
        with pytest.raises(TransactionAlreadyEnded):
            await gone
        release.set()
        assert (await old).result.state is TxnState.COMMITTED
        assert written_on and written_on[0] != loop_thread

    asyncio.run(asyncio.wait_for(scenario(), 20))
