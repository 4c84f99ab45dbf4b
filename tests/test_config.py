"""The layered configuration loader: forms, precedence, and errors that name the key."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from halfmoon.errors import InvalidArgument

config_module = pytest.importorskip(
    "halfmoon.config",
    reason="halfmoon.config needs halfmoon.{store,broker,server}.config, not written yet",
)
Config = config_module.Config
ConfigError = config_module.ConfigError
iter_keys = config_module.iter_keys
load_config = config_module.load_config
parse_duration_ms = config_module.parse_duration_ms
parse_size = config_module.parse_size


class Flush(enum.Enum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass
class SampleStore:
    data_dir: Path = Path("data")
    flush: Flush = Flush.ASYNC
    segment_size: int = 1024
    flush_interval_ms: int = 500
    verify_crc: bool = True
    checkpoint_interval: float = 1.0  # seconds
    retention_hours: float = 72.0
    disk_usage_ratio: float = 0.75


@dataclass
class SampleBroker:
    name: str = "halfmoon"
    default_queue_count: int = 8
    max_body_size: int = 4 * 1024 * 1024
    ratio: float = 0.5
    retry_levels_ms: list[int] = field(default_factory=lambda: [1000, 5000])
    consume_from: Literal["earliest", "latest"] = "latest"
    cluster: str | None = None

    def __post_init__(self) -> None:
        if self.default_queue_count < 1:
            raise ValueError("default_queue_count must be at least 1")


@dataclass
class SampleRoot:
    store: SampleStore = field(default_factory=SampleStore)
    broker: SampleBroker = field(default_factory=SampleBroker)


def load(**kwargs):
    kwargs.setdefault("env", {})
    return load_config(root=SampleRoot, **kwargs)


# -- forms -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("6s", 6000),
        ("1.5s", 1500),
        ("1m", 60_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("250", 250),
        (42, 42),
        (" 3S ", 3000),
    ],
)
def test_durations_read_as_milliseconds(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "fast", "5 fortnights", "-1s", "1.2.3s", True])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_bare_numbers_are_in_the_fields_unit():
    assert parse_duration_ms("2", bare_unit_ms=1000) == 2000
    assert parse_duration_ms(0.5, bare_unit_ms=1000) == 500


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512", 512),
        ("4MiB", 4 * 1024**2),
        ("1GiB", 1024**3),
        ("64KiB", 65536),
        ("1KB", 1000),
        ("2mb", 2_000_000),
        ("1.5KiB", 1536),
        (100, 100),
    ],
)
def test_sizes_read_as_bytes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["big", "4 MiBs", "-4MiB", "1.1B"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_defaults_when_nothing_is_given():
    cfg = load()
    assert cfg == SampleRoot()


def test_float_durations_hours_and_plain_numbers():
    cfg = load(
        overrides=[
            "store.checkpoint_interval=250ms",
            "store.retention_hours=2d",
            "store.disk_usage_ratio=0.5",
        ]
    )
    assert cfg.store.checkpoint_interval == 0.25
    assert cfg.store.retention_hours == 48.0
    assert cfg.store.disk_usage_ratio == 0.5
    assert load(overrides=["store.checkpoint_interval=2"]).store.checkpoint_interval == 2.0
    assert load(overrides=["store.retention_hours=12"]).store.retention_hours == 12.0
    with pytest.raises(ConfigError, match="a number"):
        load(overrides=["store.disk_usage_ratio=5s"])


def test_int_milliseconds_must_be_whole():
    with pytest.raises(ConfigError, match="whole number of milliseconds"):
        load(overrides=["store.flush_interval_ms=0.5ms"])


def test_every_field_type_converts_from_text():
    cfg = load(
        overrides=[
            "store.data_dir=/tmp/x",
            "store.flush=SYNC",
            "store.segment_size=1GiB",
            "store.flush_interval_ms=2s",
            "store.verify_crc=off",
            "broker.name=edge-1",
            "broker.default_queue_count=16",
            "broker.max_body_size=8MiB",
            "broker.ratio=0.25",
            "broker.retry_levels_ms=1s, 10s,1m",
            "broker.consume_from=earliest",
            "broker.cluster=east",
        ]
    )
    assert cfg.store == SampleStore(Path("/tmp/x"), Flush.SYNC, 1024**3, 2000, False, 1.0)
    assert cfg.broker.name == "edge-1"
    assert cfg.broker.default_queue_count == 16
    assert cfg.broker.max_body_size == 8 * 1024**2
    assert cfg.broker.ratio == 0.25
    assert cfg.broker.retry_levels_ms == [1000, 10_000, 60_000]
    assert cfg.broker.consume_from == "earliest"
    assert cfg.broker.cluster == "east"
    assert load(overrides=["broker.cluster=none"]).broker.cluster is None


# -- precedence --------------------------------------------------------------


def test_precedence_defaults_file_env_flags_set(tmp_path):
    toml = tmp_path / "halfmoon.toml"
    toml.write_text(
        '[broker]\nname = "from-file"\ndefault_queue_count = 2\nmax_body_size = "1MiB"\n'
        'ratio = 1\n\n[store]\nflush_interval_ms = "3s"\nsegment_size = 2048\nflush = "sync"\n'
    )
    env = {
        "HALFMOON_BROKER_NAME": "from-env",
        "HALFMOON_BROKER_DEFAULT_QUEUE_COUNT": "3",
        "HALFMOON_STORE_FLUSH_INTERVAL_MS": "4s",
        "HALFMOON_ADMIN": "http://elsewhere:1",  # a tool variable, not a config key
        "PATH": "/bin",
    }
    cfg = load(
        file=toml,
        env=env,
        flags={
            "broker.name": "from-flag",
            "broker.default_queue_count": None,
            "store.flush_interval_ms": "5s",
        },
        overrides=["store.flush_interval_ms=6s"],
    )
    assert cfg.broker.name == "from-flag"  # flag beats env and file
    assert cfg.broker.default_queue_count == 3  # env beats file; a None flag is "not given"
    assert cfg.broker.max_body_size == 1024**2  # file beats default
    assert cfg.broker.ratio == 1.0
    assert cfg.store.flush_interval_ms == 6000  # --set beats everything
    assert cfg.store.segment_size == 2048
    assert cfg.store.flush is Flush.SYNC
    assert cfg.store.data_dir == Path("data")  # untouched default


def test_later_set_wins_over_earlier_set():
    cfg = load(overrides=["broker.name=a", "broker.name=b"])
    assert cfg.broker.name == "b"


# -- errors ------------------------------------------------------------------


def test_unknown_key_names_the_key_and_the_known_ones():
    with pytest.raises(ConfigError) as info:
        load(overrides=["broker.queue_count=4"])
    message = info.value.message
    assert "'broker.queue_count'" in message
    assert "broker.default_queue_count" in message
    assert info.value.code == "ILLEGAL_CONFIG"


def test_unknown_section_lists_the_sections():
    with pytest.raises(ConfigError, match=r"sections are: broker, store"):
        load(overrides=["storage.x=1"])


def test_bad_value_names_key_source_and_form():
    with pytest.raises(ConfigError) as info:
        load(overrides=["store.flush_interval_ms=soon"])
    message = info.value.message
    assert "store.flush_interval_ms" in message
    assert "--set" in message
    assert "500ms, 6s, 1m" in message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("broker.default_queue_count=eight", "an integer"),
        ("store.verify_crc=maybe", "true or false"),
        ("store.flush=later", "one of sync, async"),
        ("broker.consume_from=middle", "one of earliest, latest"),
        ("broker.max_body_size=huge", "4MiB"),
        ("broker.ratio=half", "a number"),
    ],
)
def test_bad_values_say_the_accepted_form(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load(overrides=[override])


@pytest.mark.parametrize(
    "override",
    [
        "broker.default_queue_count=0",
        "broker.max_body_size=0",
        "broker.default_invisible_ms=0",
        "broker.timer_max_heap=-1",
        "broker.name=",
    ],
)
def test_values_no_operation_could_use_are_refused_at_load(override):
    key = override.split("=")[0].split(".")[1]
    with pytest.raises(ConfigError, match=f"section broker: invalid broker configuration: .*{key}"):
        load_config(env={}, overrides=[override])


def test_a_running_broker_refuses_the_same_values():
    from halfmoon.broker.config import BrokerConfig, apply_changes

    config = BrokerConfig()
    with pytest.raises(InvalidArgument, match="default_queue_count must be positive"):
        apply_changes(config, {"default_queue_count": 0, "max_delay_ms": 5})
    assert (config.default_queue_count, config.max_delay_ms) == (8, BrokerConfig().max_delay_ms)


def test_set_without_equals_or_section_is_refused():
    with pytest.raises(ConfigError, match="section.key=value"):
        load(overrides=["broker.name"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load(overrides=["name=x"])


def test_unknown_env_key_in_a_known_section_is_an_error():
    with pytest.raises(ConfigError, match="HALFMOON_BROKER_QUEUES"):
        load(env={"HALFMOON_BROKER_QUEUES": "4"})


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError, match="environment variable HALFMOON_BROKER_RATIO"):
        load(env={"HALFMOON_BROKER_RATIO": "x"})


def test_unknown_key_in_file_names_the_file(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[broker]\nnope = 1\n")
    with pytest.raises(ConfigError, match=r"'broker.nope' \(from .*c\.toml\)"):
        load(file=toml)


def test_wrong_toml_type_is_refused(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[broker]\nname = 5\n")
    with pytest.raises(ConfigError, match="broker.name"):
        load(file=toml)


def test_unreadable_or_invalid_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(file=tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[broker\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(file=bad)


def test_section_validation_errors_become_config_errors():
    with pytest.raises(ConfigError, match="section broker: default_queue_count must be at least 1"):
        load(overrides=["broker.default_queue_count=0"])


# -- the real configuration --------------------------------------------------


def test_real_config_has_every_section_and_defaults():
    cfg = load_config(env={})
    assert isinstance(cfg, Config)
    keys = {info.key for info in iter_keys()}
    assert {k.split(".")[0] for k in keys} == {
        "store",
        "broker",
        "server",
        "transaction",
        "auth",
        "tls",
        "etcd",
        "internal",
        "cluster",
        "replication",
        "log",
    }
    assert "broker.default_queue_count" in keys
    assert "server.admin_listen" in keys


def test_real_config_reads_durations_and_sizes():
    cfg = load_config(
        env={"HALFMOON_BROKER_DEFAULT_INVISIBLE_MS": "45s"},
        overrides=["broker.max_body_size=1MiB", "broker.offset_persist_interval_ms=1m"],
    )
    assert cfg.broker.default_invisible_ms == 45_000
    assert cfg.broker.max_body_size == 1024**2
    assert cfg.broker.offset_persist_interval_ms == 60_000


def test_every_real_key_is_documented():
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    missing = [info.key for info in iter_keys() if f"`{info.key}`" not in doc]
    assert not missing, (
        f"docs/configuration.md lacks {missing}: regenerate it with "
        "python -m halfmoon.cli.config_docs > docs/configuration.md"
    )


def test_every_real_key_accepts_its_own_default():
    # Round trip: the default, written as text, reads back as itself.
    for info in iter_keys():
        if info.default is None:
            continue
        text = config_module._plain(info.default)
        if isinstance(text, list):
            text = ",".join(str(t) for t in text)
        assert info.convert(str(text)) == info.default, info.key
