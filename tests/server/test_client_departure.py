"""A client that dies leaves the connected-client counts at once, not after the idle timeout.

An official client holds one telemetry stream for its whole life; SIGKILL closes its
socket, which ends the stream. The Overview's counts (``GET /v1/broker/status``) and
``halfmoon producer status`` must agree on who is connected, so both drop the
producer as soon as its stream has ended — not after SESSION_IDLE_SECONDS (300 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.server.conftest import ROOT, ServerProcess, unique
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

# A producer that sends one message, says so, and waits to be killed.
_PRODUCER = r"""
import sys
from rocketmq import ClientConfiguration, Credentials, Message, Producer

endpoint, topic = sys.argv[1], sys.argv[2]
config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
producer = Producer(config, topics=(topic,))
producer.startup()
msg = Message()
msg.topic = topic
msg.body = b"hello"
producer.send(msg)
print("SENT", flush=True)
sys.stdin.read()  # until killed
"""


def counts(server: ServerProcess) -> tuple[int, int]:
    code, body = server.admin_call("GET", "/v1/broker/status")
    assert code == 200, body
    return body["clients"], body["producers"]  # type: ignore[index]


def producer_status(server: ServerProcess, topic: str) -> list[dict]:
    done = server.cli("producer", "status", topic, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["clients"]


def test_a_sigkilled_producer_leaves_the_counts_promptly(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory().start()
    topic = unique("departing")
    server.create_topic(topic)
    assert counts(server) == (0, 0)
    child = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, server.grpc, topic],
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
        wait_until(lambda: counts(server) == (1, 1), 30, "the producer to be counted")
        listed = producer_status(server, topic)
        assert len(listed) == 1 and listed[0]["language"] == "PYTHON", listed
    finally:
        child.kill()  # SIGKILL: no NotifyClientTermination, only the socket's end
        child.wait(10)
    # Well inside the 300 s idle timeout that used to keep it listed.
    wait_until(lambda: counts(server) == (0, 0), 30, "the killed producer to leave the counts")
    assert producer_status(server, topic) == []
