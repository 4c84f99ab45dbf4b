"""``halfmoon broker``: one broker process of a cluster, serving the internal protocol.

The configuration is built as ``serve`` builds it (file, ``HALFMOON_*``
variables, flags, ``--set``) and checked in full before anything starts.
"""

from __future__ import annotations

import argparse

from halfmoon import environment
from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import DATA_DIR_EXIT_STATUS, UsageError, add_command
from halfmoon.cli.serve_command import (
    LOG_FLAG_KEYS,
    add_log_options,
    add_print_config,
    print_config,
)
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.keys import check_name
from halfmoon.config import replication_defaults
from halfmoon.config.cluster import DEFAULT_TTL_S, MIN_TTL_S
from halfmoon.errors import HalfmoonError
from halfmoon.logs import quiet_native_logs

# Dedicated flag (argparse destination) → the configuration key it sets.
FLAG_KEYS: dict[str, str] = {
    "name": "broker.name",
    "data_dir": "store.data_dir",
    "flush": "store.flush",
    "cluster": "cluster.name",
    "coordinator": "cluster.coordinator",
    "listen": "cluster.broker_listen",
    "send_listen": "cluster.broker_send_listen",
    "advertise": "cluster.broker_advertise_host",
    "lease_ttl": "cluster.lease_ttl_s",
    "group": "replication.group",
    "replication": "replication.mode",
    "min_insync_replicas": "replication.min_insync_replicas",
    "replica_max_lag_ms": "replication.replica_max_lag_ms",
    "replica_max_lag_bytes": "replication.replica_max_lag_bytes",
    **LOG_FLAG_KEYS,
}
# Switches that turn a key on (given) or leave it to the other layers (not given).
SWITCH_KEYS: dict[str, str] = {
    "insecure": "auth.insecure",
    "replica_reads": "replication.replica_reads",
    "unclean_election": "replication.unclean_election",
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
    broker.epilog = DATA_DIR_EXIT_STATUS
    broker.add_argument("--data-dir", metavar="DIR", help="where messages and metadata live")
    broker.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="internal protocol endpoint (cluster.broker_listen; default 127.0.0.1:8091; "
        "port 0: any free port)",
    )
    broker.add_argument(
        "--send-listen",
        metavar="HOST:PORT|auto",
        help="where proxies' sends arrive (cluster.broker_send_listen), over plain framed TCP "
        "(TLS with [internal]); auto (default): the --listen host, any free port, announced "
        "to proxies",
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
        "(with --coordinator; cluster.name, also $HALFMOON_CLUSTER)",
    )
    broker.add_argument(
        "--coordinator",
        metavar="etcd://HOST:PORT",
        help="the cluster's etcd endpoints, comma-separated (cluster.coordinator, also "
        "$HALFMOON_COORDINATOR)",
    )
    broker.add_argument(
        "--advertise",
        metavar="HOST",
        help="the host proxies dial (cluster.broker_advertise_host), registered in etcd with "
        "the bound port (default: the --listen host, or this machine's name when that is "
        "0.0.0.0 or ::)",
    )
    broker.add_argument(
        "--lease-ttl",
        metavar="DURATION",
        help="how long etcd keeps a broker that stopped renewing listed (cluster.lease_ttl_s: "
        f"whole seconds such as 5s, a bare number is seconds; at least {MIN_TTL_S}; "
        f"default {DEFAULT_TTL_S}, and {replication_defaults.LEASE_TTL_S} for a --group member: "
        "a dead master is replaced within about this plus a second, and a master survives a "
        f"stall shorter than this minus {replication_defaults.KEEPALIVE_INTERVAL_S:g}, "
        "docs/replication.md); a clean stop leaves at once",
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
        help="join broker group NAME (replication.group; with --cluster): the first member "
        "to win the group's key in etcd is its master, the others replicate its commit log "
        "(docs/replication.md); proxies route to the group by this name, "
        "--name is the member's own",
    )
    broker.add_argument(
        "--replication",
        choices=("sync", "async"),
        help="in a group (replication.mode), sync: a write is acknowledged once the in-sync "
        "replicas have it; "
        f"async: after the master's own flush (default {replication_defaults.MODE})",
    )
    broker.add_argument(
        "--min-insync-replicas",
        metavar="N",
        type=non_negative,
        help="with --replication sync, refuse writes (NOT_ENOUGH_REPLICAS) while fewer than N "
        f"replicas are in sync (default {replication_defaults.MIN_INSYNC_REPLICAS}; the master "
        "is not counted)",
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
        metavar="DURATION",
        help="a replica not caught up for this long leaves the in-sync set (such as 500ms or "
        f"10s, a bare number is milliseconds; default {replication_defaults.REPLICA_MAX_LAG_MS})",
    )
    broker.add_argument(
        "--replica-max-lag-bytes",
        metavar="SIZE",
        help="a replica this far behind leaves the in-sync set (such as 64MiB, a bare number "
        "is bytes; default "
        f"{replication_defaults.REPLICA_MAX_LAG_BYTES // (1024 * 1024)} MiB)",
    )
    broker.add_argument(
        "--unclean-election",
        action="store_true",
        help="in a group, let the controller appoint a live member outside the in-sync set "
        "when no in-sync one is left (can lose acknowledged writes; default off)",
    )
    add_log_options(broker)
    broker.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    broker.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="set any configuration key (repeatable); see docs/configuration.md",
    )
    add_print_config(broker)
    # Tests only: the broker's clock stands still until a peer moves it (docs/cluster.md).
    broker.add_argument("--fake-clock-ms", type=int, default=None, help=argparse.SUPPRESS)


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number, at least 0: {text!r}")
    return value


def build_broker_config(args: argparse.Namespace):  # -> halfmoon.config.Config
    """The configuration from its layers, as ``serve`` builds it: the defaults, the
    ``--config`` file, ``HALFMOON_*`` variables, the flags, ``--set``; later ones win."""
    # Imported here so other commands never pay for the broker's modules (as serve does).
    from halfmoon.config import ConfigError, load_config

    flags: dict[str, object] = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()}
    for dest, key in SWITCH_KEYS.items():
        if getattr(args, dest):
            flags[key] = "true"
    try:
        return load_config(
            file=args.config, env=environment.variables(), flags=flags, overrides=args.overrides
        )
    except ConfigError as exc:
        raise UsageError(exc.message, exc.code) from None


def run_broker_command(args: argparse.Namespace) -> int:
    config = build_broker_config(args)
    cluster, coordinator = config.cluster.name, config.cluster.coordinator
    group_name = config.replication.group
    if (cluster is None) != (coordinator is None):
        raise UsageError(
            "--cluster and --coordinator go together: a broker registers in one cluster's etcd "
            "(or give neither to run it unregistered)",
            "USAGE",
        )
    if group_name is not None and cluster is None:
        raise UsageError(
            "--group needs --cluster and --coordinator: a group elects its master in etcd",
            "USAGE",
        )
    if cluster is not None and coordinator is not None:
        try:  # checked before the store opens, so a typo costs no recovery
            parse_coordinator(coordinator)
            check_name("cluster", cluster)
            if group_name is not None:
                check_name("broker group", group_name)
        except HalfmoonError as exc:
            raise UsageError(exc.message, exc.code) from None
    if args.print_config:
        return print_config(config)
    quiet_native_logs(config.log)
    if group_name is not None:
        try:
            check_name("broker", config.broker.name)
        except HalfmoonError as exc:
            raise UsageError(exc.message, exc.code) from None
    # Here: see build_broker_config.
    from halfmoon.broker_node import BrokerNode

    try:
        node = BrokerNode.from_config(config, fake_clock_ms=args.fake_clock_ms)
        return node.run(config.cluster.broker_listen)
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise CliError(f"cannot start: {exc.strerror or exc}{where}", "UNAVAILABLE") from None
