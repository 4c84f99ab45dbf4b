"""Shared fixtures for the database toolkit tests: databases, RabbitMQ, a halfmoon server.

- ``db_url``: parametrized over sqlite (a file in the test's tmp dir),
  postgresql (``HALFMOON_TEST_POSTGRES``) and mariadb (``HALFMOON_TEST_MARIADB``);
- ``amqp_url``: RabbitMQ (``HALFMOON_TEST_AMQP``);
- ``halfmoon_server``: a real ``halfmoon serve`` (module scope, topics auto-created).

An unreachable server is a skip with the reason, except under ``CI=true``,
where it is a failure: CI must not pass by skipping. Every test gets its own
random ``table_prefix`` so runs sharing a database never meet.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from urllib.parse import urlsplit

import pytest
from sqlalchemy import create_engine, text

from halfmoon.outbox.outbox import Outbox, OutboxRecord
from halfmoon.outbox.targets import PublishTarget
from tests.server.conftest import ServerProcess, wait_until

POSTGRES_URL = os.environ.get(
    "HALFMOON_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MARIADB_URL = os.environ.get("HALFMOON_TEST_MARIADB", "mysql+pymysql://root@127.0.0.1:3306/test")
AMQP_URL = os.environ.get("HALFMOON_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
IN_CI = os.environ.get("CI", "").lower() == "true"

__all__ = ["RecordingTarget", "ServerProcess", "require", "wait_until"]

_reachable: dict[str, str | None] = {}


def require(name: str, check: Callable[[], None]) -> None:
    """Skip (or, under CI=true, fail) when ``check`` raises; the result is cached per session."""
    if name not in _reachable:
        try:
            check()
            _reachable[name] = None
        except Exception as exc:  # noqa: BLE001 — any failure means "not available"
            _reachable[name] = f"{type(exc).__name__}: {exc}"
    reason = _reachable[name]
    if reason is not None:
        message = (
            f"{name} is not reachable ({reason}); set the HALFMOON_TEST_* variables or start it"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def _tcp(url: str, default_port: int) -> None:
    parts = urlsplit(url)
    with socket.create_connection(
        (parts.hostname or "127.0.0.1", parts.port or default_port), timeout=2
    ):
        pass


def _database(url: str, port: int) -> Callable[[], None]:
    def check() -> None:
        _tcp(url, port)
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()

    return check


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:  # noqa: ANN001
    """A database URL: sqlite (file), postgresql or mariadb."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'toolkit.db'}"
    if request.param == "postgresql":
        require("PostgreSQL", _database(POSTGRES_URL, 5432))
        return POSTGRES_URL
    require("MariaDB", _database(MARIADB_URL, 3306))
    return MARIADB_URL


@pytest.fixture
def table_prefix() -> str:
    """A prefix no other test run uses."""
    return f"t{uuid.uuid4().hex[:10]}_"


@pytest.fixture
def outbox(db_url: str, table_prefix: str) -> Iterator[Outbox]:
    """An outbox with its tables created (and dropped afterwards)."""
    box = Outbox(db_url, table_prefix=table_prefix)
    box.create_tables()
    try:
        yield box
    finally:
        box.drop_tables()
        box.engine.dispose()


@pytest.fixture
def amqp_url() -> str:
    def check() -> None:
        _tcp(AMQP_URL, 5672)

    require("RabbitMQ", check)
    return AMQP_URL


@pytest.fixture(scope="module")
def halfmoon_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One ``halfmoon serve`` per test module, auto-creating topics."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-data"), settings=("broker.auto_create_topics=true",)
    ).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


class RecordingTarget(PublishTarget):
    """An in-process target: records what was published, in order; fails chosen messages.

    ``fail`` maps a message id to how many more publishes of it fail (``-1``: always).
    """

    name = "recording"

    def __init__(self) -> None:
        self.published: list[OutboxRecord] = []
        self.attempts: dict[str, int] = {}
        self.fail: dict[str, int] = {}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def publish(self, records: Sequence[OutboxRecord]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        with self.lock:
            for record in records:
                self.attempts[record.message_id] = self.attempts.get(record.message_id, 0) + 1
                left = self.fail.get(record.message_id, 0)
                if left != 0:
                    self.fail[record.message_id] = left - 1 if left > 0 else left
                    results.append(RuntimeError(f"refused {record.message_id}"))
                    continue
                self.published.append(record)
                results.append(None)
            self.changed.notify_all()
        return results

    def ids(self) -> list[str]:
        with self.lock:
            return [r.message_id for r in self.published]
