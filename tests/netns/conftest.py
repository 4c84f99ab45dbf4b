"""The ``network`` fixture: a virtual network of namespaces, removed after the test.

Leftovers of an earlier run that was killed (its pid gone) are removed first.
Where namespaces cannot be made the tests skip and say why; under ``CI=true``
that is a failure.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator

import pytest

from tests.netns.network import (
    NetworkUnavailable,
    VirtualNetwork,
    remove_leftovers,
    require_tools,
    unavailable,
)

_open: list[VirtualNetwork] = []


def _close_all() -> None:  # an interrupted run still removes what it made
    for network in _open:
        network.close()


atexit.register(_close_all)


@pytest.fixture(scope="session")
def network_available() -> None:
    require_tools()
    remove_leftovers()


@pytest.fixture
def network(network_available: None) -> Iterator[VirtualNetwork]:
    try:
        made = VirtualNetwork()
    except NetworkUnavailable as exc:
        unavailable(f"cannot build a virtual network: {exc}")
    _open.append(made)
    try:
        yield made
    finally:
        made.close()
        _open.remove(made)
