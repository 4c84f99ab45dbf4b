"""``halfmoon cluster list|status|config|write-perm|failover``: brokers, the numbers operators
watch, runtime settings, draining, a broker group's planned switchover (``cluster
kv|settings``, kept in etcd, are in :mod:`halfmoon.cli.cluster_config_commands`).

RocketMQ's clusterList, brokerStatus, getBrokerConfig / updateBrokerConfig and
wipeWritePerm / addWritePerm (``write-perm --wipe|--add``: the runtime key
``broker.writable``). ``cluster list --coordinator etcd://HOST:PORT --cluster NAME``
reads a cluster's brokers and proxies from etcd itself (see docs/cluster.md), so it
answers even when no broker does; without ``--coordinator`` it asks one broker's admin API.
``cluster failover G [--to B]`` hands a broker group's master over to an in-sync
replica (RocketMQ controller's electMaster, Kafka's preferred-leader election), through
etcd with ``--coordinator`` or through a proxy's admin API without.
``config set`` changes only keys the broker reads at each use; the change
lasts until the process stops (put it in the configuration file to keep it).
"""

from __future__ import annotations

import argparse
import urllib.parse
from typing import Any

from halfmoon import environment
from halfmoon.cli import cluster_config_commands
from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import UsageError, add_command, client, emit, subject
from halfmoon.cli.table import cell, format_duration_ms, format_size, render_record, render_table
from halfmoon.cluster.coordination.etcd_json import parse_coordinator
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.keys import check_name
from halfmoon.cluster.coordination.members import read_members

CLUSTER_COLUMNS = [
    ("cluster", "CLUSTER"),
    ("broker", "BROKER"),
    ("role", "ROLE"),
    ("grpc", "GRPC"),
    ("admin", "ADMIN"),
    ("version", "VERSION"),
    ("tps_in", "IN/S"),
    ("tps_out", "OUT/S"),
    ("uptime_ms", "UPTIME"),
]
MEMBER_COLUMNS = [
    ("role", "ROLE"),
    ("name", "NAME"),
    ("endpoint", "ENDPOINT"),
    ("state", "STATE"),
    ("expires_in_s", "LEASE"),
    ("queues", "QUEUES"),
    ("disk_free_bytes", "DISK-FREE"),
    ("disk_used_ratio", "DISK-USED"),
    ("host", "HOST"),
    ("pid", "PID"),
    ("uptime_ms", "UPTIME"),
]
GROUP_COLUMNS = [
    ("group", "GROUP"),
    ("master", "MASTER"),
    ("epoch", "EPOCH"),
    ("mode", "MODE"),
    ("isr", "IN-SYNC"),
    ("members", "MEMBERS"),
    ("lag", "REPLICA LAG"),
]
COORDINATOR_ENV = cluster_config_commands.COORDINATOR_ENV
CLUSTER_ENV = cluster_config_commands.CLUSTER_ENV
# What an operator looks at first, in this order; any other field follows.
STATUS_FIRST = [
    ("name", "broker"),
    ("uptime_ms", "uptime"),
    ("tps_in", "in/s"),
    ("tps_out", "out/s"),
    ("messages_in_total", "messages in"),
    ("messages_out_total", "messages out"),
    ("pending_transactions", "pending transactions"),
    ("parked_transactions", "parked transactions"),
    ("pending_delay_messages", "pending delay messages"),
    ("disk_bytes", "commit log on disk"),
    ("disk_free_bytes", "disk free"),
    ("disk_used_ratio", "disk used"),
    ("unflushed_bytes", "unflushed"),
    ("topics", "topics"),
    ("groups", "groups"),
    ("queues", "queues"),
    ("clients", "clients"),
    ("producers", "producers"),
]


def register(commands: argparse._SubParsersAction) -> None:
    cluster = commands.add_parser(
        "cluster", help="brokers, broker status and runtime configuration"
    )
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    listing = add_command(sub, "list", list_brokers, "list the brokers and their addresses")
    listing.add_argument(
        "--coordinator",
        metavar="URL",
        default=None,
        help="read the cluster's brokers and proxies from etcd, etcd://HOST:PORT[,HOST:PORT...] "
        f"(default: ${COORDINATOR_ENV}; without it, ask the broker at --admin)",
    )
    listing.add_argument(
        "--cluster",
        metavar="NAME",
        default=None,
        help=f"the cluster to list, with --coordinator (default: ${CLUSTER_ENV})",
    )
    cluster_config_commands.register(sub)
    failover = add_command(
        sub,
        "failover",
        failover_group,
        "hand a broker group's master over to an in-sync replica (planned switchover)",
    )
    # ``--group G``, the spelling the replication design first gave, parses too (with the
    # usual one-line warning: the group is this command's subject).
    subject(failover, "group", "GROUP", "the broker group", deprecated_flag="--group")
    failover.add_argument(
        "--to",
        metavar="MEMBER",
        default=None,
        help="the in-sync replica to appoint (default: the most caught-up one)",
    )
    failover.add_argument(
        "--coordinator",
        metavar="URL",
        default=None,
        help=f"ask through etcd (default: ${COORDINATOR_ENV}; without it, the proxy at --admin)",
    )
    failover.add_argument(
        "--cluster",
        metavar="NAME",
        default=None,
        help=f"with --coordinator (default: ${CLUSTER_ENV})",
    )
    add_broker_option(
        add_command(sub, "status", broker_status, "TPS in/out, disk, pending transactions and more")
    )

    config = sub.add_parser("config", help="show or change runtime-changeable settings")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    get = add_command(config_sub, "get", config_get, "show the runtime-changeable keys (or one)")
    get.add_argument("key", metavar="KEY", nargs="?", default=None)
    set_ = add_command(config_sub, "set", config_set, "change keys until restart: KEY=VALUE ...")
    set_.add_argument("assignments", metavar="KEY=VALUE", nargs="+")

    perm = add_command(
        sub,
        "write-perm",
        write_perm,
        "stop or resume accepting new messages (drain the broker), until restart",
    )
    add_broker_option(perm)
    change = perm.add_mutually_exclusive_group(required=True)
    change.add_argument(
        "--wipe",
        action="store_false",
        dest="writable",
        help="refuse new messages; routes show the queues read-only (mqadmin's wipeWritePerm)",
    )
    change.add_argument(
        "--add",
        action="store_true",
        dest="writable",
        help="accept new messages again (mqadmin's addWritePerm)",
    )


def add_broker_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        metavar="NAME",
        default=None,
        help="cluster mode: the member broker to address through the proxy (mqadmin's -b)",
    )


def for_broker(path: str, args: argparse.Namespace) -> str:
    """``path`` addressed to the broker ``--broker`` names, if any."""
    broker = args.broker
    return f"{path}?broker={urllib.parse.quote(broker)}" if broker else path


def list_brokers(args: argparse.Namespace) -> None:
    coordinator = args.coordinator or environment.COORDINATOR.get()
    if coordinator:
        list_members(args, coordinator)
        return
    answer = client(args).get("/v1/cluster")
    if "proxies" in answer:  # a proxy of a cluster answers with every member
        emit(args, answer, lambda: render_members(answer, answer["cluster"]))
        return
    rows = [{"cluster": answer["cluster"], **b} for b in answer["brokers"]]
    emit(args, answer, lambda: render_table(rows, CLUSTER_COLUMNS))


def list_members(args: argparse.Namespace, coordinator: str) -> None:
    cluster = args.cluster or environment.CLUSTER.get()
    if not cluster:
        raise UsageError(f"--coordinator needs --cluster NAME (or ${CLUSTER_ENV})", "USAGE")
    # A command line builds no configuration: its TLS to etcd is HALFMOON_ETCD_*'s.
    answer = read_members(
        parse_coordinator(coordinator), check_name("cluster", cluster), tls=EtcdTls.from_env()
    )
    if answer.get("broker_groups"):
        # Here: only a cluster with broker groups needs gRPC (each master's Status).
        from halfmoon.cluster.proxy.replication_view import add_progress

        add_progress(answer["broker_groups"])
    emit(args, answer, lambda: render_members(answer, cluster))


def failover_group(args: argparse.Namespace) -> None:
    coordinator = args.coordinator or environment.COORDINATOR.get()
    check_name("broker group", args.group)
    if coordinator:
        cluster = args.cluster or environment.CLUSTER.get()
        if not cluster:
            raise UsageError(f"--coordinator needs --cluster NAME (or ${CLUSTER_ENV})", "USAGE")
        # Here: the command line starts without the cluster modules it does not use.
        from halfmoon.cluster.coordination.switchover import request_switchover

        answer = request_switchover(
            parse_coordinator(coordinator), check_name("cluster", cluster), args.group, args.to,
            tls=EtcdTls.from_env(),
        )  # fmt: skip
    else:
        body = {"to": args.to} if args.to else {}
        path = f"/v1/cluster/groups/{urllib.parse.quote(args.group)}/failover"
        answer = client(args).post(path, body)
    emit(
        args,
        answer,
        lambda: (
            f"group {args.group}: {answer.get('master')} is master in epoch {answer.get('epoch')} "
            f"(was {answer.get('previous')}; writes paused {answer.get('fenced_ms')} ms for "
            f"the hand-over, {answer.get('took_ms')} ms in all)"
        ),
    )


def render_members(answer: dict[str, Any], cluster: str) -> str:
    rows = [
        member_row(role, member)
        for role, kind in (("broker", "brokers"), ("proxy", "proxies"))
        for member in answer[kind]
    ]
    if not rows:
        return f"cluster {cluster!r}: no broker or proxy is registered"
    table = render_table(rows, MEMBER_COLUMNS)
    groups = [
        {
            **group,
            "master": group.get("master") or "(none)",
            "isr": ",".join(group["isr"]) or "-",
            "members": ",".join(sorted(group["members"])),
            "mode": group.get("mode") or "",
            "lag": replica_lag(group.get("replicas")),
        }
        for group in answer.get("broker_groups", [])
    ]
    if groups:
        table += "\n\n" + render_table(groups, GROUP_COLUMNS)
    return table


def replica_lag(replicas: Any) -> str:
    """Each replica's lag as its master sees it: ``b1 0 B/0ms, b2 1.2 KiB/40ms``."""
    if not isinstance(replicas, dict) or not replicas:
        return "-"
    shown = []
    for name, progress in sorted(replicas.items()):
        lag_bytes, lag_ms = progress.get("lag_bytes"), progress.get("lag_ms")
        size = format_size(lag_bytes) if isinstance(lag_bytes, int) else "?"
        time_ = f"{lag_ms}ms" if isinstance(lag_ms, int) else "?"
        shown.append(f"{name} {size}/{time_}")
    return ", ".join(shown)


def member_row(role: str, member: dict[str, Any]) -> dict[str, Any]:
    uptime, expires = member.get("uptime_ms"), member.get("expires_in_s")
    free, used = member.get("disk_free_bytes"), member.get("disk_used_ratio")
    return {
        **member,
        "disk_free_bytes": format_size(free) if isinstance(free, int) else "",
        "disk_used_ratio": f"{used * 100:.1f}%" if isinstance(used, float | int) else "",
        "role": role,
        "uptime_ms": format_duration_ms(uptime) if isinstance(uptime, int) else "",
        "expires_in_s": f"{expires}s" if isinstance(expires, int) else "",
        "queues": member.get("queues", ""),
    }


def broker_status(args: argparse.Namespace) -> None:
    status = client(args).get(for_broker("/v1/broker/status", args))
    emit(args, status, lambda: render_broker_status(status))


def render_broker_status(status: dict[str, Any]) -> str:
    """``GET /v1/broker/status`` as a record, the numbers an operator reads first on top."""
    shown = dict(status)
    if isinstance(shown.get("disk_used_ratio"), float):
        shown["disk_used_ratio"] = f"{shown['disk_used_ratio'] * 100:.1f}%"
    known = {key for key, _ in STATUS_FIRST}
    fields = [*STATUS_FIRST, *((k, k.replace("_", " ")) for k in shown if k not in known)]
    return render_record(shown, fields)


def config_get(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/runtime-config")
    keys = answer["keys"]
    if args.key is not None:
        match = [k for k in keys if k["key"] == args.key]
        if not match:
            raise CliError(
                f"{args.key!r} is not a runtime-changeable key; they are: "
                f"{', '.join(k['key'] for k in keys)}",
                "ILLEGAL_CONFIG",
            )
        emit(args, match[0], lambda: readable(match[0]["key"], match[0]["value"]))
        return
    rows = [{**k, "value": readable(k["key"], k["value"])} for k in keys]
    emit(
        args,
        answer,
        lambda: render_table(
            rows, [("key", "KEY"), ("value", "VALUE"), ("description", "DESCRIPTION")]
        ),
    )


def readable(key: str, value: Any) -> str:
    """A value as people write it in the config file: 4.0 MiB, 30s (JSON keeps the number)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if key.endswith("_size"):
            return format_size(value)
        if key.endswith("_ms"):
            return format_duration_ms(value)
    return cell(value)


def config_set(args: argparse.Namespace) -> None:
    changes: dict[str, Any] = {}
    for text in args.assignments:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"bad assignment {text!r}: expected KEY=VALUE", "USAGE")
        changes[key.strip()] = value.strip()
    answer = client(args).patch("/v1/runtime-config", {"changes": changes})
    values = {k["key"]: k["value"] for k in answer["keys"]}
    emit(
        args,
        answer,
        lambda: "\n".join(
            f"set {key} = {readable(key, values[key])} (until restart)" for key in answer["changed"]
        ),
    )


def write_perm(args: argparse.Namespace) -> None:
    value = "true" if args.writable else "false"
    answer = client(args).patch(
        for_broker("/v1/runtime-config", args), {"changes": {"broker.writable": value}}
    )
    emit(
        args,
        answer,
        lambda: (
            f"{args.broker or 'the broker'} accepts new messages again"
            if args.writable
            else f"{args.broker or 'the broker'} accepts no new messages until "
            "'cluster write-perm --add' or a restart; consumers, acks and transaction "
            "decisions go on"
        ),
    )
