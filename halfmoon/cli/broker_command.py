"""``halfmoon broker``: one broker process of a cluster, serving the internal protocol.

The configuration is built as ``serve`` builds it (file, ``HALFMOON_*``
variables, flags, ``--set``) and checked in full before anything starts.
"""

from __future__ import annotations

import argparse
import os

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import UsageError, add_command
from halfmoon.errors import HalfmoonError

# Dedicated flag (argparse destination) → the configuration key it sets.
FLAG_KEYS: dict[str, str] = {
    "name": "broker.name",
    "data_dir": "store.data_dir",
    "flush": "store.flush",
}


def register(commands: argparse._SubParsersAction) -> None:
    broker = add_command(
        commands,
        "broker",
        run_broker_command,
        "run one broker of a cluster: its store and broker, serving the internal protocol "
        "to proxies (not the client protocol; see docs/cluster.md)",
        admin=False,
    )
    broker.add_argument("--name", metavar="NAME", help="the broker's name (broker.name)")
    broker.add_argument("--data-dir", metavar="DIR", help="where messages and metadata live")
    broker.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:8091",
        help="internal protocol endpoint (default 127.0.0.1:8091; port 0: any free port)",
    )
    broker.add_argument(
        "--flush",
        choices=("sync", "async"),
        help="sync: acknowledge after fsync; async: after the write",
    )
    broker.add_argument(
        "--cluster",
        metavar="NAME",
        help="the cluster to join; registration needs the coordination module (etcd), "
        "which this release does not have yet: giving it is an error for now",
    )
    broker.add_argument(
        "--coordinator",
        metavar="etcd://HOST:PORT",
        help="where the cluster is coordinated; needs the coordination module, as --cluster",
    )
    broker.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    broker.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="set any configuration key (repeatable); see docs/configuration.md",
    )
    # Tests only: the broker's clock stands still until a peer moves it (docs/cluster.md).
    broker.add_argument("--fake-clock-ms", type=int, default=None, help=argparse.SUPPRESS)


def run_broker_command(args: argparse.Namespace) -> int:
    # Imported here so other commands never pay for the broker's modules (as serve does).
    from halfmoon.config import ConfigError, load_config

    if args.cluster or args.coordinator:
        raise UsageError(
            "--cluster and --coordinator need the coordination module (etcd registration), "
            "which this release does not have yet; run without them",
            "UNSUPPORTED",
        )
    flags = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()}
    try:
        config = load_config(
            file=args.config, env=os.environ, flags=flags, overrides=args.overrides
        )
    except ConfigError as exc:
        raise UsageError(exc.message, exc.code) from None
    from halfmoon.cluster.broker_process import run_broker  # here: see load_config above

    try:
        return run_broker(config, args.listen, fake_clock_ms=args.fake_clock_ms)
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise CliError(f"cannot start: {exc.strerror or exc}{where}", "UNAVAILABLE") from None
