"""What an operator of RabbitMQ's management UI or rocketmq-dashboard expects of the pages:
times with their zone, labelled forms, system topics apart, an action that says it
happened, a failed page that does not show the previous one, and consumer groups managed
from the page. Each through chromium against a real ``halfmoon serve``."""

from __future__ import annotations

import re

from tests.dashboard.test_pages import api, consume, send, unique
from tests.server.conftest import wait_until

ZONED_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (UTC|GMT[+-]?\d*|[A-Z]{2,5})$")


def test_message_times_are_readable_with_their_zone(dashboard, server):
    topic = unique("stamped")
    server.create_topic(topic, queues=1)
    sent = send(server, topic, "when")
    page = dashboard.open(f"message?id={sent['message_id']}&topic={topic}", "message")
    rows = page.locator("main section", has_text="Properties").locator("tbody tr")
    fields = dict(
        zip(
            rows.locator("td:nth-child(1)").all_inner_texts(),
            rows.locator("td:nth-child(2)").all_inner_texts(),
            strict=True,
        )
    )
    for name in ("born_timestamp", "store_timestamp"):
        shown, raw = fields[name].rsplit(" (", 1)
        assert ZONED_TIME.match(shown), fields[name]
        assert raw.rstrip(")").isdigit()
    assert all(value != "" for value in fields.values()), fields  # no empty rows
    when = page.locator("#trace li .when").first.inner_text()
    assert ZONED_TIME.match(when), when


def test_system_topics_are_behind_a_toggle(dashboard, server):
    group = unique("dlq-owner")
    user_topic = f"{group}-orders"
    server.create_topic(user_topic, queues=1)
    server.create_group(group, max_delivery_attempts=1)
    send(server, user_topic, "poison")
    consume(server, group, user_topic, 1, ack=False)  # one attempt, then %DLQ%group
    wait_until(
        lambda: server.admin_call("GET", f"/v1/topics/%25DLQ%25{group}/status")[0] == 200,
        30,
        "the dead-letter topic",
    )
    page = dashboard.open(f"topics?search={group}", "topics")
    names = page.locator("#topic-list tbody tr td:first-child").all_inner_texts()
    assert names == [user_topic]
    assert "1 system topic(s) on this page hidden" in page.locator("#hidden-system").inner_text()
    page.locator("#show-system").check()
    page.wait_for_function("() => location.hash.includes('system=1')")
    dashboard.wait_loaded("topics")
    page.wait_for_function("() => document.querySelectorAll('#topic-list tbody tr').length === 2")
    names = page.locator("#topic-list tbody tr td:first-child").all_inner_texts()
    assert sorted(names) == sorted([user_topic, f"%DLQ%{group}"])


def test_forms_have_labels_and_the_reset_time_has_no_default(dashboard, server):
    topic, group = unique("labelled"), unique("labellers")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    page = dashboard.open("topics", "topics")
    for name in ("name", "message_type", "queue_count"):
        control = page.locator(f"#create-topic [name={name}]")
        assert control.evaluate("c => c.closest('label') !== null"), name
    page = dashboard.open(f"group?name={group}", "group")
    time_input = page.locator("#reset-offset input[name=time]")
    assert time_input.input_value() == ""  # "now" would skip the backlog
    assert time_input.evaluate(
        "c => c.required && c.closest('label').textContent.startsWith('time')"
    )


def test_consumer_groups_are_created_changed_and_deleted_from_the_page(dashboard, server):
    group = unique("managed")
    page = dashboard.open("groups", "groups")
    form = page.locator("#create-group")
    form.locator("input[name=name]").fill(group)
    form.locator("input[name=max_delivery_attempts]").fill("5")
    form.locator("select[name=consume_from]").select_option("earliest")
    form.get_by_role("button", name="create group").click()
    dashboard.wait_loaded("group")
    page.wait_for_selector(f"main h2:has-text('Consumer group {group}')")
    assert page.locator("#done").inner_text() == f"created consumer group {group}"
    shown = api(server, "GET", f"/v1/groups/{group}")
    assert (shown["max_delivery_attempts"], shown["consume_from"]) == (5, "earliest")

    form = page.locator("#update-group")
    form.locator("input[name=max_delivery_attempts]").fill("3")
    form.get_by_role("button", name="update").click()
    page.wait_for_selector(f"#done:has-text('changed consumer group {group}')")
    assert api(server, "GET", f"/v1/groups/{group}")["max_delivery_attempts"] == 3

    page = dashboard.open(f"groups?search={group}", "groups")
    page.locator("#group-list tbody tr", has_text=group).get_by_role(
        "button", name="delete"
    ).click()
    page.wait_for_selector(f"#done:has-text('deleted consumer group {group}')")
    status, _ = server.admin_call("GET", f"/v1/groups/{group}")
    assert status == 404


def test_a_page_that_fails_to_load_does_not_show_the_previous_one(dashboard, server):
    topic = unique("previous")
    server.create_topic(topic, queues=1)
    page = dashboard.open(f"topic?name={topic}", "topic")
    assert page.locator("main h2").first.inner_text() == f"Topic {topic}"
    page.evaluate("location.hash = '#/group?name=no-such-group-here'")
    page.wait_for_selector("#load-failed")
    assert page.locator("main h2").first.inner_text() == "Consumer group"
    assert topic not in page.locator("main").inner_text()
    assert "CONSUMER_GROUP_NOT_FOUND" in page.locator("#banner").inner_text()
    # The browser logs the API's 404s on its console: expected here, and only those.
    assert dashboard.errors and all("status of 404" in e for e in dashboard.errors)
    dashboard.errors.clear()


def test_a_time_range_search_pages_past_100_results(dashboard, server):
    topic = unique("many")
    server.create_topic(topic, queues=2)
    sent = {send(server, topic, f"m{i}")["message_id"] for i in range(130)}
    page = dashboard.open("messages", "messages")
    form = page.locator("#by-time")
    form.locator("input[name=topic]").fill(topic)
    form.get_by_role("button", name="find in time range").click()
    page.wait_for_selector("#more")
    assert page.locator("#results tbody tr").count() == 100
    page.locator("#more").click()
    page.wait_for_selector("#all-shown")
    assert page.locator("#all-shown").inner_text() == "all 130 shown"
    ids = page.locator("#results tbody tr td:first-child").all_inner_texts()
    assert len(ids) == 130 and set(ids) == sent  # every message once, none twice
