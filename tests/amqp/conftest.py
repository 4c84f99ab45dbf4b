"""One ``halfmoon serve`` per test module, with its AMQP listener on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def amqp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("amqp"), settings=("server.amqp_listen=127.0.0.1:0",)
    ).start()
    try:
        yield process
    finally:
        if process.alive():
            process.stop()


@pytest.fixture(scope="module")
def amqp_url(amqp_server: ServerProcess) -> str:
    assert amqp_server.amqp_address, amqp_server.log_tail()
    return f"amqp://guest:guest@{amqp_server.amqp_address}/%2F"
