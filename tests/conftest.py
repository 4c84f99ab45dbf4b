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

import asyncio
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

# Before any test module imports grpc: halfmoon's package root chooses grpc's fork handlers
# (off), which grpc reads once, at its import; Spark's gateway launch forks beside channels.
import halfmoon  # noqa: F401

settings.register_profile(
    "halfmoon",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("halfmoon")

# Every ``halfmoon serve`` a test starts inherits this: its AMQP listener takes a free port
# (the ready line names it) instead of the default 5673, so servers started at once never
# collide on it. tests/amqp starts its servers with an explicit port.
os.environ.setdefault("HALFMOON_SERVER_AMQP_LISTEN", "127.0.0.1:0")


_TAKES_SPARK = re.compile(r"def \w+\([^)]*\bspark\b")  # a test or fixture using the session
_spark_modules: dict[str, bool] = {}


def work_group(nodeid: str) -> str:
    """The worker group of a test: its module, or ``spark`` for every module that uses the
    shared SparkSession (all of tests/spark, and any module with a test or fixture taking
    ``spark``), so that one worker at a time runs Spark jobs."""
    module = nodeid.split("::")[0]
    if module.startswith("tests/spark/"):
        return "spark"
    if module not in _spark_modules:
        path = Path(__file__).parent.parent / module
        _spark_modules[module] = path.is_file() and bool(_TAKES_SPARK.search(path.read_text()))
    return "spark" if _spark_modules[module] else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Hand out whole :func:`work_group` groups (pytest-xdist's ``loadgroup`` marks do not
    reach pytest 9's node ids, so the grouping is the scheduler's own)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_group(nodeid)

    return WorkGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the groups so that the longest work is handed out first.

    ``./run test`` spreads the suite over worker processes (pytest-xdist, with
    the scheduler above): each :func:`work_group` runs on one worker, one test
    after another, so a module-scoped server starts once, and tests that must
    not run beside one another belong in one module. Workers take groups in
    collection order (``--no-loadscope-reorder``), so the groups holding
    ``slow`` tests come first, then the larger ones: the run does not end
    waiting on one long group handed out last. Within a group the order is the
    collection's own.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # one process: the collection order stays as written
    size: dict[str, int] = {}
    slow: set[str] = set()
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        group = work_group(item.nodeid)
        size[group] = size.get(group, 0) + 1
        first.setdefault(group, index)
        if any(item.iter_markers("slow")):
            slow.add(group)

    def order(item: pytest.Item) -> tuple[bool, int, int]:
        group = work_group(item.nodeid)
        return group not in slow, -size[group], first[group]

    items.sort(key=order)


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


_official_client_modules: dict[str, bool] = {}


def _uses_official_client(module: ModuleType) -> bool:
    """Whether ``module``, or a tests module it takes names from, imports the official client."""
    if module.__name__ not in _official_client_modules:
        _official_client_modules[module.__name__] = _imports_official_client(module)
    return _official_client_modules[module.__name__]


def _imports_official_client(module: ModuleType) -> bool:

    def imports_rocketmq(m: ModuleType) -> bool:
        return any(
            (getattr(value, "__name__", "") if isinstance(value, ModuleType) else "").startswith(
                "rocketmq"
            )
            or str(getattr(value, "__module__", "")).startswith("rocketmq")
            for value in vars(m).values()
        )

    if imports_rocketmq(module):
        return True
    source = Path(getattr(module, "__file__", "") or "")
    if source.is_file() and re.search(r"^\s*(from|import) rocketmq\b", source.read_text(), re.M):
        return True  # imported inside a function
    helpers = {str(getattr(value, "__module__", "")) for value in vars(module).values()}
    return any(
        imports_rocketmq(sys.modules[name])
        for name in helpers
        if name.startswith("tests.") and name in sys.modules
    )


def _set_official_client_loop() -> None:
    from rocketmq.v5.client.connection.rpc_client import RpcClient

    RpcClient(False)  # starts the client's shared I/O loop thread, once per process
    asyncio.set_event_loop(RpcClient.get_channel_io_loop())


@pytest.fixture(scope="module", autouse=True)
def _official_client_event_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Give the main thread the official Python client's event loop while a module drives it.

    The client (rocketmq-python-client) runs its gRPC calls on one event loop in
    its own thread, but opens its telemetry stream from the calling thread, and
    gRPC's asyncio layer asks that thread for its current event loop. The client
    sets one only when it happens to create a channel in that thread; otherwise,
    once anything in the process has run ``asyncio.run`` (which leaves the main
    thread with no loop), the stream fails with "There is no current event loop
    in thread 'MainThread'" and the client then cannot fetch routes. Which thread
    creates the channel depends on timing and on which tests ran before, so the
    loop the client means to use is set before the module's fixtures start
    clients, and again before each of its tests (one may have run ``asyncio.run``).
    """
    if not _uses_official_client(request.module):
        yield
        return
    _set_official_client_loop()
    try:
        yield
    finally:
        asyncio.set_event_loop(None)  # as asyncio.run leaves it


@pytest.fixture(autouse=True)
def _official_client_event_loop_per_test(request: pytest.FixtureRequest) -> None:
    if _uses_official_client(request.module):
        _set_official_client_loop()
