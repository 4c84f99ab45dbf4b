"""``halfmoon serve``: one process with the store, the broker, gRPC and the admin API.

Lifecycle (as uvicorn's): startup → serve → shutdown.

- startup: open the store (crash recovery happens here), the broker on it
  (with the ``transaction`` section; its recovery redoes any commit a crash
  cut short), the gRPC server, the admin API; point transaction checks at
  the producers' telemetry streams; start the tick thread (``broker.tick()``
  every ``tick_interval``: due delay messages, transaction check scans,
  offset and consumption snapshots); log one ready line with the bound
  addresses.
- shutdown (SIGTERM / SIGINT): stop accepting, wake every parked long poll
  and end every telemetry stream so in-flight RPCs finish, wait up to
  ``shutdown_grace`` for the rest, then close the broker (persists offsets
  and consumption state) and the store (flush, checkpoint, clean-shutdown
  mark). A second request skips the wait; copies of one (a process group's
  signal, a supervisor's) are one request (:mod:`halfmoon.shutdown_signals`).

The front end (:func:`halfmoon.server.front_end.serve_front_end`: gRPC, the
admin API, AMQP, sessions) takes any ``Broker``; ``halfmoon proxy`` runs it in
front of brokers in other processes (``halfmoon.cluster.proxy``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from halfmoon.auth import local_guard
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.config import Config
from halfmoon.lifecycle import run_event_loop
from halfmoon.logs import configure_logging
from halfmoon.server.edge_security import check_exposure
from halfmoon.server.front_end import AmqpBacking, serve_front_end
from halfmoon.server.listeners import bind_listeners
from halfmoon.store.dirlock import holding_data_dir
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.server")

METADATA_DIR_NAME = "metadata"


def _open_store_and_broker(config: Config) -> tuple[MessageStore, InProcessBroker]:
    store = MessageStore(config.store)
    try:
        metadata_dir = Path(config.store.data_dir) / METADATA_DIR_NAME
        broker = InProcessBroker(
            store,
            metadata_dir,
            config.broker,
            transaction_config=config.transaction,
            journal_offsets=True,  # an answered ack or offset commit is as durable as a send
        )
    except BaseException:
        store.close()
        raise
    return store, broker


async def serve(config: Config, *, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set or SIGTERM/SIGINT arrives; then shut down cleanly.

    Startup order is what keeps a second process harmless: the data directory's lock first
    (:mod:`halfmoon.store.dirlock`; refused with ``DATA_DIR_LOCKED`` while another process
    holds it), then both ports (a taken port fails here), and only then anything in the data
    directory (users, store, metadata)."""
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    check_exposure(config)
    with holding_data_dir(config.store.data_dir, "halfmoon serve"):
        listeners = await bind_listeners(config, amqp=True)
        try:
            guard = local_guard(config.auth, Path(config.store.data_dir))
            store, broker = await loop.run_in_executor(None, _open_store_and_broker, config)
        except BaseException:
            await listeners.close()
            raise
        try:
            await serve_front_end(
                config,
                broker,
                stop=stop,
                tick=True,
                started=started,
                source=f"data={config.store.data_dir}",
                guard=guard,
                listeners=listeners,
                amqp=AmqpBacking(metadata=Path(config.store.data_dir) / METADATA_DIR_NAME),
            )
        finally:
            # Each step runs even if an earlier one failed: the store must get closed.
            try:
                broker.close()
            finally:
                store.close()
                log.info("event=stopped")


def run(config: Config) -> int:
    """Serve until signalled; the process exit status."""
    configure_logging(config.log)
    run_event_loop(serve(config))
    return 0
