"""A sleep in the suite is part of a scenario, never how a test waits for something.

A test waits for another process or thread with a poll and a deadline
(tests/waiting.py) or an event. What is left are sleeps that are the scenario: time
passing past a lease's TTL to show that nothing changed, a worker's pause, a random
jitter. Those say so in a comment on their line or the line above; a sleep inside a loop
is a poll's interval.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SLEEPS = ("time.sleep", "asyncio.sleep")


def _unexplained(path: Path) -> list[str]:
    source = path.read_text()
    if "sleep(" not in source:
        return []
    lines = source.splitlines()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in SLEEPS and node.args):
            continue
        argument = ast.unparse(node.args[0])
        if argument == "0" or "uniform" in argument:  # a yield to the loop; a random jitter
            continue
        outer, in_loop = node, False
        while outer in parents and not in_loop:
            outer = parents[outer]
            if isinstance(outer, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                break
            in_loop = isinstance(outer, ast.While | ast.For | ast.AsyncFor)
        if in_loop:
            continue
        line = node.lineno - 1
        above = next((lines[i] for i in range(line - 1, -1, -1) if lines[i].strip()), "")
        if "#" not in lines[line] and not above.strip().startswith("#"):
            found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}: {lines[line].strip()}")
    return found


def test_every_sleep_outside_a_poll_says_why() -> None:
    unexplained = [f for path in sorted(TESTS.rglob("*.py")) for f in _unexplained(path)]
    assert unexplained == [], "poll with tests.waiting.wait_until, or say why time passes"
