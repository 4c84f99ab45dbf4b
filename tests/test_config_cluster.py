"""The [cluster] and [replication] sections, and the broker / proxy flags mapped onto them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from halfmoon.cli.broker_command import build_broker_config
from halfmoon.cli.config_docs import render
from halfmoon.cli.main import build_parser
from halfmoon.cli.parser import UsageError
from halfmoon.cli.serve_command import build_config
from halfmoon.config import ConfigError, load_config
from halfmoon.config import replication_defaults as defaults

BROKER_FILE = """
[cluster]
name = "from-file"
coordinator = "etcd://10.0.0.5:2379"
broker_listen = "0.0.0.0:9000"
lease_ttl_s = "5s"

[replication]
group = "orders"
mode = "sync"
min_insync_replicas = 2
replica_max_lag_ms = "3s"
replica_max_lag_bytes = "1MiB"
replica_reads = true
"""


def parse(*words: str) -> argparse.Namespace:
    return build_parser().parse_args(list(words))


def test_defaults_are_the_flags_old_defaults():
    config = load_config(env={})
    assert config.cluster.name is None and config.cluster.coordinator is None
    assert config.cluster.broker_listen == "127.0.0.1:8091"
    assert config.cluster.broker_send_listen == "auto"
    assert config.cluster.lease_ttl_s is None
    assert config.cluster.proxy_lease_ttl_s() == 10
    assert config.cluster.proxy_workers == 1
    assert config.replication.group is None
    assert config.replication.mode == defaults.MODE
    assert config.replication.min_insync_replicas == defaults.MIN_INSYNC_REPLICAS
    assert config.replication.replica_max_lag_ms == defaults.REPLICA_MAX_LAG_MS
    assert config.replication.replica_max_lag_bytes == defaults.REPLICA_MAX_LAG_BYTES
    assert not config.replication.replica_reads and not config.replication.unclean_election


def test_a_file_sets_the_cluster_and_replication_keys(tmp_path: Path):
    (tmp_path / "h.toml").write_text(BROKER_FILE)
    config = load_config(file=tmp_path / "h.toml", env={})
    assert (config.cluster.name, config.cluster.coordinator) == (
        "from-file",
        "etcd://10.0.0.5:2379",
    )
    assert config.cluster.broker_listen == "0.0.0.0:9000"
    assert config.cluster.lease_ttl_s == 5
    replication = config.replication
    assert (replication.group, replication.mode, replication.min_insync_replicas) == (
        "orders",
        "sync",
        2,
    )
    assert replication.replica_max_lag_ms == 3000
    assert replication.replica_max_lag_bytes == 1024**2
    assert replication.replica_reads


def test_broker_flags_win_over_env_which_wins_over_the_file(tmp_path, monkeypatch):
    (tmp_path / "h.toml").write_text(BROKER_FILE)
    for name in [n for n in os.environ if n.startswith("HALFMOON_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HALFMOON_REPLICATION_MODE", "async")
    monkeypatch.setenv("HALFMOON_CLUSTER_BROKER_LISTEN", "127.0.0.1:9100")
    monkeypatch.setenv("HALFMOON_REPLICATION_MIN_INSYNC_REPLICAS", "3")
    args = parse(
        "broker",
        "--config",
        str(tmp_path / "h.toml"),
        "--listen",
        "127.0.0.1:0",
        "--cluster",
        "from-flag",
        "--lease-ttl",
        "7",
        "--group",
        "payments",
        "--replica-max-lag-bytes",
        "4096",
        "--unclean-election",
    )
    config = build_broker_config(args)
    assert config.cluster.broker_listen == "127.0.0.1:0"  # flag over env
    assert config.cluster.name == "from-flag"  # flag over file
    assert config.cluster.coordinator == "etcd://10.0.0.5:2379"  # file, no flag
    assert config.cluster.lease_ttl_s == 7
    assert config.replication.group == "payments"
    assert config.replication.mode == "async"  # env over file
    assert config.replication.min_insync_replicas == 3
    assert config.replication.replica_max_lag_bytes == 4096
    assert config.replication.replica_max_lag_ms == 3000  # file
    assert config.replication.unclean_election
    assert config.replication.replica_reads  # the file's; an absent switch leaves it


def test_proxy_flags_map_onto_cluster_keys(monkeypatch):
    for name in [n for n in os.environ if n.startswith("HALFMOON_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HALFMOON_CLUSTER_PROXY_WORKERS", "2")
    from halfmoon.cli.proxy_command import FLAG_KEYS

    args = parse(
        "proxy",
        "--cluster",
        "c",
        "--coordinator",
        "etcd://127.0.0.1:2379",
        "--name",
        "p1",
        "--lease-ttl",
        "4",
        "--amqp-listen",
        "",
    )
    args.data_dir = args.flush = None
    config = build_config(args, {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()})
    assert (config.cluster.name, config.cluster.coordinator) == ("c", "etcd://127.0.0.1:2379")
    assert config.cluster.proxy_name == "p1"
    assert config.cluster.proxy_workers == 2  # env: no --workers given
    assert config.cluster.proxy_lease_ttl_s() == 4
    assert config.server.amqp_listen == ""


def test_every_broker_and_proxy_flag_names_a_key():
    from halfmoon.cli import broker_command, proxy_command, serve_command
    from halfmoon.config import iter_keys

    keys = {info.key for info in iter_keys()}
    mapped = {
        **broker_command.FLAG_KEYS,
        **broker_command.SWITCH_KEYS,
        **proxy_command.FLAG_KEYS,
        **serve_command.FLAG_KEYS,
    }
    assert set(mapped.values()) <= keys
    # Every flag the two commands take, but the help, the config file, --set and the
    # internal ones a supervising proxy or a test passes, is a key's shorthand.
    internal = {
        "help",
        "config",
        "overrides",
        "print_config",
        "fake_clock_ms",
        "worker",
        "ready_fd",
        "supervisor_pid",
    }
    for command, own in (("broker", broker_command), ("proxy", proxy_command)):
        parser = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        dests = {a.dest for a in parser._actions} - internal
        known = set(own.FLAG_KEYS) | set(getattr(own, "SWITCH_KEYS", {}))
        if command == "proxy":
            known |= set(serve_command.FLAG_KEYS) | {"insecure"}
        assert dests <= known, f"{command} flags without a key: {sorted(dests - known)}"


def test_the_older_cluster_variables_still_name_the_cluster():
    config = load_config(
        env={"HALFMOON_CLUSTER": "old", "HALFMOON_COORDINATOR": "etcd://127.0.0.1:1"}
    )
    assert (config.cluster.name, config.cluster.coordinator) == ("old", "etcd://127.0.0.1:1")
    config = load_config(env={"HALFMOON_CLUSTER": "old", "HALFMOON_CLUSTER_NAME": "new"})
    assert config.cluster.name == "new"
    assert load_config(env={"HALFMOON_CLUSTER": ""}).cluster.name is None


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ("cluster.lease_ttl_s=1", "at least 2"),
        ("cluster.lease_ttl_s=1500ms", "not a whole number of seconds"),
        ("cluster.proxy_workers=0", "at least 1"),
        ("replication.mode=quorum", "one of sync, async"),
        ("replication.min_insync_replicas=-1", "at least 0"),
        ("replication.replica_max_lag_ms=0", "must be positive"),
    ],
)
def test_bad_cluster_values_are_refused_at_load(assignment, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(env={}, overrides=[assignment])


def test_a_bad_file_value_stops_the_broker_command_with_a_usage_error(tmp_path):
    (tmp_path / "h.toml").write_text('[replication]\nmode = "quorum"\n')
    with pytest.raises(UsageError, match="replication.mode"):
        build_broker_config(parse("broker", "--config", str(tmp_path / "h.toml")))


def test_configuration_doc_is_generated_from_the_dataclasses():
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    assert doc == render(), (
        "docs/configuration.md is stale: regenerate it with "
        "python -m halfmoon.cli.config_docs > docs/configuration.md"
    )


def test_broker_duration_and_size_flags_read_units():
    args = parse(
        "broker",
        "--lease-ttl",
        "1m",
        "--replica-max-lag-ms",
        "2s",
        "--replica-max-lag-bytes",
        "1MiB",
    )
    config = build_broker_config(args)
    assert config.cluster.lease_ttl_s == 60
    assert config.replication.replica_max_lag_ms == 2000
    assert config.replication.replica_max_lag_bytes == 1024**2
    # Bare numbers keep their historical unit: seconds, milliseconds, bytes.
    config = build_broker_config(parse("broker", "--lease-ttl", "5", "--replica-max-lag-ms", "250"))
    assert (config.cluster.lease_ttl_s, config.replication.replica_max_lag_ms) == (5, 250)


def test_a_too_short_lease_stops_the_broker_before_it_opens_anything(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "halfmoon", "broker", "--data-dir", str(tmp_path / "d"),
         "--lease-ttl", "1"],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "lease_ttl_s (--lease-ttl) must be at least 2 seconds" in result.stderr
    assert not (tmp_path / "d").exists()


def halfmoon(*words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *words],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
    )


def test_broker_print_config_shows_the_layers_and_opens_nothing(tmp_path):
    (tmp_path / "h.toml").write_text(BROKER_FILE)
    result = halfmoon(
        "broker",
        "--config",
        str(tmp_path / "h.toml"),
        "--data-dir",
        str(tmp_path / "d"),
        "--replication",
        "async",
        "--print-config",
        env={"HALFMOON_REPLICATION_MIN_INSYNC_REPLICAS": "2", "HALFMOON_CLUSTER": "old"},
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["cluster"]["name"] == "old"  # the variable wins over the file
    assert printed["cluster"]["lease_ttl_s"] == 5
    assert printed["replication"]["group"] == "orders"
    assert printed["replication"]["mode"] == "async"  # the flag wins over the file
    assert printed["replication"]["min_insync_replicas"] == 2
    assert not (tmp_path / "d").exists()


def test_proxy_print_config_reads_the_cluster_from_the_environment():
    result = halfmoon(
        "proxy",
        "--workers",
        "3",
        "--print-config",
        env={"HALFMOON_CLUSTER": "prod", "HALFMOON_COORDINATOR": "etcd://127.0.0.1:2379"},
    )
    assert result.returncode == 0, result.stderr
    cluster = json.loads(result.stdout)["cluster"]
    assert (cluster["name"], cluster["coordinator"], cluster["proxy_workers"]) == (
        "prod",
        "etcd://127.0.0.1:2379",
        3,
    )
