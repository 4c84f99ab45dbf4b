"""Fixtures for the cluster tests: a real etcd per test module, a fresh cluster name per test,
and a whole cluster shared by a module."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cluster_server import ClusterServer
from tests.cluster.etcd_server import EtcdServer

_names = itertools.count()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of the test's own, for tests that kill and restart it."""
    server = EtcdServer(tmp_path / "etcd-data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster_name(request: pytest.FixtureRequest) -> str:
    """A cluster name no other test of the module uses, so tests sharing an etcd stay apart."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"t{next(_names)}-{request.node.name}")[:64]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    """A real cluster (etcd, two brokers, two proxies) shared by a module's tests that kill
    nothing; a module that needs another shape defines its own ``cluster``."""
    server = ClusterServer(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield server
    finally:
        if server.alive():
            server.stop()
