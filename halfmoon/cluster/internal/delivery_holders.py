"""Deliveries held by proxy workers, released on their broker when a worker's lease ends.

An AMQP delivery through a proxy can be settled only on the connection it went
to, and that connection lives in one proxy worker: when the worker dies, no one
can ack it. RabbitMQ requeues a dead connection's deliveries at once; here
each worker receives with its lease as the deliveries' holder
(:func:`lease_holder`: the lease its session-directory entry lives under,
:mod:`halfmoon.cluster.proxy.session_directory`), and each broker process runs a
:class:`HolderLeases`: every :data:`CHECK_EVERY_S` it asks etcd about the lease
of each holder it has deliveries of (one call per proxy worker), and a lease
etcd no longer has (expired: the worker died, or was cut off from etcd for its
TTL; revoked: it stopped) releases them, visible again at once and redelivered
(``InProcessBroker.release_held``). Released within the proxy's lease TTL
(``--lease-ttl``, 10 s by default) and a second.

With etcd unreachable nothing is released: the deliveries stay hidden (at most
their invisible time, ``server.amqp_consumer_timeout``), since a delivery
given to a second consumer while the first still holds it is delivered twice.
A broker restarted under a live proxy keeps its deliveries hidden for the same
reason (held entries are journaled with their holder, :mod:`halfmoon.broker.pop_journal`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError, call_sync
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")

CHECK_EVERY_S = 1.0
ASK_TIMEOUT_S = 2.0
_PREFIX = "etcd-lease:"


def lease_holder(lease: int) -> str:
    """The holder name of deliveries received under etcd lease ``lease``."""
    return f"{_PREFIX}{lease:x}"


def holder_lease(holder: str) -> int | None:
    """The lease a :func:`lease_holder` name stands for (None: not such a name)."""
    if not holder.startswith(_PREFIX):
        return None
    try:
        return int(holder[len(_PREFIX) :], 16)
    except ValueError:
        return None


class HolderLeases:
    """Releases the deliveries of holders whose lease ended, for one broker process."""

    def __init__(
        self,
        broker: InProcessBroker,
        etcd_endpoints: Sequence[str],
        *,
        every_s: float = CHECK_EVERY_S,
        tls: EtcdTls,
    ) -> None:
        self._broker = broker
        self._etcd = list(etcd_endpoints)
        self._tls = tls
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="halfmoon-delivery-holders", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def check_once(self) -> int:
        """Release the deliveries of every holder whose lease ended; how many."""
        released = 0
        for holder in sorted(self._broker.delivery_holders()):
            lease = holder_lease(holder)
            if lease is None or self._lives(lease):
                continue
            count = self._broker.release_held(holder)
            released += count
            log.info("event=deliveries_released holder=%s count=%d", holder, count)
        return released

    def _lives(self, lease: int) -> bool:
        """Whether etcd still has ``lease`` (raises when etcd does not answer)."""
        answer = call_sync(
            self._etcd, "/lease/timetolive", {"ID": str(lease)}, ASK_TIMEOUT_S, tls=self._tls
        )
        return int(answer.get("TTL", -1)) >= 0

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.check_once()
            except (HalfmoonError, EtcdRequestError, OSError) as error:
                # etcd away: nothing is released (a holder may still live).
                log.warning("event=delivery_holders_unchecked error=%s", error)
            except Exception:  # noqa: BLE001 - the loop must outlive a bug in one round
                log.exception("event=delivery_holders_unchecked")
