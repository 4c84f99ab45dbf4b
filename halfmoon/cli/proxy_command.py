"""``halfmoon proxy``: the client endpoint in front of a ``halfmoon broker`` process.

Configuration as for ``serve`` (file, ``HALFMOON_*`` variables, flags,
``--set``); the ``server`` section applies, the ``store`` section does not
(the broker process owns the data).
"""

from __future__ import annotations

import argparse
import os
import re
import socket

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.broker_command import lease_ttl
from halfmoon.cli.parser import UsageError, add_command
from halfmoon.cli.serve_command import build_config
from halfmoon.cluster.etcd_json import parse_coordinator
from halfmoon.cluster.keys import DEFAULT_TTL_S, check_name
from halfmoon.config import parse_host_port
from halfmoon.errors import HalfmoonError


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
        help="one broker process's internal endpoint (halfmoon broker --listen), for a "
        "proxy in front of that broker alone; or route over a whole cluster with "
        "--cluster and --coordinator",
    )
    proxy.add_argument(
        "--cluster",
        metavar="NAME",
        help="route over this cluster's brokers, as registered in etcd "
        "(with --coordinator; default $HALFMOON_CLUSTER)",
    )
    proxy.add_argument(
        "--coordinator",
        metavar="etcd://HOST:PORT",
        help="the cluster's etcd endpoints, comma-separated (default $HALFMOON_COORDINATOR)",
    )
    proxy.add_argument(
        "--name",
        metavar="NAME",
        help="this proxy's name in the cluster (default: HOST-PORT of --listen)",
    )
    proxy.add_argument(
        "--workers",
        metavar="N",
        type=int,
        default=1,
        help="worker processes sharing the ports with SO_REUSEPORT (cluster mode; default 1)",
    )
    proxy.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=lease_ttl,
        default=DEFAULT_TTL_S,
        help=f"how long etcd keeps a proxy that stopped renewing listed (default {DEFAULT_TTL_S})",
    )
    # Set by a supervising proxy on the processes it starts (one worker each).
    proxy.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    proxy.add_argument(
        "--listen", metavar="HOST:PORT", help="gRPC endpoint (default 127.0.0.1:8081)"
    )
    proxy.add_argument(
        "--admin-listen", metavar="HOST:PORT", help="admin HTTP API (default 127.0.0.1:8082)"
    )
    proxy.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback listener with authentication off (see docs/security.md)",
    )
    proxy.add_argument("--tls-cert", metavar="PEM", help="certificate chain: serve TLS")
    proxy.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    proxy.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    proxy.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="set any configuration key (repeatable); see docs/configuration.md",
    )


def run_proxy_command(args: argparse.Namespace) -> int:
    cluster = args.cluster or os.environ.get("HALFMOON_CLUSTER") or None
    coordinator = args.coordinator or os.environ.get("HALFMOON_COORDINATOR") or None
    if (cluster is None) != (coordinator is None):
        raise UsageError("--cluster and --coordinator go together", "USAGE")
    if (args.broker is None) == (cluster is None):
        raise UsageError(
            "give either --broker HOST:PORT (one broker) or --cluster and --coordinator "
            "(every broker of a cluster)",
            "USAGE",
        )
    if args.workers < 1 or (args.workers > 1 and cluster is None):
        raise UsageError("--workers is a positive count, for a cluster proxy", "USAGE")
    try:
        if cluster is not None and coordinator is not None:
            parse_coordinator(coordinator)
            check_name("cluster", cluster)
    except HalfmoonError as exc:
        raise UsageError(exc.message, exc.code) from None
    # The serve command's flags that a proxy does not have (it stores nothing).
    args.data_dir = args.flush = None
    config = build_config(args)
    # Imported only now: the checks above must not pay for gRPC and the broker's modules.
    from halfmoon.cluster.cluster_proxy import ProxyIdentity, run_cluster_proxy
    from halfmoon.cluster.proxy_process import run_proxy

    try:
        if cluster is None or coordinator is None:
            return run_proxy(config, args.broker)
        host, port = parse_host_port(config.server.listen, what="listen address")
        advertised = config.server.advertise_host or (
            host if host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        )
        name = args.name or re.sub(r"[^A-Za-z0-9_.-]", "-", f"{advertised}-{port}")
        check_name("proxy", name)
        identity = ProxyIdentity(coordinator, cluster, name, f"{advertised}:{port}", args.lease_ttl)
        return run_cluster_proxy(config, identity, args.workers, worker=args.worker)
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        raise CliError(f"cannot start: {exc.strerror or exc}", "UNAVAILABLE") from None
