"""Each dashboard page in chromium against a real ``halfmoon serve`` with data in it:
the page loads, its main action is performed through the page, and both what the page
shows afterwards and what the broker did (through the admin API) are asserted."""

from __future__ import annotations

import json
import time
import uuid

from halfmoon.client.message import Message
from halfmoon.client.selector import MessageSelector
from halfmoon.client.sync import SyncSimpleConsumer, SyncTransactionProducer
from tests.server.conftest import ServerProcess, wait_until


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def api(server: ServerProcess, method: str, path: str, body: dict | None = None) -> dict:
    status, answer = server.admin_call(method, path, body)
    assert 200 <= status < 300, (method, path, status, answer)
    assert isinstance(answer, dict)
    return answer


def send(server: ServerProcess, topic: str, body: str, key: str | None = None) -> dict:
    message: dict = {"body": body}
    if key:
        message["keys"] = [key]
    return api(server, "POST", f"/v1/topics/{topic}/messages", message)


def messages_in(server: ServerProcess, topic: str) -> int:
    queues = api(server, "GET", f"/v1/topics/{topic}/status")["queues"]
    return sum(q["max_offset"] - q["min_offset"] for q in queues)


def consume(server: ServerProcess, group: str, topic: str, count: int, ack: bool = True) -> None:
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        got: list = []
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            got += consumer.receive(count - len(got), 10 if not ack else 60, wait=2)
        assert len(got) == count
        if ack:
            for message in got:
                consumer.ack(message)


def test_overview_shows_the_broker_and_refreshes_live(dashboard, server):
    topic = unique("overview")
    server.create_topic(topic)
    send(server, topic, "first")
    page = dashboard.open("overview", "overview")
    assert page.locator("#nav a.active").inner_text() == "Overview"
    assert page.locator("svg.chart polyline.in").count() == 1
    assert "127.0.0.1" in page.locator("main table").first.inner_text()
    status = api(server, "GET", "/v1/broker/status")
    assert page.locator("#pending .value").inner_text() == str(status["pending_transactions"])
    assert page.locator("#parked .value").inner_text() == str(status["parked_transactions"])
    dead = api(server, "GET", "/v1/dead-letters")["total"]
    assert page.locator("#dead-letters .value").inner_text() == str(dead)
    disk = page.locator("#disk .value").inner_text()
    assert disk.endswith(("KiB", "MiB", "GiB")) and float(disk.split()[0]) > 0, disk
    volume = page.locator("#volume .value").inner_text()
    assert volume == f"{round(status['disk_used_ratio'] * 100)} %", volume
    before = page.locator("#tps-in .value").inner_text()
    for i in range(30):
        send(server, topic, f"more {i}")
    # The page redraws itself every few seconds: the in-rate changes without a reload.
    page.wait_for_function(
        "before => document.querySelector('#tps-in .value').textContent !== before",
        arg=before,
        timeout=15_000,
    )
    # The chart of the last hour has the messages in: the in-line leaves the baseline.
    page.wait_for_function(
        "() => document.querySelector('svg.chart polyline.in').getAttribute('points')"
        ".split(' ').some((p) => Number(p.split(',')[1]) < 100)"
    )
    dashboard.screenshot("overview")


def test_topics_search_pages_and_create_delete(dashboard, server):
    prefix = unique("bulk")
    for i in range(60):
        server.create_topic(f"{prefix}-{i:03d}", queues=1)
    page = dashboard.open(f"topics?search={prefix}", "topics")
    assert "1–50 of 60" in page.locator(".pager").inner_text()
    assert page.locator("main tbody tr").count() == 50
    page.get_by_role("button", name="next").click()
    page.wait_for_function("() => document.querySelector('.pager').textContent.includes('51–60')")
    assert page.locator("main tbody tr").count() == 10

    # A call that fails says so: the API's code and message in the banner.
    form = page.locator("#create-topic")
    form.locator("input[name=name]").fill("no spaces allowed")
    form.get_by_role("button", name="create topic").click()
    page.wait_for_selector("#banner:not([hidden])")
    banner = page.locator("#banner").inner_text()
    assert banner.startswith("ILLEGAL_TOPIC: illegal topic name 'no spaces allowed'"), banner
    assert server.admin_call("GET", "/v1/topics/no%20spaces%20allowed")[0] == 404
    dashboard.errors[:] = [e for e in dashboard.errors if "status of 400" not in e]  # expected

    created = unique("made-in-browser")
    form.locator("input[name=name]").fill(created)
    form.locator("select[name=message_type]").select_option("fifo")
    form.locator("input[name=queue_count]").fill("3")
    form.get_by_role("button", name="create topic").click()
    # The page shows the new topic by searching for it.
    page.wait_for_selector(f"main tbody a:text-is('{created}')")
    assert api(server, "GET", f"/v1/topics/{created}")["queue_count"] == 3
    assert api(server, "GET", f"/v1/topics/{created}")["message_type"] == "fifo"
    dashboard.screenshot("topics")

    page.locator("main tbody tr", has_text=created).get_by_role("button", name="delete").click()
    page.wait_for_selector(f"main tbody a:text-is('{created}')", state="detached")
    status, _ = server.admin_call("GET", f"/v1/topics/{created}")
    assert status == 404


def test_topics_list_refreshes_live_and_keeps_what_is_typed(dashboard, server):
    topic = unique("lively")
    server.create_topic(topic, queues=1)
    page = dashboard.open(f"topics?search={topic}", "topics")
    rate = page.locator("#topic-list tbody tr").first.locator("td").nth(4)
    assert rate.inner_text() == "0.00"
    typing = page.locator("#create-topic input[name=name]")
    typing.fill("half-typed")
    for i in range(20):
        send(server, topic, f"m{i}")
    # The list redraws itself every few seconds (no reload, no click)...
    page.wait_for_function(
        "() => document.querySelector('#topic-list tbody tr td:nth-child(5)').textContent"
        " !== '0.00'"
    )
    assert float(rate.inner_text()) > 0
    # ...and leaves the forms alone: what the user was typing is still there.
    assert typing.input_value() == "half-typed"
    assert page.locator("main").get_attribute("data-loaded") == "topics"


def test_topics_list_shows_rate_and_backlog(dashboard, server):
    topic, group = unique("busy"), unique("slow")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    for i in range(4):
        send(server, topic, f"m{i}")
    consume(server, group, topic, 1)  # one consumed, three behind
    page = dashboard.open(f"topics?search={topic}", "topics")
    cells = page.locator("main tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == topic and float(cells[4]) > 0 and cells[5] == "3"


def test_topic_page_sends_a_test_message_and_shows_queues(dashboard, server):
    topic = unique("detail")
    server.create_topic(topic, queues=2)
    page = dashboard.open(f"topic?name={topic}", "topic")
    assert page.locator("main section", has_text="Queues").locator("tbody tr").count() == 2
    form = page.locator("#send-test")
    form.locator("input[name=body]").fill('{"hello": "world"}')
    form.locator("input[name=key]").fill("test-key")
    form.get_by_role("button", name="send test message").click()
    page.wait_for_function(
        "() => document.querySelector('#send-result').textContent.startsWith('sent ')"
    )
    sent_id = page.locator("#send-result").inner_text().split()[1]
    found = api(server, "GET", f"/v1/topics/{topic}/messages?key=test-key")["messages"]
    assert [m["message_id"] for m in found] == [sent_id]
    assert messages_in(server, topic) == 1
    # The queues table refreshes by itself: the test message shows without a reload.
    page.wait_for_function(
        "() => [...document.querySelectorAll('#queues tbody tr')]"
        ".some((tr) => tr.cells[3].textContent === '1')"
    )
    route_rows = page.locator("#route tbody tr")
    assert route_rows.count() == 2  # the route as a table, a row per queue
    assert route_rows.first.locator("td").all_inner_texts()[:2] == ["0", "rw"]

    # Change the topic (confirmed by the fixture): four queues, read-only.
    form = page.locator("#update-topic")
    form.locator("input[name=queue_count]").fill("4")
    form.locator("select[name=perm]").select_option("r")
    form.get_by_role("button", name="update").click()
    page.wait_for_selector("main p:has-text('4 queues, perm r')")
    shown = api(server, "GET", f"/v1/topics/{topic}")
    assert (shown["queue_count"], shown["perm"]) == (4, "r")


def test_group_page_resets_an_offset_to_a_time(dashboard, server):
    topic, group = unique("replay"), unique("replayers")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    before = int(time.time() * 1000) - 2000
    for i in range(3):
        send(server, topic, f"m{i}")
    consume(server, group, topic, 3)
    progress = api(server, "GET", f"/v1/groups/{group}/progress")["queues"]
    assert [(q["committed_offset"], q["lag"]) for q in progress] == [(3, 0)]

    page = dashboard.open(f"group?name={group}", "group")
    lag_table = page.locator("main section", has_text="Lag per queue")
    assert lag_table.locator("tbody tr td").nth(4).inner_text() == "0"
    form = page.locator("#reset-offset")
    form.locator("select[name=topic]").select_option(topic)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(before / 1000)) + "Z"
    form.locator("input[name=time]").fill(stamp)
    form.get_by_role("button", name="reset offset").click()
    page.wait_for_function(
        "() => document.querySelectorAll('main section')[0]"
        ".querySelectorAll('tbody tr td')[4]?.textContent === '3'"
    )
    progress = api(server, "GET", f"/v1/groups/{group}/progress")["queues"]
    assert [(q["committed_offset"], q["lag"]) for q in progress] == [(0, 3)]
    dashboard.screenshot("group")


def test_group_page_shows_the_grpc_clients_connected_now_and_retries(dashboard, server):
    topic, group = unique("watched"), unique("watchers")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    api(server, "POST", f"/v1/topics/{topic}/messages", {"body": "again", "tag": "red"})
    page = dashboard.open(f"group?name={group}", "group")
    assert "no client of this group is connected" in page.locator("#clients").inner_text()
    selector = {topic: MessageSelector.by_tag("red || blue")}
    with SyncSimpleConsumer(server.grpc, group, selector) as consumer:
        got: list = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 30, wait=2)
        assert len(got) == 1
        consumer.change_invisible_duration(got[0], 1)  # a nack: back in 1 s
        again: list = []
        deadline = time.monotonic() + 20
        while not again and time.monotonic() < deadline:
            again = consumer.receive(1, 30, wait=2)
        assert [m.delivery_attempt for m in again] == [2]
        (queue,) = api(server, "GET", f"/v1/groups/{group}/progress")["queues"]
        assert (queue["inflight"], queue["retrying"]) == (1, 1)
        # The lag table and the summary refresh by themselves: one in flight, being retried.
        page.wait_for_function(
            "() => document.querySelector('#lag tbody tr')?.cells[6].textContent === '1'"
        )
        summary = page.locator("#group-summary").inner_text()
        assert "1 in flight" in summary and "1 of them being retried" in summary, summary
        (row,) = api(server, "GET", f"/v1/statistics?group={group}")["rows"]
        assert (row["lag"], row["retrying"]) == (1, 1)
        groups = dashboard.open(f"groups?search={group}", "groups")
        cells = groups.locator("#group-list tbody tr").first.locator("td").all_inner_texts()
        assert (cells[0], cells[3], cells[6]) == (group, "1", "1"), cells  # lag, retrying
        page = dashboard.open(f"group?name={group}", "group")
        clients = api(server, "GET", f"/v1/groups/{group}/clients")["clients"]
        assert len(clients) == 1
        # The clients section refreshes by itself: the consumer shows without a reload.
        row = page.locator("#clients tbody tr")
        row.wait_for()
        cells = row.locator("td").all_inner_texts()
        assert cells[0] == clients[0]["client_id"]
        assert cells[2] == f"{topic} (tag red || blue)"
        dashboard.screenshot("group-clients")
    # Gone once the consumer closes.
    page.wait_for_selector("#clients:has-text('no client of this group is connected')")


def test_group_page_resends_a_dead_letter(dashboard, server):
    topic, group = unique("fragile"), unique("gives-up")
    server.create_topic(topic, queues=1)
    server.create_group(group, max_delivery_attempts=1)
    sent = send(server, topic, "poison", key="poison-key")
    consume(server, group, topic, 1, ack=False)  # never acked: one attempt, then the DLQ
    dlq = f"%25DLQ%25{group}"
    wait_until(
        lambda: (
            server.admin_call("GET", f"/v1/topics/{dlq}/status")[0] == 200
            and messages_in(server, dlq) == 1
        ),
        30,
        "the message in the dead-letter topic",
    )
    page = dashboard.open(f"group?name={group}", "group")
    row = page.locator("#dead-letters tbody tr")
    assert row.count() == 1 and topic in row.inner_text()
    row.get_by_role("button", name="resend").click()
    wait_until(lambda: messages_in(server, topic) == 2, 10, "the resent copy in its topic")
    # The row says so, and offers no second resend.
    page.wait_for_selector("#dead-letters .resent")
    assert row.get_by_role("button", name="resend").count() == 0
    assert "resent as " in row.inner_text()
    assert page.locator("#done").inner_text().startswith(f"resent {sent['message_id']} to {topic}")
    copies = api(server, "GET", f"/v1/topics/{topic}/messages?key=poison-key")["messages"]
    assert len(copies) == 2 and {m["body"] for m in copies} == {"poison"}
    assert sent["message_id"] in {m["message_id"] for m in copies}
    assert messages_in(server, dlq) == 1  # the dead letter stays, as an audit trail
    page = dashboard.open(f"groups?search={group}", "groups")
    cells = page.locator("main tbody tr").first.locator("td").all_inner_texts()
    assert cells[0] == group and cells[4] == "1"
    # The original's trace: delivered once, dead-lettered, resent as a new message.
    page = dashboard.open(f"message?id={sent['message_id']}&topic={topic}", "message")
    page.wait_for_selector("#trace li[data-event='resent']")
    kinds = page.locator("#trace li").evaluate_all("items => items.map((i) => i.dataset.event)")
    assert kinds.index("delivered") < kinds.index("dead_lettered") < kinds.index("resent"), kinds
    dead = page.locator("#trace li[data-event='dead_lettered']").inner_text()
    assert f"dead-lettered by group {group} after 1 deliveries (to %DLQ%{group})" in dead, dead


def test_transactions_page_commits_a_pending_transaction(dashboard, server):
    topic = unique("txn")
    server.create_topic(topic, message_type="transaction", queues=1)
    # The producer leaves without deciding: the half message stays pending.
    with SyncTransactionProducer(server.grpc, unique("pg")) as producer:
        transaction = producer.begin()
        producer.send_in(transaction, Message(topic, b"undecided", keys=["txn-key"]))
    pending = api(server, "GET", f"/v1/transactions?topic={topic}")["transactions"]
    assert len(pending) == 1
    transaction_id = pending[0]["transaction_id"]
    assert messages_in(server, topic) == 0

    page = dashboard.open("transactions", "transactions")
    row = page.locator("#pending tbody tr", has_text=transaction_id)
    assert "undecided" not in row.inner_text() and pending[0]["producer_group"] in row.inner_text()
    row.locator("input[type=checkbox]").check()
    page.click("#commit")
    page.wait_for_selector(f"#pending tbody tr:has-text('{transaction_id}')", state="detached")
    assert api(server, "GET", f"/v1/transactions?topic={topic}")["transactions"] == []
    assert messages_in(server, topic) == 1
    dashboard.screenshot("transactions")


def test_messages_page_finds_by_key_and_opens_the_trace(dashboard, server):
    topic, group = unique("traced"), unique("readers")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    sent = send(server, topic, json.dumps({"order": 7, "items": [1, 2]}), key="order-7")
    consume(server, group, topic, 1)
    page = dashboard.open("messages", "messages")
    form = page.locator("#by-key")
    form.locator("input[name=topic]").fill(topic)
    form.locator("input[name=key]").fill("order-7")
    form.get_by_role("button", name="find by key").click()
    page.locator(f"#results a:text-is('{sent['message_id']}')").click()
    dashboard.wait_loaded("message")
    body = page.locator("#body").inner_text()
    assert json.loads(body) == {"order": 7, "items": [1, 2]} and "\n" in body  # pretty JSON
    page.click("#view-hex")
    assert page.locator("#body").inner_text().startswith("00000000  7b 22")
    page.click("#view-text")
    assert page.locator("#body").inner_text() == json.dumps({"order": 7, "items": [1, 2]})
    trace = page.locator("#trace").inner_text()
    assert f"stored in {topic} queue 0 at offset 0" in trace
    assert f"delivered to group {group} (attempt 1)" in trace
    assert f"acked by group {group} (attempt 1)" in trace
    dashboard.screenshot("message")


def test_messages_page_finds_by_id_and_by_time_range_with_a_filter(dashboard, server):
    topic = unique("ranged")
    server.create_topic(topic, queues=1)
    red = api(server, "POST", f"/v1/topics/{topic}/messages", {"body": "r", "tag": "red"})
    blue = api(server, "POST", f"/v1/topics/{topic}/messages", {"body": "b", "tag": "blue"})
    page = dashboard.open("messages", "messages")
    by_id = page.locator("#by-id")
    by_id.locator("input[name=id]").fill(blue["message_id"])
    by_id.get_by_role("button", name="find by id").click()
    page.wait_for_selector(f"#results a:text-is('{blue['message_id']}')")
    assert page.locator("#results tbody tr").count() == 1

    def found() -> list[list[str]]:
        rows = page.locator("#results tbody tr")
        return [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]

    form = page.locator("#by-time")
    form.locator("input[name=topic]").fill(topic)
    form.locator("input[name=begin]").fill(
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 600))
    )
    form.locator("select[name=filter_type]").select_option("tag")
    form.locator("input[name=filter]").fill("red")
    form.get_by_role("button", name="find in time range").click()
    page.wait_for_selector(f"#results a:text-is('{red['message_id']}')")
    assert [(r[0], r[4]) for r in found()] == [(red["message_id"], "red")]
    # The same range with an SQL92 filter on the tag.
    form.locator("select[name=filter_type]").select_option("sql92")
    form.locator("input[name=filter]").fill("TAGS = 'blue'")
    form.get_by_role("button", name="find in time range").click()
    page.wait_for_selector(f"#results a:text-is('{blue['message_id']}')")
    assert [(r[0], r[4]) for r in found()] == [(blue["message_id"], "blue")]
    # A range that ends before both: nothing.
    form.locator("input[name=end]").fill(
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 300))
    )
    form.get_by_role("button", name="find in time range").click()
    page.wait_for_selector("#results:has-text('no message found')")


def test_cluster_page_shows_the_single_broker(dashboard, server):
    page = dashboard.open("cluster", "cluster")
    brokers = page.locator("#cluster-brokers tbody tr")
    assert brokers.count() == 1
    cells = brokers.first.locator("td").all_inner_texts()
    name = api(server, "GET", "/v1/broker/status")["name"]
    assert cells[:4] == [name, "master", "up", server.grpc], cells
    # One broker on its own has no replicas, and the page says where they would be shown.
    assert "no replicas" in page.locator("#no-replication").inner_text()
    assert page.locator("section.broker-group").count() == 0


def test_an_unreachable_broker_is_said_plainly(dashboard, server):
    page = dashboard.open("overview", "overview")
    page.route("**/v1/**", lambda route: route.abort())
    page.wait_for_selector("#banner:not([hidden])", timeout=15_000)
    assert "unreachable" in page.locator("#banner").inner_text()
    assert page.locator("#connection").inner_text() == "broker unreachable"
    # The refused requests themselves are logged by the browser: expected here.
    dashboard.errors[:] = [e for e in dashboard.errors if "net::ERR_FAILED" not in e]


def test_a_read_aborted_once_by_a_network_change_is_tried_again(dashboard, server):
    # Chromium aborts every request in flight when the host's addresses change; the dashboard's
    # next GET must not greet the operator with "unreachable" for it.
    aborted: list[str] = []

    def abort_first(route) -> None:
        if not aborted:
            aborted.append(route.request.url)
            route.abort("connectionreset")
        else:
            route.continue_()

    dashboard.page.route("**/v1/broker/status", abort_first)
    page = dashboard.open("overview", "overview")
    assert aborted, "the page read no broker status"
    assert page.locator("#banner").is_hidden()
    assert page.locator("#connection").inner_text() == "broker reachable"
    dashboard.errors[:] = [e for e in dashboard.errors if "net::ERR_CONNECTION_RESET" not in e]
