"""Every ``HALFMOON_*`` environment variable, read in one place.

Two kinds:

- configuration keys, ``HALFMOON_<SECTION>_<KEY>`` (``HALFMOON_STORE_FLUSH``):
  :mod:`halfmoon.config` reads them from :func:`variables` as one layer of the
  configuration; they are listed with their keys in docs/configuration.md;
- the tools' own variables, declared below: where the CLI finds the admin API,
  the credentials it signs with, the cluster it asks about. They name no
  section, so the configuration loader leaves them alone, and every command
  reads them through :meth:`Variable.get` instead of ``os.environ``.

Tests' failpoints are not here: they live, with their variables, in
:mod:`halfmoon.failpoints`. Standard library only: the CLI imports this on
every run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "HALFMOON_"


@dataclass(frozen=True)
class Variable:
    """One tool variable: its name and what it sets."""

    name: str
    meaning: str

    def get(self, env: Mapping[str, str] | None = None) -> str | None:
        """Its value in ``env`` (default: this process's environment); None when unset or
        empty, so an exported empty variable means "not set" as a missing one does."""
        value = (os.environ if env is None else env).get(self.name)
        return value or None


def variables() -> Mapping[str, str]:
    """This process's environment, the configuration's ``HALFMOON_*`` layer."""
    return os.environ


def key_variable(key: str) -> str:
    """The variable of configuration key ``key``: ``log.format`` → ``HALFMOON_LOG_FORMAT``."""
    return PREFIX + key.upper().replace(".", "_")


ADMIN = Variable("HALFMOON_ADMIN", "the admin API the CLI talks to (default http://127.0.0.1:8082)")
ADMIN_CA = Variable("HALFMOON_ADMIN_CA", "the CA that signed an https admin API's certificate")
NAMESPACE = Variable("HALFMOON_NAMESPACE", "the namespace the CLI's commands act in")
ACCESS_KEY = Variable(
    "HALFMOON_ACCESS_KEY", "the access key the CLI and halfmoon's client sign requests with"
)
SECRET_KEY = Variable("HALFMOON_SECRET_KEY", "the secret key that goes with HALFMOON_ACCESS_KEY")
CREDENTIALS_FILE = Variable(
    "HALFMOON_CREDENTIALS_FILE",
    "the CLI's credentials file (default ~/.config/halfmoon/credentials, mode 0600)",
)
GRPC = Variable("HALFMOON_GRPC", "the gRPC endpoint halfmoon probe sends to")
CLUSTER = Variable(
    "HALFMOON_CLUSTER", "the cluster the cluster commands ask about; sets cluster.name too"
)
COORDINATOR = Variable(
    "HALFMOON_COORDINATOR", "that cluster's etcd endpoints; sets cluster.coordinator too"
)
BOOTSTRAP_SECRET_KEY = Variable(
    "HALFMOON_BOOTSTRAP_SECRET_KEY",
    "the secret key of the first super user (auth.bootstrap_access_key), kept out of files",
)

TOOL_VARIABLES: tuple[Variable, ...] = (
    ADMIN,
    ADMIN_CA,
    NAMESPACE,
    ACCESS_KEY,
    SECRET_KEY,
    CREDENTIALS_FILE,
    GRPC,
    CLUSTER,
    COORDINATOR,
    BOOTSTRAP_SECRET_KEY,
)
