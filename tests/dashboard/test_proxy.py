"""In cluster mode every proxy serves the dashboard: the same pages over the same API,
the broker's figures coming through the internal protocol."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.proxied_server import ProxiedServer
from tests.dashboard.conftest import DashboardPage


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedServer]:
    server = ProxiedServer(tmp_path / "data").start()
    try:
        yield server
    finally:
        server.kill()


def test_a_proxy_serves_the_overview_with_the_brokers_traffic(
    proxied: ProxiedServer, browser: Any, shots: Path
) -> None:
    proxied.create_topic("through-proxy", queues=1)
    for i in range(3):
        status, _ = proxied.admin_call(
            "POST", "/v1/topics/through-proxy/messages", {"body": f"m{i}"}
        )
        assert status == 201
    with urllib.request.urlopen(proxied.admin + "/dashboard/", timeout=10) as response:
        assert response.headers.get_content_type() == "text/html"
    status, stats = proxied.admin_call("GET", "/v1/statistics?topic=through-proxy")
    assert status == 200
    (row,) = stats["rows"]  # type: ignore[index]
    assert len(row["last_hour"]) == 60 and sum(row["last_hour"]) == 3
    # The rate charts' history comes from the brokers through the proxy, summed.
    status, history = proxied.admin_call("GET", "/v1/statistics/history?topic=through-proxy")
    assert status == 200 and sum(history["series"]["in"]) == 3, history  # type: ignore[index]

    context = browser.new_context()
    try:
        page = DashboardPage(context.new_page(), proxied.admin, shots)
        page.open("overview", "overview")
        assert page.page.locator("#dead-letters .value").inner_text() == "0"
        page.open("topics?search=through", "topics")
        assert page.page.locator("main tbody tr").count() == 1
        page.open("topic?name=through-proxy", "topic")
        assert page.page.locator("#rates svg.chart polyline.acked").count() == 1
    finally:
        context.close()
    assert not page.errors, page.errors
