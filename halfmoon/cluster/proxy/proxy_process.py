"""``halfmoon proxy``: the RocketMQ 5 gRPC endpoint and the admin API in front of a broker process.

The same front end as ``halfmoon serve`` (sessions, telemetry streams, long
polls, routes, the admin API), driving a :class:`RemoteBroker` instead of an
in-process broker: sends from all clients are coalesced into few internal
requests, long polls wake on the broker's arrival stream, transaction checks
come from the broker over the event stream and go out on the producers'
telemetry streams. The proxy holds no data; the broker process ticks itself.

One broker for now (``--broker HOST:PORT``); routing over the brokers of a
cluster registered in etcd comes with queue placement (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from halfmoon.cluster.internal.peer_tls import PeerTls
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.config import Config
from halfmoon.lifecycle import run_event_loop
from halfmoon.logs import configure_logging
from halfmoon.server.edge_security import check_exposure
from halfmoon.server.errors import Unsupported
from halfmoon.server.front_end import serve_front_end

log = logging.getLogger("halfmoon.cluster")


async def serve_proxy(
    config: Config, broker_address: str, *, stop: asyncio.Event | None = None
) -> None:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives; then shut down cleanly."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    check_exposure(config)
    if config.auth.enabled:
        # Users and ACLs of cluster mode live in etcd, which this proxy does not read; one
        # with users of its own would answer differently from its peers.
        raise Unsupported(
            "auth.enabled needs the cluster's users and ACLs in etcd: run the proxy with "
            "--cluster and --coordinator instead of --broker (docs/security.md)"
        )
    tls = PeerTls.from_config(config)  # mutual TLS to the broker when [internal] is set
    # Connecting makes the version handshake, which waits for the broker within its deadline.
    broker = await loop.run_in_executor(
        None, functools.partial(RemoteBroker, broker_address, tls=tls.internal)
    )
    try:
        await serve_front_end(
            config,
            broker,
            stop=stop,
            tick=False,
            started=started,
            source=f"broker={broker_address}",
            on_reload=tls.reload,
        )
    finally:
        await loop.run_in_executor(None, broker.close)
        log.info("event=stopped")


def run_proxy(config: Config, broker_address: str) -> int:
    """Serve until signalled; the process exit status."""
    configure_logging(config.log)
    run_event_loop(serve_proxy(config, broker_address))
    return 0
