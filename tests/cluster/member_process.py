"""A process that registers as a cluster member and stays until killed (for the lease tests).

``python -m tests.cluster.member_process URL CLUSTER ROLE NAME ENDPOINT TTL``
prints ``registered`` once its entry is in etcd; on SIGTERM it deregisters and
exits, as a clean stop; SIGKILL leaves the entry to expire with its lease.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from halfmoon.cluster.etcd import EtcdClient
from halfmoon.cluster.membership import Membership


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


if __name__ == "__main__":
    url, cluster, role, name, endpoint, ttl = sys.argv[1:7]
    asyncio.run(main(url, cluster, role, name, endpoint, int(ttl)))
