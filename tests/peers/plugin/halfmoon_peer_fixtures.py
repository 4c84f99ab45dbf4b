"""pytest plugin for a client library's own suite: the server under test is at AMQP_URL.

It also appends each test's outcome (``passed``, ``failed``, ``skipped``) as a JSON
line to ``HALFMOON_PEER_OUTCOMES`` as it is known, and deselects the tests whose ids
match a pattern in ``HALFMOON_PEER_DESELECT`` (a file of ``fnmatch`` patterns, one a
line): the known gaps, which would only spend their timeouts against halfmoon.

aiormq's and aio-pika's conftests start RabbitMQ in Docker (``tests.docker_client``).
This plugin, loaded with ``-p halfmoon_peer_fixtures`` before their conftest, stands
in for the Docker client: "running" the image reports the server at ``AMQP_URL``
(and its TLS port, ``AMQPS_PORT``) as the container. The suites' tests and
conftests stay as their authors wrote them; ``rabbitmq_container`` and
``amqp_direct_url`` are also given here for a conftest that only uses them.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

URL = urlsplit(os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
HOST = URL.hostname or "127.0.0.1"
PORT = URL.port or 5672
TLS_PORT = int(os.environ.get("AMQPS_PORT") or 5671)


def _ports() -> dict[str, int]:
    return {"5672/tcp": PORT, "5671/tcp": TLS_PORT}


def _patch_docker_client() -> None:
    import importlib

    try:
        docker_client: Any = importlib.import_module("tests.docker_client")  # the suite's own
    except ImportError:
        return

    def check_docker_available(*args: Any, **kwargs: Any) -> Any:
        return docker_client.DockerHostInfo(is_tcp=False, socket_path="/nonexistent")

    class ServerAtUrl:
        """What the conftest asks of its Docker client, answered with the server at AMQP_URL."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def run(self, image: str, ports: list[str], environment: Any = None) -> Any:
            return docker_client.ContainerInfo(id="server-at-amqp-url", ports=_ports(), host=HOST)

        def kill(self, container_id: str) -> None:
            pass

        def remove(self, container_id: str) -> None:
            pass

        def stop(self, container_id: str, timeout: int = 10) -> None:
            pass

    docker_client.check_docker_available = check_docker_available
    docker_client.DockerClient = ServerAtUrl


_patch_docker_client()


class _Container:
    id = "server-at-amqp-url"
    host = HOST

    @property
    def ports(self) -> dict[str, int]:
        return _ports()


@pytest.fixture(scope="session")
def rabbitmq_container() -> Any:
    return _Container()


@pytest.fixture(scope="session")
def amqp_direct_url() -> Any:
    from yarl import URL as Url

    return Url.build(
        scheme="amqp", user=URL.username or "guest", password=URL.password or "guest",
        path="//", host=HOST, port=PORT,
    )  # fmt: skip


def _deselect_patterns() -> list[str]:
    path = os.environ.get("HALFMOON_PEER_DESELECT")
    if not path:
        return []
    lines = Path(path).read_text().splitlines()
    return [line for line in (raw.strip() for raw in lines) if line and not line.startswith("#")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    patterns = _deselect_patterns()
    if not patterns:
        return
    kept, dropped = [], []
    for item in items:
        gap = any(fnmatch.fnmatchcase(item.nodeid, p) for p in patterns)
        (dropped if gap else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


_outcomes: dict[str, str] = {}
_reasons: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A failure in any phase (setup, call, teardown) fails the test; a skip in setup
    # skips it; only a passing call with a clean setup and teardown passes it.
    before = _outcomes.get(report.nodeid)
    if report.failed:
        _outcomes[report.nodeid] = "failed"
        crash = getattr(report.longrepr, "reprcrash", None)
        message = getattr(crash, "message", None) or str(report.longrepr).splitlines()[-1:]
        _reasons.setdefault(report.nodeid, f"{report.when}: {message}"[:300])
    elif report.skipped and before != "failed":
        _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and before is None:
        _outcomes[report.nodeid] = "passed"
    if report.when == "teardown" or _outcomes.get(report.nodeid) != before:
        _record(report.nodeid)


def _record(nodeid: str) -> None:
    """One line per change, as it happens: a run stopped at its deadline keeps what it ran."""
    path = os.environ.get("HALFMOON_PEER_OUTCOMES")
    if path and nodeid in _outcomes:
        with open(path, "a") as out:
            entry = [nodeid, _outcomes[nodeid], _reasons.get(nodeid, "")]
            out.write(json.dumps(entry) + "\n")
