"""A consumer group's backlog on the dashboard: peek at it without consuming, then purge it.

Through chromium against a real ``halfmoon serve``: the peek lists the messages the group
has not consumed and leaves its offsets and the messages where they were (a consumer
still gets every one afterwards); a purge asks first, then the group has nothing left,
while another group of the same topic keeps the whole backlog.
"""

from __future__ import annotations

from tests.dashboard.test_pages import api, consume, send, unique


def lag(server, group: str) -> int:
    return sum(q["lag"] for q in api(server, "GET", f"/v1/groups/{group}/progress")["queues"])


def backlog(server, group: str, topic: str) -> int:
    return api(server, "GET", f"/v1/groups/{group}/peek?topic={topic}")["backlog"]


def test_peek_shows_the_backlog_without_consuming_it(dashboard, server):
    topic, group = unique("peeked"), unique("peeker")
    server.create_topic(topic, queues=2)
    server.create_group(group)
    bodies = [f"order-{i}" for i in range(5)]
    for body in bodies:
        send(server, topic, body)
    consume(server, group, topic, 2)  # two consumed and acked: three left
    page = dashboard.open(f"group?name={group}", "group")
    page.click(f"a.peek:has-text('{topic}')")
    dashboard.wait_loaded("backlog")
    assert page.locator("#backlog-summary").inner_text().startswith("3 message(s) not yet consumed")
    shown = page.locator("#peeked tbody tr td:last-child").all_inner_texts()
    assert len(shown) == 3 and set(shown) <= set(bodies), shown
    dashboard.screenshot("backlog")
    page.reload()
    dashboard.wait_loaded("backlog")
    assert lag(server, group) == 3  # peeking twice moved nothing
    consume(server, group, topic, 3)  # and the group still gets all three


def test_purge_confirms_and_drops_one_groups_backlog_only(dashboard, server):
    topic, group, other = unique("purged"), unique("purger"), unique("bystander")
    server.create_topic(topic, queues=2)
    server.create_group(group)
    server.create_group(other)
    for i in range(4):
        send(server, topic, f"stale-{i}")
    page = dashboard.open(f"backlog?group={group}&topic={topic}", "backlog")
    # The first time the operator answers "no" to the confirmation.
    page.evaluate(
        "() => { window.realConfirm = window.confirm;"
        " window.confirm = (m) => { window.asked = m; window.confirm = window.realConfirm;"
        " return false; }; }"
    )
    page.click("#purge")
    asked = page.evaluate("() => window.asked")
    assert asked.startswith(f"Purge group {group}'s 4 message(s) in {topic}?"), asked
    assert backlog(server, group, topic) == 4  # declined: nothing purged
    page.click("#purge")  # the page's own handler accepts this time
    page.wait_for_selector("#done:has-text('purged 4 message(s)')")
    dashboard.wait_loaded("backlog")
    assert page.locator("#backlog-summary").inner_text().startswith("0 message(s)")
    assert "nothing left to consume" in page.locator("#peeked").inner_text()
    assert backlog(server, group, topic) == 0
    progress = api(server, "GET", f"/v1/groups/{group}/progress")["queues"]
    assert progress and all(q["committed_offset"] == q["max_offset"] for q in progress), progress
    answer = api(server, "GET", f"/v1/groups/{other}/peek?topic={topic}")
    assert answer["backlog"] == 4 and len(answer["messages"]) == 4
