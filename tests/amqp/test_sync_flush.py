"""The endpoint under ``store.flush=sync`` (the default): a message is readable only once
the fsync that covers it is done, and a client reading right after publishing still sees
what it published (the other test modules run ``async`` flush, for speed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest

from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def amqp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("amqp"),
        settings=("server.amqp_listen=127.0.0.1:0", "store.flush=sync"),
    ).start()
    try:
        yield process
    finally:
        if process.alive():
            process.stop()


def test_a_publish_without_confirms_is_seen_by_the_get_count_and_purge_after_it(
    amqp_url: str,
) -> None:
    # pika's TestZ_PublishAndGet: Basic.Publish then Basic.Get at once, no confirms: the
    # get waits for the publish's fsync rather than answering Get-Empty.
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        queue = f"ryw.{uuid.uuid4().hex[:8]}"
        channel.queue_declare(queue)
        for round in range(5):
            body = f"get {round}".encode()
            channel.basic_publish("", queue, body)
            method, _, got = channel.basic_get(queue, auto_ack=True)
            assert method is not None and got == body
            channel.basic_publish("", queue, b"counted")
            assert channel.queue_declare(queue, passive=True).method.message_count == 1
            channel.basic_publish("", queue, b"purged")
            assert channel.queue_purge(queue).method.message_count == 2
    finally:
        connection.close()


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_a_length_limit_counts_a_burst_of_publishes_without_confirms(
    amqp_url: str, overflow: str
) -> None:
    # Each publish of the burst is checked against the queue with the ones before it
    # counted, though they are not yet readable when it arrives.
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        queue = f"capped.{uuid.uuid4().hex[:8]}"
        channel.queue_declare(
            queue, exclusive=True, arguments={"x-max-length": 1, "x-overflow": overflow}
        )
        for body in (b"first", b"second", b"third"):
            channel.basic_publish("", queue, body)
        assert channel.queue_declare(queue, passive=True).method.message_count == 1
        kept = b"third" if overflow == "drop-head" else b"first"
        assert channel.basic_get(queue, auto_ack=True)[2] == kept
    finally:
        connection.close()
