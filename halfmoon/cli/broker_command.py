"""``halfmoon broker``: one broker process of a cluster, serving the internal protocol.

The configuration is built as ``serve`` builds it (file, ``HALFMOON_*``
variables, flags, ``--set``) and checked in full before anything starts.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import UsageError, add_command
from halfmoon.cluster.etcd_json import parse_coordinator
from halfmoon.cluster.keys import DEFAULT_TTL_S, MIN_TTL_S, check_name
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
        help="the cluster to join: the broker registers in etcd under a lease "
        "(with --coordinator; default $HALFMOON_CLUSTER)",
    )
    broker.add_argument(
        "--coordinator",
        metavar="etcd://HOST:PORT",
        help="the cluster's etcd endpoints, comma-separated (default $HALFMOON_COORDINATOR)",
    )
    broker.add_argument(
        "--advertise",
        metavar="HOST",
        default=None,
        help="the host proxies dial, registered in etcd with the bound port (default: the "
        "--listen host, or this machine's name when that is 0.0.0.0 or ::)",
    )
    broker.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=lease_ttl,
        default=DEFAULT_TTL_S,
        help=f"how long etcd keeps a broker that stopped renewing listed (default {DEFAULT_TTL_S}; "
        f"at least {MIN_TTL_S}); a clean stop leaves at once",
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


def lease_ttl(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < MIN_TTL_S:
        raise argparse.ArgumentTypeError(f"expected whole seconds, at least {MIN_TTL_S}: {text!r}")
    return value


def run_broker_command(args: argparse.Namespace) -> int:
    # Imported here so other commands never pay for the broker's modules (as serve does).
    from halfmoon.config import ConfigError, load_config

    cluster = args.cluster or os.environ.get("HALFMOON_CLUSTER") or None
    coordinator = args.coordinator or os.environ.get("HALFMOON_COORDINATOR") or None
    if (cluster is None) != (coordinator is None):
        raise UsageError(
            "--cluster and --coordinator go together: a broker registers in one cluster's etcd "
            "(or give neither to run it unregistered)",
            "USAGE",
        )
    if cluster is not None and coordinator is not None:
        try:  # checked before the store opens, so a typo costs no recovery
            parse_coordinator(coordinator)
            check_name("cluster", cluster)
        except HalfmoonError as exc:
            raise UsageError(exc.message, exc.code) from None
    flags = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()}
    try:
        config = load_config(
            file=args.config, env=os.environ, flags=flags, overrides=args.overrides
        )
    except ConfigError as exc:
        raise UsageError(exc.message, exc.code) from None
    # Here: see load_config above.
    from halfmoon.cluster.broker_process import disk_facts, register_in_etcd, run_broker

    try:
        return run_broker(
            config,
            args.listen,
            cluster=cluster,
            coordinator=coordinator,
            register=functools.partial(
                register_in_etcd,
                ttl_s=args.lease_ttl,
                facts={"data_dir": str(Path(config.store.data_dir).resolve())},
                facts_source=functools.partial(disk_facts, Path(config.store.data_dir)),
                advertise_host=args.advertise,
            )
            if cluster is not None
            else None,
            fake_clock_ms=args.fake_clock_ms,
        )
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise CliError(f"cannot start: {exc.strerror or exc}{where}", "UNAVAILABLE") from None
