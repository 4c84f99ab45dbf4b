"""A supervised proxy's workers end with their supervisor, however it ended: SIGKILLed, it
leaves no worker serving on as an orphan (each asked the kernel for a stop signal when its
parent ends) and the port they shared is free again."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from tests.cluster.cluster_server import ClusterServer, wait_until

DEADLINE_S = 30.0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def test_the_workers_of_a_sigkilled_supervisor_stop(tmp_path: Path) -> None:
    cluster = ClusterServer(tmp_path / "cluster", workers=2).start()
    try:
        proxy = cluster.proxies[0]
        assert proxy.proc is not None
        children = Path(f"/proc/{proxy.proc.pid}/task/{proxy.proc.pid}/children").read_text()
        workers = [int(pid) for pid in children.split()]
        assert len(workers) == 2, children
        os.kill(proxy.proc.pid, signal.SIGKILL)
        wait_until(
            lambda: not any(_alive(pid) for pid in workers),
            DEADLINE_S,
            "the workers to stop with their supervisor",
        )
        with socket.socket() as probe:  # nothing answers on the port they shared
            assert probe.connect_ex(("127.0.0.1", proxy.grpc_port)) != 0
    finally:
        cluster.kill()
