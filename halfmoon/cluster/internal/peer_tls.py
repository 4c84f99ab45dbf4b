"""A cluster process's TLS towards its peers: etcd
(:class:`~halfmoon.cluster.coordination.etcd_tls.EtcdTls`) and the internal protocol
(:class:`~halfmoon.cluster.internal.internal_tls.InternalTls`), built once from the
configuration, handed to what dials them, and re-read together on SIGHUP."""

from __future__ import annotations

from dataclasses import dataclass

from halfmoon.cluster.coordination.etcd_tls import PLAIN, EtcdTls
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.config import Config


@dataclass(frozen=True)
class PeerTls:
    etcd: EtcdTls
    internal: InternalTls

    @classmethod
    def from_config(cls, config: Config) -> PeerTls:
        """This process's TLS to etcd and on the internal protocol, from ``config``."""
        return cls(EtcdTls(config.etcd), InternalTls(config.internal))

    def reload(self) -> bool:
        """Re-read both sets of files (SIGHUP); True when they all loaded."""
        etcd_ok = self.etcd.reload()
        internal_ok = self.internal.reload()
        return etcd_ok and internal_ok


PLAIN_PEERS = PeerTls(PLAIN, PLAINTEXT)
"""No TLS towards etcd nor on the internal protocol (a test's process)."""
