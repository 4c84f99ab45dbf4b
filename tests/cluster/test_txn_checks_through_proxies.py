"""Transaction check-back through proxies: one broker process, two ``halfmoon proxy`` processes,
the official Python client's transactional producers, one on each proxy.

A half message sent through proxy A is checked through proxy A (its producer is
connected there); when A is SIGKILLed, its undecided half messages are checked
through proxy B, where another producer of the same topic is connected, and the
answer comes back through B.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import Producer, TransactionResolution
from rocketmq.grpc_protocol import TransactionSource

from tests.cluster.proxied_server import ProxiedServer
from tests.server.conftest import ServerProcess, wait_until
from tests.server.test_transactions_official_python import (
    TRANSACTION_SETTINGS,
    UNKNOWN,
    StatusChecker,
    half,
    pending,
    start_producer,
)

pytestmark = pytest.mark.slow

WAIT_S = 20.0
HALVES_PER_PRODUCER = 3


class SecondProxy(ServerProcess):
    """Another ``halfmoon proxy`` in front of an already running broker process."""

    def __init__(self, data_dir: Path, broker_address: str) -> None:
        super().__init__(data_dir)
        self.broker_address = broker_address

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "halfmoon", "proxy",
            "--broker", self.broker_address,
            "--listen", self.grpc,
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
        ]  # fmt: skip
        for setting in self.settings:
            if setting.startswith("server."):
                cmd += ["--set", setting]
        return cmd


class CommitAll(StatusChecker):
    """Answers COMMIT for any transaction it has no status for."""

    def check(self, message):  # type: ignore[no-untyped-def]
        self.status.setdefault(message.message_id, TransactionResolution.COMMIT)
        return super().check(message)


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[tuple[ProxiedServer, SecondProxy]]:
    first = ProxiedServer(tmp_path / "a", settings=TRANSACTION_SETTINGS).start()
    second = SecondProxy(tmp_path / "b", first.broker.address)
    try:
        second.start()
        yield first, second
    finally:
        second.kill()
        first.kill()


def send_undecided(producer: Producer, topic: str, body: str) -> str:
    """A half message whose producer says it does not know yet: left to the check."""
    transaction = producer.begin_transaction()
    sent = half(topic, body)
    receipt = producer.send(sent, transaction)
    answer = producer.end_transaction(
        receipt.message_queue.endpoints, sent, receipt.transaction_id,
        UNKNOWN, TransactionSource.SOURCE_CLIENT,
    )  # fmt: skip
    assert answer.status.code == 20000, answer.status
    return str(receipt.message_id)


def test_checks_go_through_the_senders_proxy_then_another_when_it_dies(
    proxies: tuple[ProxiedServer, SecondProxy],
) -> None:
    proxy_a, proxy_b = proxies
    topic = "txn-checked"
    proxy_a.create_topic(topic, "transaction", queues=2)
    checker_a, checker_b = StatusChecker(), CommitAll()
    producer_a = start_producer(proxy_a, topic, checker_a)
    producer_b = start_producer(proxy_b, topic, checker_b)
    try:
        via_a = []
        for i in range(HALVES_PER_PRODUCER):
            message_id = send_undecided(producer_a, topic, f"a-{i}")
            checker_a.status[message_id] = TransactionResolution.COMMIT
            via_a.append(message_id)
        via_b = [send_undecided(producer_b, topic, f"b-{i}") for i in range(HALVES_PER_PRODUCER)]
        wait_until(lambda: not pending(proxy_b, topic), WAIT_S, "every half checked and committed")
        # Each half was checked through the proxy its producer sent it through, never the other.
        assert set(checker_a.asked) == set(via_a)
        assert set(checker_b.asked) == set(via_b)

        # A half whose producer's proxy dies before it is decided: checked through proxy B.
        orphan = send_undecided(producer_a, topic, "orphan")
        checker_a.status[orphan] = UNKNOWN  # A's producer would not know anyway
        ServerProcess.kill(proxy_a)  # the proxy only; the broker stays up
        wait_until(lambda: checker_b.asked[orphan] >= 1, WAIT_S, "the orphan checked through B")
        wait_until(lambda: not pending(proxy_b, topic), WAIT_S, "the orphan committed through B")
    finally:
        producer_b.shutdown()
        with contextlib.suppress(Exception):  # its proxy is gone; nothing to close cleanly
            producer_a.shutdown()
