"""Mutual TLS on the internal protocol: brokers accept only peers holding a cluster certificate.

Why mutual TLS and not a shared cluster secret: a secret sent in metadata
authenticates the caller but leaves messages, offsets and the secret itself
readable on the wire unless TLS is there too, and once TLS is there the
certificate already names and authenticates the peer (the same CA and
certificate files etcd's ``--client-cert-auth`` takes). So one mechanism
does both: a broker with ``[internal]`` set serves only TLS and asks every
caller (proxy, or another broker deciding a transaction group) for a
certificate its ``internal.ca`` signed; the caller verifies the broker's
certificate against the same CA, by the host of the broker's advertised
endpoint or ``internal.server_name``. Use a CA of its own for the internal
protocol: any certificate it signs is a full peer.

An :class:`InternalTls` is built from a process's configuration
(``halfmoon broker``'s and ``halfmoon proxy``'s ``[internal]`` section) and
handed to what opens channels or ports on the internal protocol; one that is
not given one speaks plaintext (:data:`PLAINTEXT`). :meth:`InternalTls.reload`
(SIGHUP) re-reads the files: a broker's next handshakes get its new
certificate (open connections are not dropped); channels opened after the
reload present the new client certificate (open ones keep the connection,
and the certificate, they have).
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Sequence
from typing import Any

import grpc

from halfmoon import listen
from halfmoon.auth.config import InternalTlsConfig, TlsConfig
from halfmoon.config import ConfigError
from halfmoon.server.edge_security import Certificates

log = logging.getLogger("halfmoon.cluster")


def check(config: InternalTlsConfig) -> bool:
    """True when mutual TLS is configured; ConfigError when only part of it is."""
    given = [config.ca is not None, config.cert is not None, config.key is not None]
    if any(given) and not all(given):
        raise ConfigError(
            "internal.ca, internal.cert and internal.key go together (mutual TLS between "
            "proxies and brokers; docs/security.md)"
        )
    return all(given)


def _read(config: InternalTlsConfig) -> tuple[bytes, bytes, bytes]:
    assert config.ca is not None and config.key is not None and config.cert is not None
    try:
        return config.ca.read_bytes(), config.key.read_bytes(), config.cert.read_bytes()
    except OSError as exc:
        raise ConfigError(f"the [internal] TLS files do not load: {exc}") from None


class InternalTls:
    """One process's TLS on the internal protocol: its channels to brokers, a broker's
    ports. Off (plaintext) without ``config``."""

    def __init__(self, config: InternalTlsConfig | None = None) -> None:
        on = config is not None and check(config)
        self._config = config if on else None
        self._lock = threading.Lock()
        self._client = _read(config) if on and config is not None else None  # CA, key, chain
        self._server: Certificates | None = None

    @property
    def enabled(self) -> bool:
        return self._config is not None

    def _credentials(self) -> tuple[grpc.ChannelCredentials, list[tuple[str, Any]]] | None:
        with self._lock:
            config, client = self._config, self._client
        if config is None or client is None:
            return None
        ca, key, chain = client
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=chain
        )
        name = config.server_name
        return credentials, [("grpc.ssl_target_name_override", name)] if name else []

    def channel(self, target: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to the broker at ``target``: mutual TLS when on, else plaintext."""
        secure = self._credentials()
        if secure is None:
            return grpc.insecure_channel(target, options=list(options))
        credentials, extra = secure
        return grpc.secure_channel(target, credentials, options=[*options, *extra])

    def _certificates(self) -> Certificates | None:
        """The broker's side: one set of files for its port and its send listener,
        reloaded together."""
        config = self._config
        if config is None:
            return None
        with self._lock:
            if self._server is None:
                self._server = Certificates(
                    TlsConfig(
                        mode="enforcing", cert=config.cert, key=config.key, client_ca=config.ca
                    )
                )
            return self._server

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Listen on ``address``: TLS requiring a client certificate when on."""
        certificates = self._certificates()
        if certificates is None:
            return listen.add_port(server.add_insecure_port, address)
        credentials = certificates.grpc_credentials()
        return listen.add_port(lambda a: server.add_secure_port(a, credentials), address)

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """For the broker's send listener: the certificate and client CA of
        :meth:`add_port`, reloaded with it; None when mutual TLS is off."""
        certificates = self._certificates()
        return certificates.ssl_context() if certificates is not None else None

    def client_ssl_context(self) -> tuple[ssl.SSLContext, str | None] | None:
        """For a connection to a broker's send listener: a context presenting this process's
        certificate and trusting the internal CA, and the name to verify the broker by
        (``internal.server_name``, else the host dialled: None); None when mutual TLS is off."""
        with self._lock:
            config, client = self._config, self._client
        if config is None or client is None:
            return None
        assert config.cert is not None and config.key is not None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=client[0].decode())
        context.load_cert_chain(config.cert, config.key)
        return context, config.server_name

    def reload(self) -> bool:
        """Re-read the files (SIGHUP); files that do not load keep the old ones."""
        config = self._config
        if config is None:
            return True
        try:
            client = _read(config)
        except ConfigError as exc:
            log.error("event=internal_tls_reload_failed error=%s", exc)
            return False
        with self._lock:
            self._client, server = client, self._server
        ok = server.reload() if server is not None else True
        log.info("event=internal_tls_reloaded cert=%s", config.cert)
        return ok


PLAINTEXT = InternalTls()
"""No TLS on the internal protocol (a process without ``[internal]``, a test)."""
