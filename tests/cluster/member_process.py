"""A process that registers as a cluster member and stays until killed (for the lease tests).

:class:`Member` starts one from a test and waits for it with a deadline.

``python -m tests.cluster.member_process URL CLUSTER ROLE NAME ENDPOINT TTL``
prints ``registered`` once its entry is in etcd; on SIGTERM it deregisters and
exits, as a clean stop; SIGKILL leaves the entry to expire with its lease.
"""

from __future__ import annotations

import asyncio
import select
import signal
import subprocess
import sys
from pathlib import Path

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.membership import Membership

ROOT = Path(__file__).resolve().parents[2]
TTL = 2  # etcd's smallest lease


async def main(url: str, cluster: str, role: str, name: str, endpoint: str, ttl: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with EtcdClient.from_url(url) as client:
        member = Membership(client, cluster, role, name, endpoint, {"queues": 0}, ttl_s=ttl)
        await member.start()
        print("registered", flush=True)
        await stop.wait()
        await member.stop()
    print("deregistered", flush=True)


class Member:
    """A ``tests.cluster.member_process`` child, started and waited for with a deadline."""

    def __init__(
        self,
        etcd_url: str,
        cluster: str,
        name: str,
        endpoint: str,
        role: str = "broker",
        ttl_s: int = TTL,
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.member_process", etcd_url, cluster, role,
             name, endpoint, str(ttl_s)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self._line(timeout=20) == "registered"

    def _line(self, timeout: float) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"the member process said nothing within {timeout} s"
        return self.process.stdout.readline().strip()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def terminate(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        line = self._line(timeout=10)
        self.process.wait(timeout=10)
        return line

    def close(self) -> None:
        if self.process.poll() is None:
            self.resume()
            self.kill()


if __name__ == "__main__":
    url, cluster, role, name, endpoint, ttl = sys.argv[1:7]
    asyncio.run(main(url, cluster, role, name, endpoint, int(ttl)))
