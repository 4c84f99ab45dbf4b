"""The Transactions page's operator actions on many transactions, and the Overview's
warnings, in chromium against a real ``halfmoon serve`` that checks undecided transactions
1 s after they are stored and parks them after one check: two pending transactions rolled
back together, a parked one resumed, half messages older than the check window and a
group whose lag keeps growing warned about."""

from __future__ import annotations

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
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Checks 1 s after a half message is stored, every second; parked after one check."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-parking"),
        settings=(
            "transaction.timeout_ms=1000",
            "transaction.check_interval_ms=1000",
            "transaction.check_retry_ms=1000",
            "transaction.check_max=1",
        ),
    ).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture
def dashboard(browser: Any, quick: ServerProcess, shots: Path) -> Iterator[DashboardPage]:
    yield from dashboard_in(browser, quick, shots)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def api(server: ServerProcess, method: str, path: str, body: dict | None = None) -> Any:
    status, answer = server.admin_call(method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    return answer


def stored(server: ServerProcess, topic: str) -> int:
    queues = api(server, "GET", f"/v1/topics/{topic}/status")["queues"]
    return sum(q["max_offset"] - q["min_offset"] for q in queues)


class NeverSure:
    """A producer that cannot tell: every check is answered UNKNOWN."""

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionResolution:
        return TransactionResolution.UNKNOWN

    def check_local_transaction(self, message: Any) -> TransactionResolution:
        return TransactionResolution.UNKNOWN


def test_roll_back_many_resume_a_parked_one_and_the_overview_warnings(dashboard, quick):
    parking, orphans = unique("parking"), unique("orphans")
    quick.create_topic(parking, message_type="transaction", queues=1)
    quick.create_topic(orphans, message_type="transaction", queues=1)
    # Two transactions whose producer left: no live producer to check, so they stay pending
    # (an unsent check does not count) and grow older than the check window.
    with SyncTransactionProducer(quick.grpc, unique("gone")) as producer:
        for key in ("o-1", "o-2"):
            producer.send_in(producer.begin(), Message(orphans, b"undecided", keys=[key]))
    left = api(quick, "GET", f"/v1/transactions?topic={orphans}")["transactions"]
    assert len(left) == 2
    # One whose producer stays and answers UNKNOWN: parked after its one check.
    with SyncTransactionProducer(quick.grpc, unique("unsure"), NeverSure()) as producer:
        sent = producer.send_message_in_transaction(Message(parking, b"unsure", keys=["p-1"]))
        parked_id = sent.receipt.transaction_id
        wait_until(
            lambda: (
                [
                    t["transaction_id"]
                    for t in api(quick, "GET", "/v1/transactions/parked")["transactions"]
                ]
                == [parked_id]
            ),
            20,
            "the transaction parked after one check",
        )

    page = dashboard.open("overview", "overview")
    warnings = page.locator("#warnings")
    warnings.locator("li:has-text('older than the check window (2 s)')").wait_for()
    assert "2 half message(s) older than the check window" in warnings.inner_text()
    assert "1 parked transaction(s) need an operator" in warnings.inner_text()

    page = dashboard.open("transactions", "transactions")
    pending_rows = page.locator("#pending tbody tr")
    assert pending_rows.count() == 2  # the parked one only in its own table
    assert page.locator("#parked tbody tr", has_text=parked_id).count() == 1
    for info in left:
        page.locator(f"#pending input[data-id='{info['transaction_id']}']").check()
    page.click("#rollback")  # confirmed by the fixture
    page.wait_for_selector("#pending tbody tr", state="detached")
    assert api(quick, "GET", f"/v1/transactions?topic={orphans}")["transactions"] == []
    assert stored(quick, orphans) == 0  # nothing reached the topic

    page.locator(f"#parked input[data-id='{parked_id}']").check()
    page.click("#resume")
    page.wait_for_selector(f"#pending tbody tr:has-text('{parked_id}')")
    assert api(quick, "GET", "/v1/transactions/parked")["transactions"] == []
    (resumed,) = api(quick, "GET", f"/v1/transactions?topic={parking}")["transactions"]
    assert (resumed["transaction_id"], resumed["state"]) == (parked_id, "prepared")
    dashboard.screenshot("transactions-resumed")

    # A rolled-back message has no stored copy: its page says so and shows its history.
    page = dashboard.open(f"message?id={left[0]['message_id']}", "message")
    main = page.locator("main").inner_text()
    assert "no stored copy" in main and "null" not in main
    events = page.locator("#trace ol li")
    kinds = [events.nth(i).get_attribute("data-event") for i in range(events.count())]
    assert kinds == ["half_stored", "rolled_back"], kinds
    assert "rolled back by an operator" in events.nth(1).inner_text()


def test_the_overview_warns_of_a_group_whose_lag_keeps_growing(dashboard, quick):
    topic, group = unique("flood"), unique("behind")
    quick.create_topic(topic, queues=1)
    quick.create_group(group)
    api(quick, "POST", f"/v1/topics/{topic}/messages", {"body": "first"})
    with SyncSimpleConsumer(quick.grpc, group, {topic: MessageSelector.all()}) as consumer:
        got: list = []
        wait_until(lambda: got.extend(consumer.receive(1, 10, wait=1)) or got, 20, "a message")
        consumer.ack(got[0])
    page = dashboard.open("overview", "overview")
    warning = f"group {group}: lag growing"
    # Each time the overview redraws (every 5 s), the group falls further behind.
    for sent in range(1, 6):
        api(quick, "POST", f"/v1/topics/{topic}/messages", {"body": f"more {sent}"})
        drawn = page.locator("main").get_attribute("data-drawn")
        page.wait_for_function(
            "drawn => document.querySelector('main').dataset.drawn !== drawn", arg=drawn
        )
        if page.locator("#warnings li", has_text=warning).count():
            break
    shown = page.locator("#warnings li", has_text=warning).inner_text()
    samples = [int(n) for n in shown.split("(")[1].rstrip(")").split(" → ")]
    assert len(samples) >= 3 and samples == sorted(set(samples)), shown
    lag = sum(q["lag"] for q in api(quick, "GET", f"/v1/groups/{group}/progress")["queues"])
    assert samples[-1] == lag, (shown, lag)
    dashboard.screenshot("overview-lag-growing")
