"""Half messages bound to a database transaction: rollback, commit, an early check, a producer
crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, func, insert, select

from halfmoon.client import (
    Message,
    MessageSelector,
    SyncSimpleConsumer,
    SyncTransactionProducer,
    TransactionResolution,
)
from halfmoon.outbox.checker import TransactionLogChecker, cleanup_transaction_log
from halfmoon.outbox.txlog import (
    TXLOG_ID_PROPERTY,
    TransactionalSender,
    TransactionLog,
    TransactionLogError,
)
from tests.outbox import toolkit_support
from tests.server.conftest import ROOT, ServerProcess, wait_until

engine, prefix, txn_server = (
    toolkit_support.engine,
    toolkit_support.prefix,
    toolkit_support.txn_server,
)


def orders_table(metadata: MetaData, prefix: str) -> Table:
    return Table(
        f"{prefix}orders",
        metadata,
        Column("id", String(64), primary_key=True),
        Column("qty", Integer, nullable=False),
    )


def setup(engine: Engine, prefix: str) -> tuple[TransactionLog, Table]:
    log = TransactionLog(table_prefix=prefix)
    orders = orders_table(log.metadata, prefix)
    log.metadata.create_all(engine)
    return log, orders


def drain(consumer: SyncSimpleConsumer, until: set[bytes], settle: float) -> list[bytes]:
    """Receive (and ack) until every body in ``until`` arrived, then keep listening ``settle``
    seconds."""
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while not until <= set(got):
        assert time.monotonic() < deadline, f"timed out waiting for {until - set(got)}; got {got}"
        for m in consumer.receive(32, 20, wait=0.5):
            consumer.ack(m)
            got.append(m.body)
    quiet_until = time.monotonic() + settle
    while time.monotonic() < quiet_until:
        for m in consumer.receive(32, 20, wait=0.3):
            consumer.ack(m)
            got.append(m.body)
    return got


def test_rollback_never_visible_commit_visible_once(
    engine: Engine, prefix: str, txn_server: ServerProcess
) -> None:
    log, orders = setup(engine, prefix)
    topic, group, pgroup = f"{prefix}orders", f"{prefix}reader", f"{prefix}producer"
    txn_server.create_topic(topic, message_type="transaction")
    txn_server.create_group(group)
    checker = TransactionLogChecker(engine, log, lock_timeout=2)
    try:
        with (
            SyncTransactionProducer(txn_server.grpc, pgroup, checker, topics=[topic]) as producer,
            SyncSimpleConsumer(txn_server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            sender = TransactionalSender(producer, log)
            with (
                pytest.raises(RuntimeError, match="payment declined"),
                sender.transaction(engine) as tx,
            ):
                tx.conn.execute(insert(orders).values(id="o-rolled-back", qty=1))
                receipt = tx.send(Message(topic, b"rolled-back", keys=["o-rolled-back"]))
                assert receipt.transaction_id
                raise RuntimeError("payment declined")
            assert tx.outcome == "rolled_back"
            with sender.transaction(engine) as tx:
                tx.conn.execute(insert(orders).values(id="o-committed", qty=2))
                tx.send(Message(topic, b"committed", keys=["o-committed"]))
            assert tx.outcome == "committed"
            # Several check intervals pass while we listen: nothing but the commit shows up, once.
            assert drain(consumer, {b"committed"}, settle=1.5) == [b"committed"]
        with engine.connect() as conn:
            assert conn.execute(select(orders.c.id)).scalars().all() == ["o-committed"]
            rows = conn.execute(select(log.table.c.topic, log.table.c.message_keys)).all()
            assert [tuple(r) for r in rows] == [(topic, "o-committed")]
    finally:
        log.metadata.drop_all(engine)


def test_sender_refuses_a_savepoint_and_the_wrong_producer_kind(
    engine: Engine, prefix: str, txn_server: ServerProcess
) -> None:
    log = TransactionLog(table_prefix=prefix)
    with SyncTransactionProducer(txn_server.grpc, f"{prefix}p") as producer:
        sender = TransactionalSender(producer, log)
        with (
            engine.connect() as conn,
            conn.begin_nested(),
            pytest.raises(TransactionLogError, match="SAVEPOINT"),
            sender.transaction(conn),
        ):
            pass

        async def wrong_kind() -> None:
            async with sender.atransaction(engine):
                pass

        import asyncio

        with pytest.raises(TransactionLogError, match="asyncio TransactionProducer"):
            asyncio.run(wrong_kind())


def test_check_waits_for_an_open_transaction_then_answers_right(
    engine: Engine, prefix: str
) -> None:
    log, _ = setup(engine, prefix)
    checker = TransactionLogChecker(engine, log, lock_timeout=15)
    try:
        assert checker.resolve("never-written") is TransactionResolution.ROLLBACK
        for outcome in ("commit", "rollback"):
            log_id = uuid.uuid4().hex
            answered = threading.Event()
            answer: list[tuple[TransactionResolution, float]] = []
            with engine.connect() as conn:
                log.record(conn, log_id, "t", ["k"])  # the open transaction holds the key

                def check(
                    log_id: str = log_id,
                    answer: list = answer,
                    answered: threading.Event = answered,
                ) -> None:
                    answer.append((checker.resolve(log_id), time.monotonic()))
                    answered.set()

                thread = threading.Thread(target=check)
                thread.start()
                # While the inserting transaction is open, no answer may come out.
                assert not answered.wait(1.0), (
                    f"the check answered {answer} while the transaction was open"
                )
                ended_at = time.monotonic()
                conn.commit() if outcome == "commit" else conn.rollback()
            assert answered.wait(20), "the check never answered after the transaction ended"
            thread.join()
            resolution, at = answer[0]
            assert at >= ended_at
            assert resolution is (
                TransactionResolution.COMMIT
                if outcome == "commit"
                else TransactionResolution.ROLLBACK
            )
            # The probe left nothing behind; a committed row is still there.
            with engine.connect() as conn:
                count = conn.execute(
                    select(func.count()).select_from(log.table).where(log.table.c.id == log_id)
                ).scalar()
            assert count == (1 if outcome == "commit" else 0)
            assert checker.resolve(log_id) is resolution
    finally:
        log.metadata.drop_all(engine)


def test_check_past_its_lock_timeout_answers_unknown(engine: Engine, prefix: str) -> None:
    log, _ = setup(engine, prefix)
    checker = TransactionLogChecker(engine, log, lock_timeout=1)
    try:
        with engine.connect() as conn:
            log.record(conn, "still-open", "t", [])
            assert checker.resolve("still-open") is TransactionResolution.UNKNOWN
            conn.commit()
        assert checker.resolve("still-open") is TransactionResolution.COMMIT
    finally:
        log.metadata.drop_all(engine)


def test_cleanup_deletes_old_rows_in_bounded_batches(engine: Engine, prefix: str) -> None:
    from datetime import timedelta

    log, _ = setup(engine, prefix)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(log.table),
                [
                    {
                        "id": f"old{i}",
                        "topic": "t",
                        "message_keys": "",
                        "producer_group": "",
                        "created_at": 1000 + i,
                    }
                    for i in range(25)
                ],
            )
            log.record(conn, "fresh", "t", [])
        assert (
            cleanup_transaction_log(
                engine, log, older_than=timedelta(hours=1), batch_size=10, max_batches=2
            )
            == 20
        )
        assert (
            cleanup_transaction_log(engine, log, older_than=timedelta(hours=1), batch_size=10) == 5
        )
        with engine.connect() as conn:
            assert conn.execute(select(log.table.c.id)).scalars().all() == ["fresh"]
    finally:
        log.metadata.drop_all(engine)


# -- a producer SIGKILLed between the database decision and EndTransaction ---------------------

CRASHING_PRODUCER = textwrap.dedent(
    """
    import asyncio, sys
    from sqlalchemy import create_engine, insert
    from halfmoon.client import Message, SyncTransactionProducer
    from halfmoon.client.transaction import Transaction
    from halfmoon.outbox.txlog import TransactionalSender, TransactionLog
    from tests.outbox.test_txlog import orders_table

    url, grpc, topic, group, prefix, outcome = sys.argv[1:7]

    async def stuck(self):
        # The database has decided; the process dies before EndTransaction goes out.
        print("DB_DECIDED", flush=True)
        await asyncio.Event().wait()

    Transaction.commit = stuck
    Transaction.rollback = stuck
    engine = create_engine(url)
    log = TransactionLog(table_prefix=prefix)
    orders = orders_table(log.metadata, prefix)
    with SyncTransactionProducer(grpc, group, topics=[topic]) as producer:
        sender = TransactionalSender(producer, log)
        try:
            with sender.transaction(engine) as tx:
                tx.conn.execute(insert(orders).values(id="o-" + outcome, qty=1))
                tx.send(Message(topic, outcome.encode(), keys=["o-" + outcome]))
                print("HALF_SENT", flush=True)
                if outcome == "rollback":
                    raise RuntimeError("local failure")
        except RuntimeError:
            pass
    """
)


def run_until_decided_then_kill(
    url: str, server: ServerProcess, topic: str, group: str, prefix: str, outcome: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_PRODUCER, url, server.grpc, topic, group, prefix, outcome],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == "DB_DECIDED" or time.monotonic() > deadline:
                break
        assert lines[-1:] == ["DB_DECIDED"], (
            "producer did not reach its decision: "
            f"{lines}\n{proc.stderr.read() if proc.poll() is not None else ''}"
        )
        assert "HALF_SENT" in lines
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def test_producer_killed_between_db_decision_and_end_transaction_is_settled_by_check(
    engine: Engine, prefix: str, txn_server: ServerProcess
) -> None:
    log, orders = setup(engine, prefix)
    topic, group, pgroup = f"{prefix}crash", f"{prefix}reader", f"{prefix}producer"
    txn_server.create_topic(topic, message_type="transaction")
    txn_server.create_group(group)
    url = engine.url.render_as_string(hide_password=False)
    try:
        run_until_decided_then_kill(url, txn_server, topic, pgroup, prefix, "commit")
        run_until_decided_then_kill(url, txn_server, topic, pgroup, prefix, "rollback")
        with engine.connect() as conn:
            assert conn.execute(select(orders.c.id)).scalars().all() == ["o-commit"]
        # A new process of the same producer group answers the broker's checks from the table.
        checker = TransactionLogChecker(engine, log, lock_timeout=2)
        with (
            SyncTransactionProducer(txn_server.grpc, pgroup, checker, topics=[topic]),
            SyncSimpleConsumer(txn_server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            wait_until(
                lambda: (
                    checker.answers[TransactionResolution.ROLLBACK] >= 1
                    and checker.answers[TransactionResolution.COMMIT] >= 1
                ),
                20,
                "checks for both crashed transactions",
            )
            assert drain(consumer, {b"commit"}, settle=1.0) == [b"commit"]
    finally:
        log.metadata.drop_all(engine)


def test_log_id_travels_in_the_message(
    engine: Engine, prefix: str, txn_server: ServerProcess
) -> None:
    log, _ = setup(engine, prefix)
    topic, group = f"{prefix}id", f"{prefix}reader"
    txn_server.create_topic(topic, message_type="transaction")
    txn_server.create_group(group)
    try:
        with (
            SyncTransactionProducer(
                txn_server.grpc, f"{prefix}p", TransactionLogChecker(engine, log), topics=[topic]
            ) as producer,
            SyncSimpleConsumer(txn_server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            with TransactionalSender(producer, log).transaction(engine) as tx:
                tx.send(Message(topic, b"a"))
                tx.send(Message(topic, b"b"))
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                for m in consumer.receive(8, 20, wait=0.5):
                    consumer.ack(m)
                    got.append(m)
            assert sorted(m.properties[TXLOG_ID_PROPERTY] for m in got) == sorted(tx.log_ids)
    finally:
        log.metadata.drop_all(engine)
