"""``halfmoon cluster kv|settings``: the name server's KV config and the cluster's settings.

mqadmin's updateKvConfig / deleteKvConfig / updateOrderConf (``cluster kv``) and
getNamesrvConfig / updateNamesrvConfig (``cluster settings``). Both live in etcd,
so these commands talk to etcd directly (``--coordinator etcd://HOST:PORT
--cluster NAME``, as ``cluster list --coordinator`` does) and answer with no
broker or proxy running.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from halfmoon import environment
from halfmoon.cli.parser import UsageError, emit
from halfmoon.cli.table import cell, render_table
from halfmoon.cluster.coordination.cluster_config import ORDER_TOPIC_CONFIG, ClusterConfig
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.errors import ClusterKeyNotFound

COORDINATOR_ENV = environment.COORDINATOR.name
CLUSTER_ENV = environment.CLUSTER.name


def etcd_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--coordinator",
        metavar="URL",
        default=None,
        help=f"the cluster's etcd, etcd://HOST:PORT[,HOST:PORT...] (default: ${COORDINATOR_ENV})",
    )
    common.add_argument(
        "--cluster", metavar="NAME", default=None, help=f"the cluster (default: ${CLUSTER_ENV})"
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def register(cluster_sub: argparse._SubParsersAction) -> None:
    """Add ``kv`` and ``settings`` under ``halfmoon cluster``."""
    kv = cluster_sub.add_parser(
        "kv", help="the name server's KV config, kept in etcd (mqadmin's updateKvConfig)"
    )
    kv_sub = kv.add_subparsers(dest="kv_command", metavar="ACTION", required=True)
    listing = _command(kv_sub, "list", kv_list, "list the KV config, or one namespace's")
    _kv_namespace(listing, required=False)
    get = _command(kv_sub, "get", kv_get, "show one KV config value")
    get.add_argument("key", metavar="KEY")
    set_ = _command(
        kv_sub,
        "set",
        kv_set,
        f"store KV config values: KEY=VALUE ... (updateOrderConf: --kv-namespace "
        f"{ORDER_TOPIC_CONFIG}, KEY the topic)",
    )
    set_.add_argument("assignments", metavar="KEY=VALUE", nargs="+")
    delete = _command(kv_sub, "delete", kv_delete, "remove a KV config value")
    delete.add_argument("key", metavar="KEY")
    for parser in (get, set_, delete):
        _kv_namespace(parser, required=True)

    settings = cluster_sub.add_parser(
        "settings", help="the cluster's settings, kept in etcd (mqadmin's getNamesrvConfig)"
    )
    settings_sub = settings.add_subparsers(dest="settings_command", metavar="ACTION", required=True)
    sget = _command(settings_sub, "get", settings_get, "show the cluster's settings (or one)")
    sget.add_argument("key", metavar="KEY", nargs="?", default=None)
    sset = _command(
        settings_sub,
        "set",
        settings_set,
        "change settings: KEY=VALUE ... (VALUE as JSON when it parses, else a string)",
    )
    sset.add_argument("assignments", metavar="KEY=VALUE", nargs="+")
    sdelete = _command(settings_sub, "delete", settings_delete, "remove a setting")
    sdelete.add_argument("key", metavar="KEY")


def _kv_namespace(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "-s",
        "--kv-namespace",
        metavar="NS",
        required=required,
        default=None,
        help="the KV namespace (mqadmin's -s), e.g. " + ORDER_TOPIC_CONFIG,
    )


def _command(
    sub: argparse._SubParsersAction, name: str, handler: Any, help: str
) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help, parents=[etcd_options()])
    parser.set_defaults(handler=handler)
    return parser


def config_of(args: argparse.Namespace) -> ClusterConfig:
    coordinator = args.coordinator or environment.COORDINATOR.get()
    cluster = args.cluster or environment.CLUSTER.get()
    if not coordinator or not cluster:
        raise UsageError(
            f"needs --coordinator etcd://HOST:PORT (or ${COORDINATOR_ENV}) and --cluster NAME "
            f"(or ${CLUSTER_ENV})",
            "USAGE",
        )
    return ClusterConfig(parse_coordinator(coordinator), cluster, tls=EtcdTls.from_env())


def kv_list(args: argparse.Namespace) -> None:
    namespace = args.kv_namespace
    entries = config_of(args).kv_list(namespace)

    def human() -> str:
        if not entries:
            return "no KV config" + (f" in namespace {namespace}" if namespace else "")
        columns = [("namespace", "NAMESPACE"), ("key", "KEY"), ("value", "VALUE")]
        return render_table(entries, columns)

    emit(args, {"kv": entries}, human)


def kv_get(args: argparse.Namespace) -> None:
    value = config_of(args).kv_get(args.kv_namespace, args.key)
    answer = {"namespace": args.kv_namespace, "key": args.key, "value": value}
    emit(args, answer, lambda: value)


def kv_set(args: argparse.Namespace) -> None:
    changes = {key: value for key, value in assignments(args.assignments)}
    config = config_of(args)
    for key, value in changes.items():
        config.kv_set(args.kv_namespace, key, value)
    emit(
        args,
        {"namespace": args.kv_namespace, "changed": changes},
        lambda: "\n".join(f"set {args.kv_namespace}/{k} = {v}" for k, v in changes.items()),
    )


def kv_delete(args: argparse.Namespace) -> None:
    namespace = args.kv_namespace
    if not config_of(args).kv_delete(namespace, args.key):
        raise ClusterKeyNotFound(f"no KV config {namespace}/{args.key} to delete")
    answer = {"namespace": namespace, "key": args.key, "deleted": True}
    emit(args, answer, lambda: f"deleted {namespace}/{args.key}")


def assignments(texts: list[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` arguments split at the first ``=`` (a value may hold more)."""
    pairs = []
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad assignment {text!r}: expected KEY=VALUE", "USAGE")
        pairs.append((key.strip(), value.strip()))
    return pairs


def settings_get(args: argparse.Namespace) -> None:
    config = config_of(args)
    if args.key is not None:
        value = config.setting(args.key)
        emit(args, {"key": args.key, "value": value}, lambda: cell(value))
        return
    settings = config.settings()
    rows = [{"key": key, "value": cell(value)} for key, value in settings.items()]
    emit(
        args,
        {"settings": settings},
        lambda: (
            render_table(rows, [("key", "KEY"), ("value", "VALUE")])
            if rows
            else "no cluster setting is stored"
        ),
    )


def parse_value(text: str) -> Any:
    """``64`` is a number, ``true`` a boolean, ``{"a": 1}`` an object; anything else a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def settings_set(args: argparse.Namespace) -> None:
    changes = {key: parse_value(value) for key, value in assignments(args.assignments)}
    config = config_of(args)
    for key, value in changes.items():
        config.set_setting(key, value)
    emit(
        args,
        {"changed": changes},
        lambda: "\n".join(f"set {k} = {cell(v)}" for k, v in changes.items()),
    )


def settings_delete(args: argparse.Namespace) -> None:
    if not config_of(args).delete_setting(args.key):
        raise ClusterKeyNotFound(f"no setting {args.key!r} to delete")
    emit(args, {"key": args.key, "deleted": True}, lambda: f"deleted setting {args.key}")
