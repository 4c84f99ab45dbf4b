"""The official Python client opens its telemetry stream from the calling thread.

When its first route answer is already back by the time it registers the
callback, the client runs the callback, and so opens the stream, in the thread
that called it; gRPC's asyncio layer then asks that thread for its current
event loop, which the main thread lacks once anything has run ``asyncio.run``.
tests/conftest.py gives the main thread the client's loop around every test
that drives the client; this module checks that it does, with the client's own
calls and no server (the stream waits for one: ``wait_for_ready``).
"""

from __future__ import annotations

import asyncio

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq.v5.client.connection.rpc_client import RpcClient


@pytest.fixture(scope="module")
def after_asyncio_run() -> None:
    """The main thread as ``asyncio.run`` leaves it (set up before each test's own fixtures)."""
    asyncio.run(asyncio.sleep(0))


def test_the_telemetry_stream_opens_from_the_main_thread_after_asyncio_run(
    after_asyncio_run: None,
) -> None:
    endpoints = ClientConfiguration("127.0.0.1:1", Credentials()).rpc_endpoints
    client = RpcClient(False)

    async def channel_made_in_the_io_thread() -> None:
        client.retrieve_or_create_channel(endpoints)

    loop = RpcClient.get_channel_io_loop()
    asyncio.run_coroutine_threadsafe(channel_made_in_the_io_thread(), loop).result(10)
    try:
        channel = client.telemetry_stream(endpoints, None, [], False, timeout=5)
        assert channel.telemetry_stream_stream_call is not None
    finally:
        client.stop()
