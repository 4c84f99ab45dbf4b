"""Fixtures for the transaction-log, inbox, compensation and saga tests, on top of ``conftest.py``.

``conftest.py`` (shared by the toolkit's tests) gives ``db_url`` over the three
databases, with the skip/CI-failure rule, ``table_prefix`` and ``amqp_url``;
this module turns them into an ``engine`` and adds a server whose
transaction checks come fast.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine

from tests.server.conftest import ServerProcess

# Checks come fast so a crashed producer's half message is settled within a test's patience.
FAST_CHECKS = ("transaction.check_interval_ms=300", "transaction.timeout_ms=300")


def open_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # A 30 s busy timeout: SQLite writers queue on the database lock.
        return create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    return create_engine(url, pool_pre_ping=True)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on each of the three databases (``db_url`` is parametrized)."""
    eng = open_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def prefix(table_prefix: str) -> str:
    """This test's own table prefix."""
    return table_prefix


@pytest.fixture(scope="module")
def txn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server whose transaction checks run every 300 ms."""
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-txlog"), settings=FAST_CHECKS).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()
