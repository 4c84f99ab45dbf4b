"""``python -m halfmoon ...`` as a user runs it, against a real admin API and Broker.

Every command is run as a subprocess; for each: the table for people, the
``--json`` output, and errors (exit status, exactly one line on stderr).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import OutgoingMessage
from tests.cli.admin_harness import AdminServer

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture(scope="module")
def admin(tmp_path_factory) -> Iterator[AdminServer]:
    with AdminServer(tmp_path_factory.mktemp("metadata")) as server:
        yield server


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def halfmoon(
    *args: str,
    admin: AdminServer | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
    full_env.update(env or {})
    extra = ["--admin", admin.url] if admin is not None else []
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *args, *extra],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    assert result.stderr == ""
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The single stderr line of a failed command."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {result.stderr!r}"
    assert lines[0].startswith("halfmoon: error: ")
    assert result.stdout == ""
    return lines[0]


def failed_json(result: subprocess.CompletedProcess[str], status: int = 1) -> dict[str, str]:
    """The error object a failed ``--json`` command prints as its one stderr line."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {result.stderr!r}"
    assert result.stdout == ""
    return json.loads(lines[0])["error"]


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


# -- topics ------------------------------------------------------------------


def test_topic_create_prints_a_sentence_or_json(admin):
    name = unique("orders")
    out = ok(halfmoon("topic", "create", name, "--type", "fifo", "--queues", "4", admin=admin))
    assert out == f"created topic '{name}' (fifo, 4 queues, perm rw)\n"
    assert admin.broker.get_topic(name).queue_count == 4

    other = unique("events")
    data = json.loads(ok(halfmoon("topic", "create", other, "--perm", "r", "--json", admin=admin)))
    assert (data["name"], data["message_type"], data["perm"]) == (other, "normal", "r")
    assert data["queue_count"] == admin.broker.config.default_queue_count


def test_topic_list_table_and_json(admin):
    name = unique("listed")
    ok(halfmoon("topic", "create", name, "--type", "delay", "--queues", "2", admin=admin))
    rows = table(ok(halfmoon("topic", "list", admin=admin)))
    assert rows[0][:4] == ["NAME", "TYPE", "QUEUES", "PERM"]
    assert [name, "delay", "2", "rw"] == next(r for r in rows if r[0] == name)[:4]

    data = json.loads(ok(halfmoon("topic", "list", "--json", admin=admin)))
    assert {"name": name, "message_type": "delay", "queue_count": 2}.items() <= next(
        t for t in data["topics"] if t["name"] == name
    ).items()


def test_topic_describe_shows_queue_offsets(admin):
    name = unique("described")
    ok(halfmoon("topic", "create", name, "--queues", "2", admin=admin))
    admin.broker.send([OutgoingMessage(topic=name, body=b"x", queue_id=1) for _ in range(3)])

    out = ok(halfmoon("topic", "describe", name, admin=admin))
    assert "name:" in out and name in out
    rows = table(out.split("\n\n")[1])
    assert rows[0][:6] == ["QUEUE", "MIN", "OFFSET", "MAX", "OFFSET", "MESSAGES"]
    assert rows[1][:4] == ["0", "0", "0", "0"]
    assert rows[2][:4] == ["1", "0", "3", "3"]

    data = json.loads(ok(halfmoon("topic", "describe", name, "--json", admin=admin)))
    assert data["name"] == name
    assert [(q["queue_id"], q["max_offset"]) for q in data["queues"]] == [(0, 0), (1, 3)]


def test_topic_update_and_delete(admin):
    name = unique("changing")
    ok(halfmoon("topic", "create", name, "--queues", "2", admin=admin))
    out = ok(halfmoon("topic", "update", name, "--queues", "5", "--perm", "r", admin=admin))
    assert out == f"updated topic '{name}' (normal, 5 queues, perm r)\n"
    assert admin.broker.get_topic(name).queue_count == 5

    data = json.loads(
        ok(halfmoon("topic", "update", name, "--type", "mixed", "--json", admin=admin))
    )
    assert data["message_type"] == "mixed"

    assert ok(halfmoon("topic", "delete", name, admin=admin)) == f"deleted topic '{name}'\n"
    assert name not in [t.name for t in admin.broker.list_topics()]
    other = unique("gone")
    ok(halfmoon("topic", "create", other, admin=admin))
    assert json.loads(ok(halfmoon("topic", "delete", other, "--json", admin=admin))) == {
        "deleted": other
    }


def test_missing_topic_is_one_line_with_the_code(admin):
    for action in ("describe", "delete"):
        line = failed(halfmoon("topic", action, "nope", admin=admin))
        assert "'nope'" in line
        assert line.endswith("(TOPIC_NOT_FOUND)")
    line = failed(halfmoon("topic", "update", "nope", "--queues", "2", admin=admin))
    assert line.endswith("(TOPIC_NOT_FOUND)")


def test_broker_refusals_are_one_line(admin):
    name = unique("twice")
    ok(halfmoon("topic", "create", name, admin=admin))
    assert failed(halfmoon("topic", "create", name, admin=admin)).endswith("(TOPIC_EXISTS)")
    assert failed(halfmoon("topic", "create", "%DLQ%x", admin=admin)).endswith("(ILLEGAL_TOPIC)")
    # --json, anywhere on the line: the error is the admin API's error object.
    for args in (("topic", "describe", "nope", "--json"), ("--json", "topic", "describe", "nope")):
        error = failed_json(halfmoon(*args, admin=admin))
        assert error["code"] == "TOPIC_NOT_FOUND" and "nope" in error["message"]
    assert failed_json(halfmoon("--json", "topic", "frobnicate"), status=2)["code"] == "USAGE"
    assert json.loads(ok(halfmoon("--json", "topic", "list", admin=admin)))["topics"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("topic",), "required: ACTION"),
        (("topic", "create"), "required: NAME"),
        (("topic", "create", "t", "--type", "urgent"), "invalid choice: 'urgent'"),
        (("topic", "create", "t", "--queues", "0"), "expected a positive integer"),
        (("topic", "create", "t", "--queues", "many"), "expected a positive integer"),
        (("topic", "update", "t"), "nothing to update"),
        (("topic", "explode"), "invalid choice: 'explode'"),
        (("group", "create", "g", "--from", "middle"), "invalid choice: 'middle'"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, fragment):
    # Caught before any request: no admin API needed.
    line = failed(halfmoon(*args), status=2)
    assert fragment in line


# -- groups ------------------------------------------------------------------


def test_group_create_list_describe_delete(admin):
    name = unique("billing")
    out = ok(
        halfmoon(
            "group",
            "create",
            name,
            "--fifo",
            "--max-attempts",
            "5",
            "--from",
            "earliest",
            admin=admin,
        )
    )
    assert out == f"created group '{name}' (fifo on, max attempts 5, from earliest)\n"
    group = admin.broker.get_group(name)
    assert (group.fifo, group.max_delivery_attempts, group.consume_from) == (True, 5, "earliest")

    plain = unique("plain")
    data = json.loads(ok(halfmoon("group", "create", plain, "--json", admin=admin)))
    assert (data["name"], data["fifo"], data["max_delivery_attempts"], data["consume_from"]) == (
        plain,
        False,
        17,
        "auto",  # broker.default_consume_from
    )

    rows = table(ok(halfmoon("group", "list", admin=admin)))
    assert rows[0][:4] == ["NAME", "FIFO", "MAX", "ATTEMPTS"]
    assert next(r for r in rows if r[0] == name)[:4] == [name, "yes", "5", "earliest"]
    listed = json.loads(ok(halfmoon("group", "list", "--json", admin=admin)))
    assert {name, plain} <= {g["name"] for g in listed["groups"]}

    assert ok(halfmoon("group", "delete", name, admin=admin)) == f"deleted group '{name}'\n"
    assert name not in [g.name for g in admin.broker.list_groups()]
    assert json.loads(ok(halfmoon("group", "delete", plain, "--json", admin=admin))) == {
        "deleted": plain
    }


def test_group_describe_shows_lag_per_queue(admin):
    topic, group = unique("stream"), unique("reader")
    ok(halfmoon("topic", "create", topic, "--queues", "1", admin=admin))
    ok(halfmoon("group", "create", group, "--from", "earliest", admin=admin))
    admin.broker.send([OutgoingMessage(topic=topic, body=b"x") for _ in range(6)])
    views = admin.broker.receive(group, topic, FilterSpec(), 2, 60_000)
    admin.broker.ack(group, topic, views[0].receipt_handle)

    out = ok(halfmoon("group", "describe", group, admin=admin))
    assert "total lag: 5" in out
    progress = next(r for r in table(out) if r[:1] == [topic])
    # 4 ready, 1 in flight, not retried
    assert progress == [topic, "0", "1", "6", "5", "4", "1", "0"]

    data = json.loads(
        ok(halfmoon("group", "describe", group, "--topic", topic, "--json", admin=admin))
    )
    assert data["name"] == group
    assert [(q["committed_offset"], q["lag"], q["inflight"]) for q in data["progress"]] == [
        (1, 5, 1)
    ]


def test_group_errors(admin):
    assert failed(halfmoon("group", "describe", "ghost", admin=admin)).endswith(
        "(CONSUMER_GROUP_NOT_FOUND)"
    )
    assert failed(halfmoon("group", "delete", "ghost", admin=admin)).endswith(
        "(CONSUMER_GROUP_NOT_FOUND)"
    )
    name = unique("dup")
    ok(halfmoon("group", "create", name, admin=admin))
    assert failed(halfmoon("group", "create", name, admin=admin)).endswith(
        "(CONSUMER_GROUP_EXISTS)"
    )
    # Refused when created, not when its first message is dead-lettered.
    line = failed(halfmoon("group", "create", "g" * 121, admin=admin))
    assert "at most 120" in line and line.endswith("(ILLEGAL_CONSUMER_GROUP)")


# -- status and the admin address ------------------------------------------------


def test_status_human_and_json(admin):
    out = ok(halfmoon("status", admin=admin))
    assert "broker:" in out and "halfmoon" in out
    assert "topics:" in out
    data = json.loads(ok(halfmoon("status", "--json", admin=admin)))
    assert data["topics"] == len(admin.broker.list_topics())
    assert data["groups"] == len(admin.broker.list_groups())


def test_admin_address_defaults_to_the_environment(admin):
    data = json.loads(ok(halfmoon("status", "--json", env={"HALFMOON_ADMIN": admin.url})))
    assert data["name"] == "halfmoon"


def test_unreachable_admin_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = failed(halfmoon("topic", "list", "--admin", f"http://127.0.0.1:{port}"))
    assert f"cannot reach the admin API at http://127.0.0.1:{port}" in line
    assert line.endswith("(UNAVAILABLE)")
    line = failed(halfmoon("status", "--admin", "localhost:8082"))
    assert "expected http://HOST:PORT" in line


# -- serve -------------------------------------------------------------------


def test_serve_print_config_applies_every_layer_in_order(tmp_path):
    toml = tmp_path / "halfmoon.toml"
    toml.write_text(
        '[broker]\nname = "file"\ndefault_queue_count = 2\n[store]\nflush = "async"\n'
        '[server]\ntick_interval = "250ms"\n'
    )
    out = ok(
        halfmoon(
            "serve",
            "--config",
            str(toml),
            "--data-dir",
            str(tmp_path / "d"),
            "--flush",
            "sync",
            "--listen",
            "127.0.0.1:9991",
            "--set",
            "broker.name=set",
            "--set",
            "broker.max_body_size=1MiB",
            "--print-config",
            env={
                "HALFMOON_BROKER_NAME": "env",
                "HALFMOON_BROKER_DEFAULT_QUEUE_COUNT": "5",
                "HALFMOON_SERVER_LISTEN": "127.0.0.1:9990",
            },
        )
    )
    config = json.loads(out)
    assert config["broker"]["name"] == "set"
    assert config["broker"]["default_queue_count"] == 5
    assert config["broker"]["max_body_size"] == 1024 * 1024
    assert config["store"]["flush"] == "sync"
    assert config["store"]["data_dir"] == str(tmp_path / "d")
    assert config["server"]["listen"] == "127.0.0.1:9991"
    assert config["server"]["tick_interval"] == 0.25


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (("--set", "broker.queues=4"), {}, "unknown configuration key 'broker.queues'"),
        (("--set", "server.tick_interval=soon"), {}, "bad value 'soon' for server.tick_interval"),
        (("--set", "store.segment_size=100"), {}, "segment_size must be a multiple of 4096"),
        ((), {"HALFMOON_STORE_FLUSH": "sometimes"}, "HALFMOON_STORE_FLUSH"),
        (("--config", "/nonexistent/halfmoon.toml"), {}, "cannot read config file"),
        (("--flush", "never"), {}, "invalid choice: 'never'"),
    ],
)
def test_serve_refuses_bad_configuration_before_starting(args, env, fragment):
    line = failed(halfmoon("serve", *args, "--print-config", env=env), status=2)
    assert fragment in line


@pytest.mark.parametrize("taken", ["--listen", "--admin-listen"])
def test_serve_on_a_taken_port_stops_with_one_clear_line(tmp_path, taken):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = f"127.0.0.1:{holder.getsockname()[1]}"
        ports = {"--listen": "127.0.0.1:0", "--admin-listen": "127.0.0.1:0"}
        ports[taken] = busy
        result = halfmoon(
            "serve", "--data-dir", str(tmp_path / "data"), "--set", "store.segment_size=4MiB",
            *(arg for pair in ports.items() for arg in pair),
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("halfmoon: error: cannot start:"), last
    assert last.endswith("(UNAVAILABLE)") and busy.split(":")[1] in last, last


def test_serve_runs_the_admin_api_the_cli_talks_to(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "halfmoon", "serve", "--data-dir", str(tmp_path / "data"),
         "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--amqp-listen", "127.0.0.1:0", "--flush", "async", "--set", "store.segment_size=4MiB"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")},
    )  # fmt: skip
    ready = threading.Event()
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "halfmoon ready" in line:  # not "already in use"
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        while not ready.wait(0.05):
            assert proc.poll() is None, "serve exited early:\n" + "".join(lines)
            assert time.monotonic() < deadline, "serve not ready in 30 s:\n" + "".join(lines)
        admin = re.search(r"\badmin=(\S+)", next(x for x in lines if "halfmoon ready" in x))
        assert admin is not None, lines
        url = f"http://{admin.group(1)}"  # the port it bound, as the ready line reports it
        ok(halfmoon("topic", "create", "orders", "--queues", "3", "--admin", url))
        data = json.loads(ok(halfmoon("topic", "list", "--json", "--admin", url)))
        assert [t["name"] for t in data["topics"]] == ["orders"]
        assert json.loads(ok(halfmoon("status", "--json", "--admin", url)))["topics"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert status == 0, "".join(lines)
    # The topic survives a restart (metadata is on disk).
    assert (tmp_path / "data").exists()
