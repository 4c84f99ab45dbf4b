"""Suite-wide settings and the one SparkSession of a run.

Hypothesis' per-example deadline measures wall time, which on a busy 2-core
machine says more about the neighbours than about the code; the suite's
property tests assert behaviour, not speed (benchmarks live in bench/).

Spark: every test that needs Spark shares one ``local[2]`` session (a JVM
costs several seconds here). PySpark launches the JVM by forking this
process; launched after earlier tests left gRPC's threads and pollers running
here, the child sometimes dies before it execs the JVM
(``JAVA_GATEWAY_EXITED``, with gRPC's ``epoll_wait error: Bad file
descriptor`` on stderr). So when the run holds Spark tests, the session is
started before the first test, while this process has no gRPC yet.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "halfmoon",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("halfmoon")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from halfmoon.spark import build_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = build_session(
        "halfmoon-tests",
        "local[2]",
        {
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
            "spark.driver.memory": "1g",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def _spark_before_grpc(request: pytest.FixtureRequest) -> None:
    """Start the shared SparkSession first when any selected test uses it (module docstring)."""
    if any("spark" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("spark")
