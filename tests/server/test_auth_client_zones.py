"""The official Python client outside UTC: it stamps local time with a ``Z`` suffix.

Its signature verifies only when the server accepts its zone's offset
(``auth.client_utc_offsets``); docs/security.md explains the replay window.
The client runs in a subprocess with ``TZ`` set, as on a machine in that zone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.server.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.slow

ROOT_USER = ("root", "root-secret-key")
CLIENT = textwrap.dedent(
    """
    import sys
    from rocketmq import ClientConfiguration, Credentials, Message, Producer
    config = ClientConfiguration(sys.argv[1], Credentials("root", "root-secret-key"),
                                 request_timeout=5)
    producer = Producer(config)
    producer.startup()
    msg = Message()
    msg.topic = sys.argv[2]
    msg.body = b"from +09:30"
    try:
        print("sent", producer.send(msg).message_id)
    except Exception as exc:
        print("refused", exc)
    producer.shutdown()
    """
)


def _send_from_zone(server: ServerProcess, topic: str) -> str:
    # Australia/Darwin: +09:30 all year (no daylight saving), unlike the machine's zone.
    env = dict(os.environ, TZ="Australia/Darwin")
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, server.grpc, topic],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("accepted", [False, True], ids=["zone-not-listed", "zone-listed"])
def test_python_client_in_another_zone(tmp_path: Path, accepted: bool) -> None:
    settings = ["auth.enabled=true", "auth.bootstrap_access_key=root"]
    if accepted:
        settings.append("auth.client_utc_offsets=+09:30")
    server = ServerProcess(
        tmp_path / "data",
        settings=tuple(settings),
        env={"HALFMOON_BOOTSTRAP_SECRET_KEY": ROOT_USER[1]},
        credentials=ROOT_USER,
    ).start()
    try:
        server.create_topic("zoned")
        out = _send_from_zone(server, "zoned")
        if accepted:
            assert out.startswith("sent"), out
        else:
            assert "sent" not in out, out
            assert any("stale signature" in line for line in server.lines)
    finally:
        server.stop()
