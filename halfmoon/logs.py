"""The server processes' log: one event per line on stderr, as text or as JSON.

Every halfmoon event is written as ``event=NAME key=value ...`` (a sentence for
people may follow a ``:``); the ready lines start with words instead
(``halfmoon ready grpc=... admin=...``). The text format prints that line as
it is, after the time, level and logger. The JSON format prints one object
per line with the same fields, parsed back out of the line::

    {"time": "2026-12-01T23:31:34.564Z", "level": "INFO", "logger": "halfmoon.server",
     "message": "halfmoon ready", "grpc": "127.0.0.1:8081", ..., "startup_ms": 153}

Words that are not ``key=value`` (the ready line's, a trailing sentence, a
library's plain message) go to ``message``; integers and decimals become JSON
numbers; a quoted value (``error='...'``, from ``%r``) loses its quotes; a
traceback goes to ``exception`` as one string. Parsing the line rather than
asking every call site for structured data keeps the two formats from drifting
apart: a new event is JSON the day it is written.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


@dataclass
class LogConfig:
    """What the server processes (`serve`, `broker`, `proxy`) write to stderr."""

    # The least severe events written: debug, info, warning or error.
    level: Literal["debug", "info", "warning", "error"] = "info"
    # text: "time LEVEL logger event=... key=value" lines; json: one JSON object per line
    # with the same fields (time, level, logger, message, then the event's own keys).
    format: Literal["text", "json"] = "text"


# key=value, where the value is quoted (from %r) or runs to the next space, keeping a
# parenthesised part whole (``error=ConnectionError('no route to host')``); or a bare word.
_TOKEN = re.compile(
    r"""([A-Za-z_][\w.-]*)=("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s(]*(?:\([^)]*\)[^\s(]*)*)"""
    r"""|(\S+)"""
)
_NUMBER = re.compile(r"^-?(?:0|[1-9]\d*)(\.\d+)?$")
_RESERVED = frozenset({"time", "level", "logger", "message", "exception"})


def event_fields(message: str) -> tuple[list[str], dict[str, Any]]:
    """The free words and the ``key=value`` fields of one rendered log message."""
    words: list[str] = []
    fields: dict[str, Any] = {}
    for match in _TOKEN.finditer(message):
        key, raw, word = match.groups()
        if word is not None:
            words.append(word)
            continue
        value: Any = raw
        if raw.endswith(":") and match.end() < len(message):  # "key=5: a sentence follows"
            value = raw[:-1]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif _NUMBER.match(value):
            value = float(value) if "." in value else int(value)
        fields[key] = value
    return words, fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        words, fields = event_fields(record.getMessage())
        if words:
            out["message"] = " ".join(words)
        for key, value in fields.items():
            out[f"field_{key}" if key in _RESERVED else key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(config: LogConfig | None = None) -> None:
    """One event per line on stderr in ``config``'s format and level, unless the host
    program configured logging already (then its handlers are left as they are)."""
    config = config or LogConfig()
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    if config.format == "json":
        handler.setFormatter(JsonFormatter())
        logging.captureWarnings(True)  # a warning would otherwise be a line of plain text
        quiet_native_logs(config)
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(LEVELS[config.level])


def quiet_native_logs(config: LogConfig) -> None:
    """Under the JSON format, keep gRPC's C core from writing its own plain lines to stderr
    ("E1202 ... add_port.cc ..."): what it reports also reaches halfmoon as an exception,
    logged as JSON. Effective only before gRPC starts, so the server commands call it as
    soon as their configuration is known; a GRPC_VERBOSITY the operator set wins."""
    if config.format == "json":
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
