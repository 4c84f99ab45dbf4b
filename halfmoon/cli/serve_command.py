"""``halfmoon serve``: build the configuration from its layers and run the server.

Dedicated flags are shorthands for configuration keys; ``--set`` reaches any
key. The configuration is checked in full before anything starts, so a typo
fails in a line instead of after the ports are bound.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import UsageError, add_command

# flag destination → candidate configuration keys (the first one the
# configuration has wins; candidates keep the flags stable if a key moves).
FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "data_dir": ("server.data_dir", "store.data_dir", "store.root_dir", "store.path"),
    "listen": ("server.listen", "server.grpc_listen"),
    "admin_listen": ("server.admin_listen",),
    "flush": ("store.flush", "store.flush_policy", "store.flush_mode"),
}


def register(commands: argparse._SubParsersAction) -> None:
    serve = add_command(
        commands, "serve", run_serve, "run the broker, its gRPC endpoint and the admin API", admin=False
    )
    serve.add_argument("--data-dir", metavar="DIR", help="where messages and metadata live")
    serve.add_argument("--listen", metavar="HOST:PORT", help="gRPC endpoint (default 127.0.0.1:8081)")
    serve.add_argument("--admin-listen", metavar="HOST:PORT", help="admin HTTP API (default 127.0.0.1:8082)")
    serve.add_argument("--flush", choices=("sync", "async"), help="sync: acknowledge after fsync; async: after the write")
    serve.add_argument("--config", metavar="FILE", help="a TOML configuration file")
    serve.add_argument(
        "--set",
        dest="overrides",
        metavar="SECTION.KEY=VALUE",
        action="append",
        default=[],
        help="set any configuration key (repeatable); see docs/configuration.md",
    )
    serve.add_argument(
        "--print-config",
        action="store_true",
        help="print the resulting configuration as JSON and exit without serving",
    )


def build_config(args: argparse.Namespace):  # -> halfmoon.config.Config
    # Imported here so admin commands never pay for the broker's modules.
    from halfmoon.config import ConfigError, iter_keys, load_config

    keys = {info.key for info in iter_keys()}
    flags = {}
    for dest, candidates in FLAG_KEYS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        key = next((k for k in candidates if k in keys), None)
        if key is None:
            raise UsageError(f"--{dest.replace('_', '-')} has no configuration key to set in this build", "USAGE")
        flags[key] = value
    try:
        return load_config(file=args.config, env=os.environ, flags=flags, overrides=args.overrides)
    except ConfigError as exc:
        raise UsageError(exc.message, exc.code) from None


def run_serve(args: argparse.Namespace) -> int:
    config = build_config(args)
    if args.print_config:
        from halfmoon.config import config_to_dict

        json.dump(config_to_dict(config), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from halfmoon.server.app import run  # noqa: I001 (after the config checks on purpose)

    from halfmoon.errors import HalfmoonError

    try:
        result = run(config)
    except HalfmoonError as exc:
        raise CliError(exc.message, exc.code) from None
    except OSError as exc:
        # Typically a port already in use or an unwritable data directory.
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise CliError(f"cannot start: {exc.strerror or exc}{where}", "UNAVAILABLE") from None
    return int(result or 0)
