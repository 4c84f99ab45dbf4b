"""Database engines and a transaction-ready server for the transaction-log, inbox, compensation and saga tests.

The database URLs and the CI rule (unreachable server: a failure under
``CI=true``, a skip otherwise) follow ``tests/outbox/conftest.py``'s
convention; every test gets its own random table prefix so concurrent runs
on the same databases never meet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from tests.server.conftest import ServerProcess

DATABASES = {
    "postgresql": ("HALFMOON_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    "mariadb": ("HALFMOON_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
AMQP = ("HALFMOON_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")

# Checks come fast so a crashed producer's half message is settled within a test's patience.
FAST_CHECKS = ("transaction.check_interval_ms=300", "transaction.timeout_ms=300")


def unavailable(what: str, exc: BaseException) -> None:
    """Skip (or fail under CI=true) because ``what`` cannot be reached."""
    reason = f"{what} is not reachable ({type(exc).__name__}: {exc}); set its HALFMOON_TEST_* URL to run this test"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def database_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'app.db'}"
    env, default = DATABASES[kind]
    return os.environ.get(env, default)


def open_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # A 30 s busy timeout: SQLite writers queue on the database lock.
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    else:
        engine = create_engine(url, pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001
        engine.dispose()
        unavailable(url.split("://")[0], exc)
    return engine


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on each of the three databases."""
    eng = open_engine(database_url(request.param, tmp_path))
    yield eng
    eng.dispose()


@pytest.fixture
def prefix() -> str:
    """A table prefix of this test's own."""
    return f"t{uuid.uuid4().hex[:10]}_"


@pytest.fixture(scope="module")
def txn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose transaction checks run every 300 ms."""
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-txlog"), settings=FAST_CHECKS).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def amqp_url() -> str:
    return os.environ.get(AMQP[0], AMQP[1])
