"""Fixtures for the Spark connector tests: real servers (the run's one SparkSession, ``spark``,
is in tests/conftest.py).

Each module gets its own ``halfmoon serve`` (module scope) from the server
tests' helper.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tests.server.conftest import ServerProcess  # noqa: E402

MARKER_TOPIC = "halfmoon-spark-commits"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data")).start()
    proc.create_topic(MARKER_TOPIC, message_type="transaction", queues=1)
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def read_topic(spark: object, server: ServerProcess, topic: str, **options: str) -> list:
    reader = spark.read.format("halfmoon").option("endpoint", server.grpc).option("topic", topic)  # type: ignore[attr-defined]
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def data_dir(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)
