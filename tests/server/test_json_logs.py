"""``halfmoon serve --log-format json``: every line a real server writes is one JSON object."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.server.conftest import ServerProcess, unique


class _FlaggedServer(ServerProcess):
    def __init__(self, data_dir: Path, flags: tuple[str, ...], **kwargs: object) -> None:
        super().__init__(data_dir, **kwargs)  # type: ignore[arg-type]
        self._flags = flags

    def command(self) -> list[str]:
        return [*super().command(), *self._flags]


def _objects(lines: list[str]) -> list[dict]:
    objects = []
    for line in lines:
        try:
            objects.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return objects


def test_every_line_is_json_and_the_ready_event_has_its_fields(tmp_path: Path):
    server = _FlaggedServer(tmp_path / "data", ("--log-format", "json")).start()
    try:
        topic = unique("json-logs")
        server.create_topic(topic)
        server.cli("message", "send", topic, "--body", "hello")
        code, _ = server.admin_call("GET", "/v1/topics/no-such-topic")
        assert code == 404
    finally:
        assert server.stop() == 0
    objects = _objects(server.lines)
    ready = [o for o in objects if o.get("message") == "halfmoon ready"]
    assert len(ready) == 1, objects
    event = ready[0]
    assert event["level"] == "INFO" and event["logger"] == "halfmoon.server"
    assert event["grpc"] == server.grpc
    assert event["admin"] == f"127.0.0.1:{server.admin_port}"
    assert event["dashboard"] == f"http://127.0.0.1:{server.admin_port}/dashboard/"
    assert event["data"] == str(tmp_path / "data")
    assert (event["auth"], event["tls"]) == ("off", "disabled")
    assert isinstance(event["startup_ms"], int)
    events = [o.get("event") for o in objects]
    for name in ("recovery", "signal", "shutdown_begin", "stopped"):
        assert name in events, events


def test_format_from_the_config_file_and_level_from_the_environment(tmp_path: Path):
    config = tmp_path / "halfmoon.toml"
    config.write_text('[log]\nformat = "json"\nlevel = "warning"\n')
    server = _FlaggedServer(
        tmp_path / "data",
        ("--config", str(config)),
        env={"HALFMOON_LOG_LEVEL": "debug"},  # the environment beats the file
    ).start()
    assert server.stop() == 0
    objects = _objects(server.lines)
    levels = {o["level"] for o in objects}
    assert "DEBUG" in levels and "INFO" in levels, levels
    assert any(o.get("message") == "halfmoon ready" for o in objects)


def test_a_level_leaves_out_what_is_less_severe():
    script = (
        "import logging\n"
        "from halfmoon.logs import LogConfig, configure_logging\n"
        "configure_logging(LogConfig(level='warning', format='json'))\n"
        "logging.getLogger('halfmoon.x').info('event=quiet')\n"
        "logging.getLogger('halfmoon.x').warning('event=loud n=%d', 2)\n"
        "import warnings; warnings.warn('careful')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    objects = _objects(done.stderr.splitlines())
    assert [o.get("event") for o in objects] == ["loud", None]
    assert objects[0]["n"] == 2
    assert "careful" in objects[1]["message"]


def test_a_server_that_cannot_start_says_why_in_json(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable, "-m", "halfmoon", "serve", "--data-dir", str(tmp_path / "d"),
                "--listen", f"127.0.0.1:{port}", "--admin-listen", "127.0.0.1:0",
                "--log-format", "json",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode != 0
    objects = _objects(done.stderr.splitlines())
    last = objects[-1]
    assert (last["level"], last["event"]) == ("ERROR", "start_failed"), objects
    assert last["code"] == "UNAVAILABLE" and "in use" in last["message"], last
