"""TLS on the listeners and the refusal to expose an unauthenticated broker.

- :func:`check_exposure`: with authentication off, every listener must be on
  loopback unless ``auth.insecure`` (``serve --insecure``) says otherwise.
- :class:`Certificates`: the certificate and key (and the client CA of
  mutual TLS) read from disk; :meth:`Certificates.reload` (SIGHUP) re-reads
  them. gRPC takes them through ``dynamic_ssl_server_credentials``, which
  asks for the current ones at each new handshake, so a reload never drops
  an open connection; the admin API's ``SSLContext`` loads the new chain in
  place, which affects new handshakes only as well.
- Mode ``enforcing`` serves TLS only; ``permissive`` serves plaintext and
  TLS on one port (:mod:`halfmoon.server.grpc_endpoint`,
  :mod:`halfmoon.listen.permissive`).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import threading

import grpc

from halfmoon.auth.config import TlsConfig
from halfmoon.auth.errors import InsecureListen
from halfmoon.config import Config, ConfigError, parse_host_port

log = logging.getLogger("halfmoon.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(config: Config) -> None:
    """Raise InsecureListen when an unauthenticated listener would face the network."""
    if config.auth.enabled or config.auth.insecure:
        return
    for key, address in (
        ("server.listen", config.server.listen),
        ("server.admin_listen", config.server.admin_listen),
    ):
        host, _ = parse_host_port(address, what=key)
        if not is_loopback(host):
            raise InsecureListen(
                f"{key} {address} is not a loopback address and authentication is off: "
                "anyone who reaches it could read, write and administer every topic. "
                "Turn authentication on (--set auth.enabled=true, see docs/security.md), "
                "or pass --insecure to accept that"
            )


def check_tls(tls: TlsConfig) -> None:
    if tls.mode == "disabled":
        return
    if tls.cert is None or tls.key is None:
        raise ConfigError(f"tls.mode={tls.mode} needs tls.cert and tls.key (--tls-cert, --tls-key)")


class Certificates:
    """The listeners' certificate chain, key and client CA, re-read on :meth:`reload`."""

    def __init__(self, tls: TlsConfig) -> None:
        check_tls(tls)
        self.tls = tls
        self._lock = threading.Lock()
        self._changed = False
        self._contexts: list[ssl.SSLContext] = []
        self._chain, self._key, self._client_ca = self._read()

    def _read(self) -> tuple[bytes, bytes, bytes | None]:
        assert self.tls.cert is not None and self.tls.key is not None
        chain = self.tls.cert.read_bytes()
        key = self.tls.key.read_bytes()
        client_ca = self.tls.client_ca.read_bytes() if self.tls.client_ca else None
        return chain, key, client_ca

    def reload(self) -> bool:
        """Re-read the files; True when they loaded (a bad file keeps the old ones)."""
        try:
            chain, key, client_ca = self._read()
            for context in self._contexts:
                context.load_cert_chain(self.tls.cert, self.tls.key)  # type: ignore[arg-type]
        except (OSError, ssl.SSLError) as exc:
            log.error("event=tls_reload_failed error=%s", exc)
            return False
        with self._lock:
            self._chain, self._key, self._client_ca = chain, key, client_ca
            self._changed = True
        log.info("event=tls_reloaded cert=%s", self.tls.cert)
        return True

    def _grpc_config(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self._key, self._chain)], root_certificates=self._client_ca
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by grpc at each handshake: None keeps the current certificate.
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            return self._grpc_config()

    def grpc_credentials(self) -> grpc.ServerCredentials:
        with self._lock:
            initial = self._grpc_config()
        return grpc.dynamic_ssl_server_credentials(
            initial, self._fetch, require_client_authentication=self._client_ca is not None
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A server context for the admin API (the same certificate, reloaded with it)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls.cert, self.tls.key)  # type: ignore[arg-type]
        if self.tls.client_ca is not None:
            context.load_verify_locations(cafile=str(self.tls.client_ca))
            context.verify_mode = ssl.CERT_REQUIRED
        self._contexts.append(context)
        return context
