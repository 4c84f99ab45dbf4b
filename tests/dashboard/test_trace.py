"""The Message page's trace and the Transactions page's next check, in chromium against a
real ``halfmoon serve`` whose check service runs every second: the timelines the broker
recorded after a real send, receive and ack, and after a transaction committed through a
check answered by a live producer."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from halfmoon.client.message import Message
from halfmoon.client.selector import MessageSelector
from halfmoon.client.sync import SyncSimpleConsumer, SyncTransactionProducer
from halfmoon.client.transaction import TransactionResolution
from tests.dashboard.conftest import DashboardPage, dashboard_in
from tests.server.conftest import ServerProcess, wait_until


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that checks undecided transactions 1 s after they are stored, every second."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-trace"),
        settings=(
            "transaction.timeout_ms=1000",
            "transaction.check_interval_ms=1000",
            "transaction.check_retry_ms=1000",
        ),
    ).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture
def dashboard(browser: Any, checked: ServerProcess, shots: Path) -> Iterator[DashboardPage]:
    yield from dashboard_in(browser, checked, shots)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def api(server: ServerProcess, method: str, path: str, body: dict | None = None) -> Any:
    status, answer = server.admin_call(method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer


def open_trace_by_key(dashboard: DashboardPage, topic: str, key: str, message_id: str) -> Any:
    """Find the message by key on the Messages page and open it: the Message page with its
    trace."""
    page = dashboard.open("messages", "messages")
    form = page.locator("#by-key")
    form.locator("input[name=topic]").fill(topic)
    form.locator("input[name=key]").fill(key)
    form.get_by_role("button", name="find by key").click()
    page.locator(f"#results a:text-is('{message_id}')").click()
    dashboard.wait_loaded("message")
    return page


def timeline(page: Any) -> list[tuple[str, str]]:
    items = page.locator("#trace ol li")
    return [
        (items.nth(i).get_attribute("data-event"), items.nth(i).inner_text())
        for i in range(items.count())
    ]


def test_a_received_and_acked_message_shows_its_deliveries(dashboard, checked):
    topic, group = unique("traced"), unique("readers")
    checked.create_topic(topic, queues=1)
    checked.create_group(group)
    sent = api(checked, "POST", f"/v1/topics/{topic}/messages", {"body": "hi", "keys": ["k-1"]})
    with SyncSimpleConsumer(checked.grpc, group, {topic: MessageSelector.all()}) as consumer:
        got: list = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 15, wait=2)
        assert len(got) == 1
        # A nack in RocketMQ 5 terms: back in 1 s, then received again and acked.
        consumer.change_invisible_duration(got[0], 1)
        again: list = []
        deadline = time.monotonic() + 20
        while not again and time.monotonic() < deadline:
            again = consumer.receive(1, 15, wait=2)
        assert len(again) == 1
        consumer.ack(again[0])
    page = open_trace_by_key(dashboard, topic, "k-1", sent["message_id"])
    events = timeline(page)
    assert [e for e, _ in events] == [
        "stored",
        "delivered",
        "invisible_changed",
        "delivered",
        "acked",
    ], events
    assert f"stored in {topic} queue 0 at offset 0" in events[0][1]
    assert f"delivered to group {group} (attempt 1)" in events[1][1]
    assert f"retried: group {group} put it back" in events[2][1]
    assert f"delivered to group {group} (attempt 2)" in events[3][1]
    assert f"acked by group {group} (attempt 2)" in events[4][1]
    dashboard.screenshot("message-trace")


class CommitOnCheck:
    """A producer whose local transaction is still open when it sends, and committed by the
    time the broker checks."""

    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionResolution:
        return TransactionResolution.UNKNOWN

    def check_local_transaction(self, message: Any) -> TransactionResolution:
        self.checked.append(message.message_id)
        return TransactionResolution.COMMIT


def test_a_transaction_committed_through_a_check_shows_its_history(dashboard, checked):
    topic, producer_group = unique("orders"), unique("pg")
    checked.create_topic(topic, message_type="transaction", queues=1)
    listener = CommitOnCheck()
    with SyncTransactionProducer(checked.grpc, producer_group, listener) as producer:
        sent = producer.send_message_in_transaction(Message(topic, b"order", keys=["order-9"]))
        result = sent.receipt
        # The Transactions page shows the check service's next check for it.
        page = dashboard.open("transactions", "transactions")
        row = page.locator("#pending tbody tr", has_text=result.transaction_id)
        if row.count():  # it may be committed already: the check comes within ~2 s
            shown = row.locator(".next-check").get_attribute("data-ms")
            assert shown is not None and int(shown) > 0
        wait_until(lambda: listener.checked, 20, "a check reaching the producer")
        wait_until(
            lambda: (
                api(checked, "GET", f"/v1/topics/{topic}/status")["queues"][0]["max_offset"] == 1
            ),
            20,
            "the commit",
        )
    page = open_trace_by_key(dashboard, topic, "order-9", result.message_id)
    events = timeline(page)
    kinds = [e for e, _ in events]
    assert kinds[0] == "half_stored", events
    assert kinds.index("check_sent") < kinds.index("check_answered") < kinds.index("committed")
    assert "stored" in kinds, events  # the committed message in its topic
    text = dict(events)
    assert f"producer group {producer_group}" in text["half_stored"]
    assert "check answered: commit" in text["check_answered"]
    assert "committed by a check answer" in text["committed"]
    dashboard.screenshot("transaction-trace")


def test_the_transactions_page_shows_the_next_check_from_the_schedule(dashboard, checked):
    topic, producer_group = unique("slow"), unique("pg")
    checked.create_topic(topic, message_type="transaction", queues=1)
    # The producer leaves without deciding: the check service keeps trying to ask one.
    with SyncTransactionProducer(checked.grpc, producer_group) as producer:
        transaction = producer.begin()
        producer.send_in(
            transaction,
            Message(topic, b"undecided", keys=["slow-1"]),
        )
    (pending,) = api(checked, "GET", f"/v1/transactions?topic={topic}")["transactions"]
    assert pending["next_check_ms"] is not None
    transaction_id = pending["transaction_id"]
    page = dashboard.page
    # The page shows exactly what the check service's schedule said in the answer it drew
    # (the schedule moves on every second here, so compare with that answer, not another).
    with page.expect_response(lambda r: "/v1/transactions?limit" in r.url) as answered:
        dashboard.open("transactions", "transactions")
    drawn = {t["transaction_id"]: t for t in answered.value.json()["transactions"]}
    cell = page.locator(f"#pending tbody tr:has-text('{transaction_id}') .next-check")
    shown = int(cell.get_attribute("data-ms"))
    if shown != drawn[transaction_id]["next_check_ms"]:  # a live refresh redrew it meanwhile
        fresh = api(checked, "GET", f"/v1/transactions?topic={topic}")["transactions"][0]
        assert shown <= fresh["next_check_ms"] + 1_000
    else:
        assert shown == drawn[transaction_id]["next_check_ms"]
    assert abs(shown - int(time.time() * 1000)) < 60_000
    dashboard.screenshot("transactions-next-check")
