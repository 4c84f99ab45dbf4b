"""TLS to etcd, for every process of a cluster: HTTPS to the JSON gateway, with a client cert.

etcd serves its JSON gateway on the client port, over TLS when started with
``--cert-file``/``--key-file``; with ``--client-cert-auth
--trusted-ca-file`` it refuses any caller without a certificate that CA
signed. halfmoon's side is the ``[etcd]`` configuration section
(``etcd.ca``, ``etcd.cert``, ``etcd.key``; ``HALFMOON_ETCD_CA`` ...): with a
CA set, every etcd endpoint is dialled as ``https://`` and etcd's
certificate verified against it (host name included), and the client
certificate presented when given.

The setting is process-wide: ``halfmoon broker`` and ``halfmoon proxy`` set
it from their configuration at start (:func:`configure`); the command line
tools (``halfmoon cluster ...``), which build no configuration, read the
same ``HALFMOON_ETCD_*`` variables. Coordinator addresses stay
``etcd://HOST:PORT``: the scheme is chosen per call (:func:`url`), so no
caller needs to know. :func:`reload` (SIGHUP) re-reads the files; calls
after it use the new certificate (a watch already open keeps its
connection until it is re-opened).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path

from halfmoon.auth.config import EtcdTlsConfig
from halfmoon.errors import InvalidArgument

log = logging.getLogger("halfmoon.cluster")

ENV = {"ca": "HALFMOON_ETCD_CA", "cert": "HALFMOON_ETCD_CERT", "key": "HALFMOON_ETCD_KEY"}


class EtcdTlsError(InvalidArgument):
    """The [etcd] TLS files are incomplete or do not load."""

    code = "ILLEGAL_CONFIG"
    protocol_code = "BAD_REQUEST"


_lock = threading.Lock()
_configured: EtcdTlsConfig | None = None
_context: ssl.SSLContext | None = None
_loaded = False


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


def configure(config: EtcdTlsConfig) -> None:
    """This process's TLS to etcd (from its configuration); raises EtcdTlsError."""
    global _configured, _context, _loaded
    context = build_context(config)
    with _lock:
        _configured, _context, _loaded = config, context, True


def _current() -> ssl.SSLContext | None:
    global _configured, _context, _loaded
    with _lock:
        if _loaded:
            return _context
    configure(from_env(os.environ))  # a command-line tool: the environment says
    with _lock:
        return _context


def ssl_context() -> ssl.SSLContext | None:
    """The context every etcd call uses; None: plain HTTP."""
    return _current()


def url(endpoint: str) -> str:
    """``endpoint`` (``http://HOST:PORT``, as :func:`parse_coordinator` gives it) with the
    scheme this process speaks to etcd."""
    if _current() is not None and endpoint.startswith("http://"):
        return "https://" + endpoint[len("http://") :]
    return endpoint


def reload() -> bool:
    """Re-read the files (SIGHUP); a file that does not load keeps the old context."""
    with _lock:
        config = _configured
    if config is None:
        return True
    try:
        configure(config)
    except EtcdTlsError as exc:
        log.error("event=etcd_tls_reload_failed error=%s", exc)
        return False
    log.info("event=etcd_tls_reloaded ca=%s", config.ca)
    return True
