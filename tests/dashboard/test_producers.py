"""The Producers page and the Overview's client counts, with a real official-client producer
process: listed with its language, version, address and send rate while it runs, and gone
from both pages soon after a SIGKILL (its telemetry stream ends with its socket), as
``halfmoon producer status`` says too. Through chromium against a real ``halfmoon serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.dashboard.test_pages import api, unique
from tests.server.conftest import ROOT

# Sends `count` messages, says so, then waits to be killed.
_PRODUCER = r"""
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer

endpoint, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
producer = Producer(config, topics=(topic,))
producer.startup()
for i in range(count):
    msg = Message()
    msg.topic = topic
    msg.body = b"tick %d" % i
    producer.send(msg)
print("SENT", flush=True)
sys.stdin.read()  # until killed
"""


def test_producers_page_lists_a_live_producer_and_drops_a_killed_one(dashboard, server):
    topic = unique("produced")
    server.create_topic(topic, queues=1)
    child = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, server.grpc, topic, "30"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "SENT", "the producer did not send"
        page = dashboard.open("producers", "producers")
        row = page.locator("main tbody tr", has_text=topic)
        row.wait_for()
        cells = row.locator("td").all_inner_texts()
        header = page.locator("main thead th").all_inner_texts()
        shown = dict(zip(header, cells, strict=True))
        assert shown["language"] == "PYTHON" and shown["version"], shown
        assert shown["address"].startswith("127.0.0.1"), shown
        assert shown["sent"] == "30", shown
        rate = float(shown["send rate"].removesuffix(" msg/s"))
        assert rate > 0, shown
        dashboard.screenshot("producers")
        overview = dashboard.open("overview", "overview")
        status = api(server, "GET", "/v1/broker/status")
        assert overview.locator("#clients .value").inner_text() == str(status["clients"])
        assert overview.locator("#producers .value").inner_text() == str(status["producers"])
        assert status["producers"] >= 1
        before = status["clients"]
    finally:
        child.kill()  # SIGKILL: no goodbye, only the socket's end
        child.wait(10)
    # The Overview redraws every 5 s: the killed producer leaves its count, not 5 min later.
    page.wait_for_function(
        "(n) => Number(document.querySelector('#clients .value').textContent) === n",
        arg=before - 1,
        timeout=30_000,
    )
    done = server.cli("producer", "status", topic, "--json")
    assert json.loads(done.stdout)["clients"] == [], done.stdout
    page = dashboard.open("producers", "producers")
    assert page.locator("main tbody tr", has_text=topic).count() == 0
