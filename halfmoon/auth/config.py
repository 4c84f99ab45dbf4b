"""The ``[auth]`` and ``[tls]`` sections of halfmoon's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass
class AuthConfig:
    # Authenticate every request (signed gRPC requests, HTTP Basic/Bearer on the admin
    # API) and authorize it against the ACLs. Off by default, which ``serve`` accepts
    # only on loopback listeners (see --insecure).
    enabled: bool = False
    # Allow a non-loopback listener with authentication off (serve --insecure): anyone
    # who reaches the port may then read, write and administer everything.
    insecure: bool = False
    # The master key sealing secret keys at rest (hex). Unset: <data_dir>/auth/key,
    # created with mode 600 on first start.
    key_file: Path | None = None
    # A signature's x-mq-date-time may differ from the server's clock by this much
    # (after the zone offsets below); older or newer ones are refused as replays.
    signature_window: float = 300.0
    # Zone offsets (e.g. "+08:00") of clients that stamp local time as UTC (the Python
    # client does); UTC and the server's own zone are always accepted.
    client_utc_offsets: tuple[str, ...] = ()
    # The first super user, created at start when no user exists yet. Its secret key
    # comes from the environment variable HALFMOON_BOOTSTRAP_SECRET_KEY only, so it is
    # never in a configuration file or in --print-config.
    bootstrap_access_key: str | None = None
    # Recover a locked-out broker: at every start, make the bootstrap user an enabled super
    # user with the secret key in HALFMOON_BOOTSTRAP_SECRET_KEY, whatever users exist
    # (logged as event=bootstrap_user_recovered). Remove it once you are back in.
    bootstrap_recover: bool = False
    # Cluster mode: once a proxy has not heard from etcd for this long, refuse every request
    # (UNAUTHORIZED), since users and ACLs may have changed meanwhile. Unset: keep serving
    # with the last users and ACLs while etcd is away (a restart of etcd locks no one out).
    max_stale: float | None = None


@dataclass
class TlsConfig:
    # disabled: plaintext only; enforcing: TLS only; permissive: both on one port
    # (the first bytes of a connection say which), as RocketMQ's proxy offers.
    mode: Literal["disabled", "permissive", "enforcing"] = "disabled"
    # PEM certificate chain and private key of the gRPC endpoint and the admin API.
    cert: Path | None = None
    key: Path | None = None
    # PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS).
    client_ca: Path | None = None


def parse_utc_offset(text: str) -> int:
    """``+08:00`` / ``-0530`` / ``+8`` → seconds east of UTC; ValueError otherwise."""
    raw = text.strip()
    if not raw or raw[0] not in "+-":
        raise ValueError(f"zone offset {text!r} must start with + or -, e.g. +08:00")
    sign = -1 if raw[0] == "-" else 1
    body = raw[1:].replace(":", "")
    if not body.isdigit() or len(body) not in (1, 2, 4):
        raise ValueError(f"zone offset {text!r} must look like +08:00")
    hours, minutes = (int(body), 0) if len(body) <= 2 else (int(body[:2]), int(body[2:]))
    if hours > 14 or minutes >= 60:
        raise ValueError(f"zone offset {text!r} is out of range (at most ±14:00)")
    return sign * (hours * 3600 + minutes * 60)


@dataclass
class EtcdTlsConfig:
    # PEM CA bundle that signed etcd's server certificate: when set, every process (broker,
    # proxy, CLI) speaks HTTPS to etcd's endpoints (etcd --cert-file/--key-file).
    ca: Path | None = None
    # This process's client certificate, for an etcd started with --client-cert-auth
    # --trusted-ca-file (etcd then refuses callers without one); needs etcd.key.
    cert: Path | None = None
    # The client certificate's private key.
    key: Path | None = None


@dataclass
class InternalTlsConfig:
    # Mutual TLS on the internal protocol (proxy → broker, broker → broker): the CA that
    # signs every broker's and proxy's certificate. A broker with internal.ca, .cert and
    # .key set serves TLS only and accepts only peers whose certificate this CA signed;
    # the three go together.
    ca: Path | None = None
    # This process's certificate: a broker serves with it, a proxy or broker presents it
    # when it connects to a broker.
    cert: Path | None = None
    # Its private key.
    key: Path | None = None
    # The name expected in brokers' certificates when it is not the host of their
    # advertised endpoint (one certificate, e.g. "halfmoon-broker", for every broker).
    server_name: str | None = None
