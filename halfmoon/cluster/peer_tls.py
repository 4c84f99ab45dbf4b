"""A cluster process's TLS towards its peers: etcd (:mod:`etcd_tls`) and the internal protocol
(:mod:`internal_tls`), set once from the configuration and re-read together on SIGHUP."""

from __future__ import annotations

from halfmoon.cluster import etcd_tls, internal_tls
from halfmoon.config import Config


def configure(config: Config) -> None:
    """TLS to etcd and on the internal protocol, for this whole process, from ``config``."""
    etcd_tls.configure(config.etcd)
    internal_tls.configure(config.internal)


def reload() -> bool:
    """Re-read both sets of files (SIGHUP); True when they all loaded."""
    etcd_ok = etcd_tls.reload()
    internal_ok = internal_tls.reload()
    return etcd_ok and internal_ok
