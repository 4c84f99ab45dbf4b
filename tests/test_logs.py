"""The log formats: key=value events parsed into JSON fields, one object per line."""

from __future__ import annotations

import json
import logging

import pytest

from halfmoon.config import ConfigError, load_config
from halfmoon.logs import JsonFormatter, event_fields


def test_event_fields_keep_values_words_and_numbers():
    words, fields = event_fields(
        "halfmoon ready grpc=127.0.0.1:8081 data=./data auth=off startup_ms=153 ratio=0.5"
    )
    assert words == ["halfmoon", "ready"]
    assert fields == {
        "grpc": "127.0.0.1:8081",
        "data": "./data",
        "auth": "off",
        "startup_ms": 153,
        "ratio": 0.5,
    }


def test_quoted_and_parenthesised_values_stay_whole_and_a_sentence_is_the_message():
    words, fields = event_fields(
        "event=rpc_internal_error rpc=Send error=ConnectionError('no route to host') "
        "name='a b' tracked=7: new deliveries are not renewed"
    )
    assert fields["error"] == "ConnectionError('no route to host')"
    assert fields["name"] == "a b"
    assert fields["tracked"] == 7
    assert fields["event"] == "rpc_internal_error"
    assert " ".join(words) == "new deliveries are not renewed"


def test_leading_zeros_stay_text():
    assert event_fields("topic=007 id=-3")[1] == {"topic": "007", "id": -3}


def _record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("halfmoon.test", logging.WARNING, __file__, 1, message, args, exc_info)


def test_json_formatter_writes_one_object_per_record_with_reserved_names_kept():
    line = JsonFormatter().format(_record("event=x level=%s count=%d", "high", 3, exc=True))
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING"
    assert data["logger"] == "halfmoon.test"
    assert data["event"] == "x"
    assert data["field_level"] == "high"
    assert data["count"] == 3
    assert "ValueError: boom" in data["exception"]
    assert data["time"].endswith("Z")


def test_log_keys_come_from_file_environment_and_flags(tmp_path):
    path = tmp_path / "halfmoon.toml"
    path.write_text('[log]\nlevel = "warning"\nformat = "json"\n')
    assert load_config(file=path, env={}).log.format == "json"
    config = load_config(file=path, env={"HALFMOON_LOG_LEVEL": "debug"})
    assert (config.log.level, config.log.format) == ("debug", "json")
    flagged = load_config(env={"HALFMOON_LOG_FORMAT": "json"}, flags={"log.format": "text"})
    assert flagged.log.format == "text"
    with pytest.raises(ConfigError, match="log.format"):
        load_config(env={"HALFMOON_LOG_FORMAT": "xml"})


@pytest.mark.parametrize("command", ["serve", "broker", "proxy"])
def test_every_server_command_takes_the_log_flags(command: str):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", command, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "--log-level" in done.stdout and "--log-format" in done.stdout
