"""The Definitions page: export downloads the API's document; import applies a file, and a
file with an error is refused whole, with nothing applied. Through chromium against a real
``halfmoon serve``."""

from __future__ import annotations

import json

from tests.dashboard.test_pages import api, unique


def names(server, kind: str) -> set[str]:
    return {entry["name"] for entry in api(server, "GET", "/v1/definitions")[kind]}


def test_export_downloads_the_definitions(dashboard, server, tmp_path):
    topic, group = unique("exported"), unique("exported-g")
    server.create_topic(topic, queues=2)
    server.create_group(group, max_delivery_attempts=7)
    page = dashboard.open("definitions", "definitions")
    with page.expect_download() as download:
        page.click("#export")
    saved = tmp_path / "definitions.json"
    download.value.save_as(saved)
    document = json.loads(saved.read_text())
    assert document["halfmoon_definitions"] == 1
    assert {"name": topic, "message_type": "normal", "queue_count": 2, "perm": "rw",
            "trace": True} in document["topics"]  # fmt: skip
    assert any(g["name"] == group and g["max_delivery_attempts"] == 7 for g in document["groups"])
    assert "exported" in page.locator("#done").inner_text()


def test_import_applies_a_file_and_refuses_a_bad_one_whole(dashboard, server, tmp_path):
    document = api(server, "GET", "/v1/definitions")
    topic, group = unique("imported"), unique("imported-g")
    good = tmp_path / "good.json"
    good.write_text(json.dumps({**document, "topics": [{"name": topic, "queue_count": 3}],
                                "groups": [{"name": group, "fifo": True}]}))  # fmt: skip
    page = dashboard.open("definitions", "definitions")
    page.set_input_files("#import input[name=file]", str(good))
    page.click("#import button")
    page.wait_for_selector("#done:has-text('imported good.json')")
    assert topic in page.locator("#import-result").inner_text()
    assert topic in names(server, "topics") and group in names(server, "groups")
    dashboard.screenshot("imported")

    later, bad = unique("never"), tmp_path / "bad.json"
    refused = [{"name": group, "consume_from": "yesterday"}]
    bad.write_text(
        json.dumps({**document, "topics": [{"name": later, "queue_count": 1}], "groups": refused})
    )
    page.set_input_files("#import input[name=file]", str(bad))
    page.click("#import button")
    page.wait_for_selector("#banner:has-text('INVALID_DEFINITIONS')")
    assert "nothing was imported" in page.locator("#import-result").inner_text()
    assert later not in names(server, "topics")  # the good entry before the bad one: not applied
    assert page.locator("#done").is_hidden()
    assert dashboard.errors and all("status of 400" in e for e in dashboard.errors)  # the refusal
    dashboard.errors.clear()
