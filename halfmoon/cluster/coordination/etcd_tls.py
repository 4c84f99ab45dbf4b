"""TLS to etcd, for every process of a cluster: HTTPS to the JSON gateway, with a client cert.

etcd serves its JSON gateway on the client port, over TLS when started with
``--cert-file``/``--key-file``; with ``--client-cert-auth
--trusted-ca-file`` it refuses any caller without a certificate that CA
signed. halfmoon's side is the ``[etcd]`` configuration section
(``etcd.ca``, ``etcd.cert``, ``etcd.key``; ``HALFMOON_ETCD_CA`` ...): with a
CA set, every etcd endpoint is dialled as ``https://`` and etcd's
certificate verified against it (host name included), and the client
certificate presented when given.

An :class:`EtcdTls` is built from a process's configuration (``halfmoon
broker``'s and ``halfmoon proxy``'s ``[etcd]`` section) and handed to its etcd
clients and calls; the command line tools (``halfmoon cluster ...``), which
build no configuration, build theirs from the same ``HALFMOON_ETCD_*``
variables (:meth:`EtcdTls.from_env`). Coordinator addresses stay
``etcd://HOST:PORT``: the scheme is chosen per call (:meth:`EtcdTls.url`), so
no caller needs to know. :meth:`EtcdTls.reload` (SIGHUP) re-reads the files;
calls after it use the new certificate (a watch already open keeps its
connection until it is re-opened).
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path

from halfmoon import environment
from halfmoon.auth.config import EtcdTlsConfig
from halfmoon.errors import InvalidArgument

log = logging.getLogger("halfmoon.cluster")

ENV = {"ca": "HALFMOON_ETCD_CA", "cert": "HALFMOON_ETCD_CERT", "key": "HALFMOON_ETCD_KEY"}


class EtcdTlsError(InvalidArgument):
    """The [etcd] TLS files are incomplete or do not load."""

    code = "ILLEGAL_CONFIG"
    protocol_code = "BAD_REQUEST"


def from_env(env: Mapping[str, str]) -> EtcdTlsConfig:
    values = {name: env.get(variable) or None for name, variable in ENV.items()}
    return EtcdTlsConfig(**{k: Path(v) if v else None for k, v in values.items()})


def build_context(config: EtcdTlsConfig) -> ssl.SSLContext | None:
    """The client context of ``config``; None when TLS to etcd is off (no CA)."""
    if config.ca is None:
        if config.cert is not None or config.key is not None:
            raise EtcdTlsError("etcd.cert and etcd.key need etcd.ca (the CA of etcd's certificate)")
        return None
    if (config.cert is None) != (config.key is None):
        raise EtcdTlsError("etcd.cert and etcd.key go together (the client certificate)")
    try:
        context = ssl.create_default_context(cafile=str(config.ca))
        if config.cert is not None and config.key is not None:
            context.load_cert_chain(str(config.cert), str(config.key))
    except (OSError, ssl.SSLError) as exc:
        raise EtcdTlsError(f"the [etcd] TLS files do not load: {exc}") from None
    return context


class EtcdTls:
    """One process's TLS to etcd: the client context of its ``[etcd]`` files (or none:
    plain HTTP), and the scheme it dials."""

    def __init__(self, config: EtcdTlsConfig | None = None) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._context = build_context(config) if config is not None else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtcdTls:
        """A command-line tool's: ``HALFMOON_ETCD_CA`` and its siblings say."""
        return cls(from_env(environment.variables() if env is None else env))

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The context every etcd call uses; None: plain HTTP."""
        with self._lock:
            return self._context

    def url(self, endpoint: str) -> str:
        """``endpoint`` (``http://HOST:PORT``, as :func:`parse_coordinator` gives it) with the
        scheme this process speaks to etcd."""
        if self.ssl_context is not None and endpoint.startswith("http://"):
            return "https://" + endpoint[len("http://") :]
        return endpoint

    def reload(self) -> bool:
        """Re-read the files (SIGHUP); a file that does not load keeps the old context."""
        config = self._config
        if config is None:
            return True
        try:
            context = build_context(config)
        except EtcdTlsError as exc:
            log.error("event=etcd_tls_reload_failed error=%s", exc)
            return False
        with self._lock:
            self._context = context
        log.info("event=etcd_tls_reloaded ca=%s", config.ca)
        return True


PLAIN = EtcdTls()
"""Plain HTTP to etcd (a process without ``[etcd]`` TLS, a test)."""
