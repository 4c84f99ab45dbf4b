"""``halfmoon proxy``: the client endpoint in front of a ``halfmoon broker`` process.

Configuration as for ``serve`` (file, ``HALFMOON_*`` variables, flags,
``--set``); the ``server`` section applies, the ``store`` section does not
(the broker process owns the data).
"""

from __future__ import annotations

import argparse

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import UsageError, add_command
from halfmoon.cli.serve_command import (
    add_log_options,
    add_print_config,
    build_config,
    print_config,
)
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.keys import check_name
from halfmoon.config.cluster import DEFAULT_TTL_S
from halfmoon.errors import HalfmoonError
from halfmoon.logs import quiet_native_logs


def register(commands: argparse._SubParsersAction) -> None:
    proxy = add_command(
        commands,
        "proxy",
        run_proxy_command,
        "serve the RocketMQ 5 gRPC endpoint and the admin API in front of a "
        "halfmoon broker process (see docs/cluster.md)",
        admin=False,
    )
    proxy.add_argument(
        "--broker",
        metavar="HOST:PORT",
        help="one broker process's internal endpoint (cluster.proxy_broker; halfmoon broker "
        "--listen), for a "
        "proxy in front of that broker alone; or route over a whole cluster with "
        "--cluster and --coordinator",
    )
    proxy.add_argument(
        "--cluster",
        metavar="NAME",
        help="route over this cluster's brokers, as registered in etcd "
        "(with --coordinator; cluster.name, also $HALFMOON_CLUSTER)",
    )
    proxy.add_argument(
        "--coordinator",
        metavar="etcd://HOST:PORT",
        help="the cluster's etcd endpoints, comma-separated (cluster.coordinator, also "
        "$HALFMOON_COORDINATOR)",
    )
    proxy.add_argument(
        "--name",
        metavar="NAME",
        help="this proxy's name in the cluster (cluster.proxy_name; default: HOST-PORT of "
        "--listen)",
    )
    proxy.add_argument(
        "--workers",
        metavar="N",
        type=int,
        help="worker processes sharing the ports with SO_REUSEPORT (cluster.proxy_workers; "
        "cluster mode; default 1)",
    )
    proxy.add_argument(
        "--lease-ttl",
        metavar="DURATION",
        help="how long etcd keeps a proxy that stopped renewing listed (cluster.lease_ttl_s: "
        f"whole seconds such as 5s, a bare number is seconds; default {DEFAULT_TTL_S})",
    )
    # Set by a supervising proxy on the processes it starts (one worker each).
    proxy.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    # The pipe on which such a worker tells its parent it serves (the parent registers then).
    proxy.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    # The supervisor's pid: such a worker stops when that process ends.
    proxy.add_argument("--supervisor-pid", type=int, default=None, help=argparse.SUPPRESS)
    proxy.add_argument(
        "--listen", metavar="HOST:PORT", help="gRPC endpoint (default 127.0.0.1:8081)"
    )
    proxy.add_argument(
        "--admin-listen", metavar="HOST:PORT", help="admin HTTP API (default 127.0.0.1:8082)"
    )
    proxy.add_argument(
        "--amqp-listen",
        metavar="HOST:PORT",
        help='AMQP 0-9-1 endpoint, cluster mode (default 127.0.0.1:5673; "" turns it off)',
    )
    proxy.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback listener with authentication off (see docs/security.md)",
    )
    proxy.add_argument("--tls-cert", metavar="PEM", help="certificate chain: serve TLS")
    proxy.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    add_log_options(proxy)
    add_print_config(proxy)
    proxy.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    proxy.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="set any configuration key (repeatable); see docs/configuration.md",
    )


# Dedicated flag (argparse destination) → the configuration key it sets; the serve
# command's flags (--listen, --admin-listen, --amqp-listen, --tls-*) come on top.
FLAG_KEYS: dict[str, str] = {
    "broker": "cluster.proxy_broker",
    "cluster": "cluster.name",
    "coordinator": "cluster.coordinator",
    "name": "cluster.proxy_name",
    "workers": "cluster.proxy_workers",
    "lease_ttl": "cluster.lease_ttl_s",
}


def run_proxy_command(args: argparse.Namespace) -> int:
    # The serve command's flags that a proxy does not have (it stores nothing).
    args.data_dir = args.flush = None
    config = build_config(args, {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()})
    cluster, coordinator = config.cluster.name, config.cluster.coordinator
    if (cluster is None) != (coordinator is None):
        raise UsageError("--cluster and --coordinator go together", "USAGE")
    if (config.cluster.proxy_broker is None) == (cluster is None):
        raise UsageError(
            "give either --broker HOST:PORT (one broker) or --cluster and --coordinator "
            "(every broker of a cluster)",
            "USAGE",
        )
    workers = config.cluster.proxy_workers
    if workers > 1 and cluster is None:
        raise UsageError("--workers is a positive count, for a cluster proxy", "USAGE")
    try:
        if cluster is not None and coordinator is not None:
            parse_coordinator(coordinator)
            check_name("cluster", cluster)
    except HalfmoonError as exc:
        raise UsageError(exc.message, exc.code) from None
    if args.print_config:
        return print_config(config)
    quiet_native_logs(config.log)
    # Imported only now: the checks above must not pay for gRPC and the broker's modules.
    from halfmoon.cluster.proxy.cluster_proxy import ProxyIdentity, run_cluster_proxy
    from halfmoon.cluster.proxy.proxy_process import run_proxy

    try:
        if cluster is None or coordinator is None:
            return run_proxy(config, config.cluster.proxy_broker)
        identity = ProxyIdentity.from_config(config)
        return run_cluster_proxy(
            config,
            identity,
            workers,
            worker=args.worker,
            ready_fd=args.ready_fd,
            supervisor=args.supervisor_pid,
        )
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        raise CliError(f"cannot start: {exc.strerror or exc}", "UNAVAILABLE") from None
