"""``halfmoon spark audit`` on SQLite and PostgreSQL: planted lost, phantom and duplicate
messages are found (and the command exits 1); a consistent table and topic pass.

PostgreSQL comes from ``HALFMOON_TEST_POSTGRES``; when it is unreachable the
test is skipped, except under ``CI=true`` where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from halfmoon.client import Message, SyncProducer
from halfmoon.spark.jobs.audit import AuditError, AuditSpec, run_audit
from tests.server.conftest import ROOT

POSTGRES_URL = os.environ.get(
    "HALFMOON_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _postgres() -> str:
    try:
        engine = sa.create_engine(POSTGRES_URL)
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not here"
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {POSTGRES_URL} is unreachable under CI: {exc}")
        pytest.skip(f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}")
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    return _postgres()


def _plant(server, url: str, *, clean: bool) -> tuple[str, str]:
    """A table of 40 orders and a topic of their messages; unless ``clean``, 3 kinds of damage."""
    suffix = uuid.uuid4().hex[:8]
    table, topic = f"orders_{suffix}", f"orders-{suffix}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, order_key VARCHAR(40) NOT NULL)"
            )
        )
        connection.execute(
            sa.text(f"INSERT INTO {table} (id, order_key) VALUES (:id, :key)"),
            [{"id": i, "key": f"order-{i}"} for i in range(1, 41)],
        )
    engine.dispose()
    keys = [f"order-{i}" for i in range(1, 41)]
    if not clean:
        keys.remove("order-7")  # lost: a row without a message
        keys += ["order-99", "order-12"]  # a phantom, and a duplicate of order-12
    server.create_topic(topic, queues=2)
    with SyncProducer(server.grpc) as producer:
        producer.send_batch([Message(topic, b"{}", keys=[key]) for key in keys])
    return table, topic


def test_audit_finds_planted_inconsistencies_and_passes_a_clean_run(
    spark, server, database: str
) -> None:
    table, topic = _plant(server, database, clean=False)
    report = run_audit(
        spark,
        AuditSpec(database, table, "order_key", server.grpc, topic, primary_key="id", partitions=3),
    )
    assert not report.consistent
    assert (report.rows, report.messages) == (40, 41)
    assert (report.lost, report.phantom, report.duplicate) == (1, 1, 1)
    assert report.samples == {
        "lost": ["order-7"],
        "phantom": ["order-99"],
        "duplicate": ["order-12"],
    }

    table, topic = _plant(server, database, clean=True)
    report = run_audit(
        spark,
        AuditSpec(database, table, "order_key", server.grpc, topic, primary_key="id", partitions=3),
    )
    assert report.consistent, report.text()
    assert (report.rows, report.messages) == (40, 40)


def test_audit_command_exits_non_zero_when_inconsistent(server, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    table, topic = _plant(server, url, clean=False)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "halfmoon",
            "spark",
            "audit",
            "--endpoint",
            server.grpc,
            "--master",
            "local[1]",
            "--database",
            url,
            "--table",
            table,
            "--key-column",
            "order_key",
            "--primary-key",
            "id",
            topic,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "INCONSISTENT" in result.stdout and "order-7" in result.stdout


def test_audit_of_a_missing_table_says_which(spark, server, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(AuditError, match="no_such_table"):
        run_audit(spark, AuditSpec(url, "no_such_table", "k", server.grpc, "any"))
    with pytest.raises(AuditError, match="plain SQL name"):
        run_audit(spark, AuditSpec(url, "t; DROP TABLE x", "k", server.grpc, "any"))
