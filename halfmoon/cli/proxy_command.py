"""``halfmoon proxy``: the client endpoint in front of a ``halfmoon broker`` process.

Configuration as for ``serve`` (file, ``HALFMOON_*`` variables, flags,
``--set``); the ``server`` section applies, the ``store`` section does not
(the broker process owns the data).
"""

from __future__ import annotations

import argparse

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import add_command
from halfmoon.cli.serve_command import build_config
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
        required=True,
        help="the broker process's internal endpoint (halfmoon broker --listen)",
    )
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
    # The serve command's flags that a proxy does not have (it stores nothing).
    args.data_dir = args.flush = None
    config = build_config(args)
    # Imported only now: the checks above must not pay for gRPC and the broker's modules.
    from halfmoon.cluster.proxy_process import run_proxy

    try:
        return run_proxy(config, args.broker)
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        raise CliError(f"cannot start: {exc.strerror or exc}", "UNAVAILABLE") from None
