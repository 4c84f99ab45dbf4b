"""``halfmoon serve``: build the configuration from its layers and run the server.

Dedicated flags are shorthands for configuration keys; ``--set`` reaches any
key. The configuration is checked in full before anything starts, so a typo
fails in a line instead of after the ports are bound.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from halfmoon import environment
from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import DATA_DIR_EXIT_STATUS, UsageError, add_command
from halfmoon.errors import HalfmoonError
from halfmoon.logs import quiet_native_logs

# --log-level / --log-format, on every server command (serve, broker, proxy).
LOG_FLAG_KEYS: dict[str, str] = {"log_level": "log.level", "log_format": "log.format"}
# Dedicated flag (argparse destination) → the configuration key it sets.
FLAG_KEYS: dict[str, str] = {
    "data_dir": "store.data_dir",
    "listen": "server.listen",
    "admin_listen": "server.admin_listen",
    "amqp_listen": "server.amqp_listen",
    "flush": "store.flush",
    "tls_cert": "tls.cert",
    "tls_key": "tls.key",
    "tls_client_ca": "tls.client_ca",
    "tls_mode": "tls.mode",
    **LOG_FLAG_KEYS,
}


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, shorthands for the ``[log]`` keys."""
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="the least severe events written to stderr (log.level; default info)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text lines, or one JSON object per line with the same fields "
        "(log.format; default text)",
    )


def register(commands: argparse._SubParsersAction) -> None:
    serve = add_command(
        commands,
        "serve",
        run_serve,
        "run the broker, its gRPC endpoint and the admin API",
        admin=False,
    )
    serve.epilog = DATA_DIR_EXIT_STATUS
    serve.add_argument("--data-dir", metavar="DIR", help="where messages and metadata live")
    serve.add_argument(
        "--listen", metavar="HOST:PORT", help="gRPC endpoint (default 127.0.0.1:8081)"
    )
    serve.add_argument(
        "--admin-listen", metavar="HOST:PORT", help="admin HTTP API (default 127.0.0.1:8082)"
    )
    serve.add_argument(
        "--amqp-listen",
        metavar="HOST:PORT",
        help='AMQP 0-9-1 endpoint (default 127.0.0.1:5673; "" turns it off)',
    )
    serve.add_argument(
        "--flush",
        choices=("sync", "async"),
        help="sync: acknowledge after fsync; async: after the write",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback listener with authentication off (anyone who reaches it "
        "may do anything; see docs/security.md)",
    )
    serve.add_argument("--tls-cert", metavar="PEM", help="certificate chain: serve TLS")
    serve.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    serve.add_argument(
        "--tls-client-ca", metavar="PEM", help="require client certificates it signed (mTLS)"
    )
    serve.add_argument(
        "--tls-mode",
        choices=("disabled", "permissive", "enforcing"),
        help="default: enforcing when --tls-cert is given",
    )
    add_log_options(serve)
    serve.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    serve.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="set any configuration key (repeatable); see docs/configuration.md",
    )
    add_print_config(serve)


def add_print_config(parser: argparse.ArgumentParser) -> None:
    """``--print-config``, on every server command (serve, broker, proxy)."""
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resulting configuration as JSON and exit without serving",
    )


def print_config(config: Any) -> int:
    from halfmoon.config import config_to_dict  # here: see build_config

    json.dump(config_to_dict(config), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def build_config(
    args: argparse.Namespace, more_flags: dict[str, Any] | None = None
):  # -> halfmoon.config.Config
    """The configuration from its layers; ``more_flags`` are a command's own dedicated
    flags (key → value, None when not given), beside serve's."""
    # Imported here so admin commands never pay for the broker's modules (~0.4 s).
    from halfmoon.config import ConfigError, load_config

    flags = {key: getattr(args, dest, None) for dest, key in FLAG_KEYS.items()}
    flags.update(more_flags or {})
    if getattr(args, "insecure", False):
        flags["auth.insecure"] = "true"
    if getattr(args, "tls_cert", None) and not getattr(args, "tls_mode", None):
        flags["tls.mode"] = "enforcing"
    try:
        return load_config(
            file=args.config, env=environment.variables(), flags=flags, overrides=args.overrides
        )
    except ConfigError as exc:
        raise UsageError(exc.message, exc.code) from None


def run_serve(args: argparse.Namespace) -> int:
    config = build_config(args)
    if args.print_config:
        return print_config(config)
    quiet_native_logs(config.log)
    # Imported only now: the checks above must not pay for gRPC and the store.
    from halfmoon.server.app import run

    try:
        result = run(config)
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except OSError as exc:
        # Typically a port already in use or an unwritable data directory.
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise CliError(f"cannot start: {exc.strerror or exc}{where}", "UNAVAILABLE") from None
    return int(result or 0)
