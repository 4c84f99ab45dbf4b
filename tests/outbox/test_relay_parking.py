"""Permanent publish failures are parked at once with their reason (and replayed on request);
an empty payload is refused when added; a busy aggregate drains at the relay's rate."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select

from halfmoon.client.errors import TopicNotFound
from halfmoon.outbox import (
    HalfmoonTarget,
    Outbox,
    OutboxMessage,
    OutboxRecord,
    RabbitTarget,
    Relay,
)
from halfmoon.outbox.errors import InvalidOutboxMessage
from tests.outbox.conftest import RecordingTarget, ServerProcess, wait_until


class _Refusing(RecordingTarget):
    """Publishes every message but those of topic ``missing``, which it refuses as halfmoon
    does a topic that does not exist."""

    def publish(self, records: Sequence[OutboxRecord]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        for record in records:
            if record.topic == "missing":
                results.append(TopicNotFound("topic missing does not exist"))
            else:
                results.extend(super().publish([record]))
        return results


def _add(outbox: Outbox, *messages: OutboxMessage) -> list[str]:
    with outbox.engine.begin() as conn:
        return outbox.add_many(conn, messages)


def _status(outbox: Outbox, message_id: str) -> tuple[str, int, str | None]:
    t = outbox.table
    with outbox.engine.connect() as conn:
        row = conn.execute(
            select(t.c.status, t.c.attempts, t.c.last_error).where(t.c.message_id == message_id)
        ).one()
    return row.status, row.attempts, row.last_error


def test_an_empty_payload_is_refused_when_added(outbox: Outbox) -> None:
    with pytest.raises(InvalidOutboxMessage, match="empty payload") as raised:
        _add(outbox, OutboxMessage("orders", b""))
    assert raised.value.code == "OUTBOX_INVALID_MESSAGE"
    assert outbox.status().pending == 0


def test_a_permanent_failure_is_parked_at_once_and_replayed_on_request(
    outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    target = _Refusing()
    (lost,) = _add(outbox, OutboxMessage("missing", b"x", aggregate_id="A"))
    (other,) = _add(outbox, OutboxMessage("orders", b"y", aggregate_id="B"))
    relay = Relay(outbox, target, listen=False)
    with caplog.at_level(logging.INFO, logger="halfmoon.outbox"):
        relay.run_once()
    status, attempts, error = _status(outbox, lost)
    assert (status, attempts) == ("failed", 1)  # no retries: one attempt, parked
    assert error is not None and error.startswith("permanent TOPIC_NOT_FOUND")
    parked = [r for r in caplog.records if "event=outbox_message_parked" in r.getMessage()]
    assert len(parked) == 1 and parked[0].levelno == logging.WARNING
    assert "reason=TOPIC_NOT_FOUND" in parked[0].getMessage()
    assert _status(outbox, other)[0] == "sent"
    assert [m["message_id"] for m in outbox.failed_messages()] == [lost]
    assert relay.stats().failed == 1
    assert outbox.retry_failed([lost]) == 1
    assert _status(outbox, lost)[:2] == ("pending", 0)


def test_a_busy_aggregate_drains_at_the_relays_rate_not_one_message_per_poll(
    outbox: Outbox,
) -> None:
    target = RecordingTarget()
    ids = _add(outbox, *(OutboxMessage("t", f"{i}".encode(), aggregate_id="A") for i in range(20)))
    # A poll of a minute: at one message per poll this would take 19 minutes.
    with Relay(outbox, target, workers=1, poll_interval=60, listen=False):
        wait_until(lambda: outbox.status().pending == 0, 30, "one aggregate's 20 messages")
    assert target.ids() == ids  # in order


def test_the_cli_lists_and_replays_parked_messages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parked.db'}"
    outbox = Outbox(url)
    outbox.create_tables()
    (lost,) = _add(outbox, OutboxMessage("missing", b"x", aggregate_id="A"))
    Relay(outbox, _Refusing(), listen=False).run_once()

    def cli(*args: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-m", "halfmoon", "outbox", *args, "--db", url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    listed = cli("parked")["messages"]
    assert isinstance(listed, list) and [m["message_id"] for m in listed] == [lost]
    assert "TOPIC_NOT_FOUND" in listed[0]["last_error"]
    assert cli("replay", lost) == {"replayed": 1}
    assert cli("parked") == {"messages": []}
    assert _status(outbox, lost)[0] == "pending"
    outbox.engine.dispose()


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that creates no topic on its own: a send to an unknown one is refused."""
    server = ServerProcess(tmp_path_factory.mktemp("strict")).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_real_servers_permanent_refusals_are_parked(
    strict_server: ServerProcess, outbox: Outbox, table_prefix: str
) -> None:
    topic = f"{table_prefix}orders"
    strict_server.create_topic(topic)
    unknown, too_large, fine = _add(
        outbox,
        OutboxMessage(f"{table_prefix}nowhere", b"x", aggregate_id="A"),
        OutboxMessage(topic, b"z" * (5 * 1024 * 1024), aggregate_id="B"),
        OutboxMessage(topic, b"ok", aggregate_id="C"),
    )
    with Relay(outbox, HalfmoonTarget(f"halfmoon://{strict_server.grpc}"), listen=False) as relay:
        wait_until(lambda: outbox.status().pending == 0, 30, "every row to be settled")
    assert _status(outbox, fine)[0] == "sent"
    for message_id, code in ((unknown, "TOPIC_NOT_FOUND"), (too_large, "MESSAGE_BODY_TOO_LARGE")):
        status, attempts, error = _status(outbox, message_id)
        assert (status, attempts) == ("failed", 1), (message_id, error)
        assert error is not None and error.startswith(f"permanent {code}"), error
    assert relay.stats().failed == 2


def test_rabbitmqs_permanent_refusals_are_parked(amqp_url: str, tmp_path: Path) -> None:
    outbox = Outbox(f"sqlite:///{tmp_path / 'rabbit.db'}")
    outbox.create_tables()
    unroutable, no_exchange = _add(
        outbox,
        OutboxMessage("", b"x", aggregate_id="A", routing_key=f"nobody-{uuid.uuid4().hex}"),
        OutboxMessage(f"no-exchange-{uuid.uuid4().hex}", b"y", aggregate_id="B"),
    )
    with Relay(outbox, RabbitTarget(amqp_url), listen=False):
        wait_until(lambda: outbox.status().pending == 0, 30, "both rows to be settled")
    for message_id, code in ((unroutable, "OUTBOX_UNROUTABLE"), (no_exchange, "NOT_FOUND")):
        status, attempts, error = _status(outbox, message_id)
        assert (status, attempts) == ("failed", 1), (message_id, error)
        assert error is not None and error.startswith(f"permanent {code}"), error
    outbox.engine.dispose()
