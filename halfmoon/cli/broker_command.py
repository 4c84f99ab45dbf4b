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
        "--send-listen",
        metavar="HOST:PORT|auto|off",
        default="auto",
        help="where proxies' sends arrive, over plain framed TCP (TLS with [internal]): "
        "cheaper for the broker than the gRPC stream; auto (default): the --listen host, any "
        "free port, announced to proxies; off: proxies send over the gRPC stream",
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
    broker.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --listen without mutual TLS ([internal]): anyone who "
        "reaches the port could then read and write every queue (docs/security.md)",
    )
    broker.add_argument(
        "--group",
        metavar="NAME",
        help="join broker group NAME (with --cluster): the first member to win the group's key "
        "in etcd is its master, the others replicate its commit log (docs/replication.md); "
        "proxies route to the group by this name, --name is the member's own",
    )
    broker.add_argument(
        "--replication",
        choices=("sync", "async"),
        default="async",
        help="in a group, sync: a write is acknowledged once the in-sync replicas have it; "
        "async (default): after the master's own flush",
    )
    broker.add_argument(
        "--min-insync-replicas",
        metavar="N",
        type=non_negative,
        default=1,
        help="with --replication sync, refuse writes (NOT_ENOUGH_REPLICAS) while fewer than N "
        "replicas are in sync (default 1; the master is not counted)",
    )
    broker.add_argument(
        "--replica-reads",
        action="store_true",
        help="in a group, let proxies send pulls and bulk reads to in-sync replicas, which "
        "serve what the group has committed (RocketMQ's slaveReadEnable; pops stay on the "
        "master)",
    )
    broker.add_argument(
        "--replica-max-lag-ms",
        metavar="MS",
        type=positive,
        default=10_000,
        help="a replica not caught up for this long leaves the in-sync set (default 10000)",
    )
    broker.add_argument(
        "--replica-max-lag-bytes",
        metavar="BYTES",
        type=positive,
        default=64 * 1024 * 1024,
        help="a replica this far behind leaves the in-sync set (default 64 MiB)",
    )
    broker.add_argument(
        "--unclean-election",
        action="store_true",
        help="in a group, let the controller appoint a live member outside the in-sync set "
        "when no in-sync one is left (can lose acknowledged writes; default off)",
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


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, at least 0: {text!r}")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, at least 1: {text!r}")
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
    if args.group is not None and cluster is None:
        raise UsageError(
            "--group needs --cluster and --coordinator: a group elects its master in etcd",
            "USAGE",
        )
    if cluster is not None and coordinator is not None:
        try:  # checked before the store opens, so a typo costs no recovery
            parse_coordinator(coordinator)
            check_name("cluster", cluster)
            if args.group is not None:
                check_name("broker group", args.group)
        except HalfmoonError as exc:
            raise UsageError(exc.message, exc.code) from None
    flags = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()}
    if args.insecure:
        flags["auth.insecure"] = "true"
    try:
        config = load_config(
            file=args.config, env=os.environ, flags=flags, overrides=args.overrides
        )
    except ConfigError as exc:
        raise UsageError(exc.message, exc.code) from None
    # Here: see load_config above.
    from halfmoon.broker_node import disk_facts, register_in_etcd, run_broker
    from halfmoon.replication.group_broker import GroupOptions
    from halfmoon.replication.leader import ReplicationSettings

    group = None
    if args.group is not None:
        try:
            check_name("broker", config.broker.name)
        except HalfmoonError as exc:
            raise UsageError(exc.message, exc.code) from None
        group = GroupOptions(
            args.group,
            config.broker.name,
            ReplicationSettings(
                args.replication,
                args.min_insync_replicas,
                args.replica_max_lag_ms,
                args.replica_max_lag_bytes,
                replica_reads=args.replica_reads,
            ),
            ttl_s=args.lease_ttl,
            facts={"data_dir": str(Path(config.store.data_dir).resolve())},
            unclean_election=args.unclean_election,
        )

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
            group=group,
            group_advertise=args.advertise,
            send_listen=args.send_listen,
        )
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise CliError(f"cannot start: {exc.strerror or exc}{where}", "UNAVAILABLE") from None
