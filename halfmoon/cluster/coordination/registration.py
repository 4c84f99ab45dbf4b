"""Membership for a process whose main thread is not an event loop (``halfmoon broker``).

:func:`register_member` runs a :class:`~halfmoon.cluster.coordination.membership.Membership`
on an event loop of its own, in a daemon thread: it returns once the member is
registered (raising what registration raised: etcd unreachable, name taken)
and hands back the callable that deregisters it and ends the thread. The
lease is renewed in that thread, so a busy main thread cannot let it lapse.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.membership import FACTS_EVERY_S, Membership
from halfmoon.config.cluster import DEFAULT_TTL_S

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def register_member(
    coordinator: str,
    cluster: str,
    role: str,
    name: str,
    endpoint: str,
    facts: dict[str, Any] | None = None,
    *,
    ttl_s: int = DEFAULT_TTL_S,
    facts_source: Callable[[], dict[str, Any]] | None = None,
    facts_every_s: float = FACTS_EVERY_S,
    tls: EtcdTls,
) -> Callable[[], None]:
    """Register and keep the lease alive in the background; returns the deregistration.

    ``facts_source`` runs on the membership thread (see :class:`Membership`).
    """
    client = EtcdClient.from_url(coordinator, tls=tls)
    member = Membership(
        client,
        cluster,
        role,
        name,
        endpoint,
        facts,
        ttl_s=ttl_s,
        facts_source=facts_source,
        facts_every_s=facts_every_s,
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_forever, name=f"halfmoon-membership-{name}", daemon=True
    )
    thread.start()

    def run(coroutine: Any, timeout: float) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)

    def shut_down() -> None:
        try:
            run(client.close(), STOP_TIMEOUT_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT_S)
            loop.close()

    try:
        run(member.start(), START_TIMEOUT_S)
    except BaseException:
        shut_down()
        raise

    stopped = threading.Event()

    def deregister() -> None:
        if stopped.is_set():
            return
        stopped.set()
        try:
            run(member.stop(), STOP_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            pass  # etcd is away: the entry goes when its lease expires
        finally:
            shut_down()

    return deregister
