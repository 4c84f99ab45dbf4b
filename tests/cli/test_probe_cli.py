"""``halfmoon probe send`` against a real server; the progress bar and percentiles on their own."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator

import pytest

from halfmoon.cli.probe_commands import parse_size, percentile, summarize
from halfmoon.cli.progress import ProgressBar
from tests.cli.test_cli import failed, ok, unique
from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def stored(server: ServerProcess, topic: str) -> int:
    code, answer = server.admin_call("GET", f"/v1/topics/{topic}/status")
    assert code == 200, answer
    return sum(q["max_offset"] for q in answer["queues"])  # type: ignore[index]


def test_probe_sends_n_messages_and_reports_percentiles(server):
    topic = unique("probe")
    server.create_topic(topic, queues=2)
    # No --grpc: the address comes from the admin API.
    data = json.loads(
        ok(
            server.cli(
                "probe",
                "send",
                topic,
                "--count",
                "40",
                "--size",
                "2KiB",
                "--concurrency",
                "4",
                "--json",
            )
        )
    )
    assert (data["sent"], data["failed"], data["size"], data["address"]) == (
        40,
        0,
        2048,
        server.grpc,
    )
    rts = [data[k] for k in ("rt_min", "rt_p50", "rt_p90", "rt_p99", "rt_p99_9", "rt_max")]
    assert rts == sorted(rts) and rts[0] > 0
    assert data["throughput_per_s"] > 0
    assert stored(server, topic) == 40

    code, found = server.admin_call("GET", f"/v1/topics/{topic}/scan?limit=1")
    assert found["messages"][0]["body_size"] == 2048 and found["messages"][0]["tag"] == "probe"  # type: ignore[index]


def test_probe_table_for_people(server):
    topic = unique("probe")
    server.create_topic(topic, queues=1)
    out = ok(server.cli("probe", "send", topic, "--count", "5", "--grpc", server.grpc))
    fields = dict(line.split(":", 1) for line in out.strip().splitlines())
    assert fields["sent"].strip() == "5" and fields["failed"].strip() == "0"
    assert fields["rt p50"].strip().endswith(" ms") and fields["rt p99.9"].strip().endswith(" ms")
    assert stored(server, topic) == 5


def test_probe_errors_are_one_line(server):
    line = failed(server.cli("probe", "send", "nope", "--count", "1"))
    assert "cannot probe 'nope'" in line and line.endswith("(TOPIC_NOT_FOUND)")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = failed(
        server.cli(
            "probe",
            "send",
            "t",
            "--count",
            "1",
            "--grpc",
            f"127.0.0.1:{port}",
            "--timeout",
            "1s",
        )
    )
    assert f"127.0.0.1:{port}" in line
    assert "bad size '3 parsecs'" in failed(
        server.cli("probe", "send", "t", "--size", "3 parsecs"), status=2
    )
    assert "must be 1 byte to 4 MiB" in failed(
        server.cli("probe", "send", "t", "--size", "5MiB"), status=2
    )


def test_sizes_and_percentiles():
    assert (parse_size("512"), parse_size("1KiB"), parse_size("1k"), parse_size("2MiB")) == (
        512,
        1024,
        1024,
        2 << 20,
    )
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (50, 90, 99, 99.9, 100)] == [
        50.0,
        90.0,
        99.0,
        100.0,
        100.0,
    ]
    assert percentile([7.0], 50) == 7.0
    report = summarize([], failures=3, elapsed_s=1.0, size=10)
    assert (report["sent"], report["failed"], report["rt_p50"]) == (0, 3, None)


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_and_erases_itself():
    stream = FakeTty()
    with ProgressBar(200, "sending", stream=stream) as bar:
        bar.update(50, force=True)
        assert stream.getvalue().endswith(
            "sending [#######.......................]  50/200  25%\x1b[K"
        )
        bar.update(60)  # within the redraw interval: not drawn
        assert "60/200" not in stream.getvalue()
    assert stream.getvalue().endswith("\r\x1b[K")


def test_progress_bar_is_silent_off_a_terminal_and_counts_without_a_total():
    quiet = io.StringIO()
    with ProgressBar(10, "x", stream=quiet) as bar:
        bar.update(5, force=True)
    assert quiet.getvalue() == ""
    assert ProgressBar(None, "scanning", stream=quiet, enabled=True).render() == "scanning  0"
