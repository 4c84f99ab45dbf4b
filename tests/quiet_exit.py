"""What a clean shutdown must not print: asyncio's and Python's complaints at exit.

A process that stops cleanly may log its own INFO lines; it must not leave
tasks pending, exceptions unretrieved or resources unclosed, which Python
reports on stderr only as the interpreter exits.
"""

from __future__ import annotations

ALARMS = (
    "Task was destroyed but it is pending",
    "Task exception was never retrieved",
    "Exception ignored",
    "Traceback",
    "was never awaited",
    "ResourceWarning",
    "Unclosed",
)


def alarming_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(alarm in line for alarm in ALARMS)]


def assert_quiet_exit(stderr: str) -> None:
    alarms = alarming_lines(stderr)
    assert not alarms, "a clean shutdown printed:\n" + stderr[-3000:]
