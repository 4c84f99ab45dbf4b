"""One configuration for the whole process, loaded once, from layered sources.

Sources, later ones winning::

    defaults < TOML file (--config FILE) < HALFMOON_<SECTION>_<KEY> environment
             < dedicated flags (--data-dir, --listen, ...) < --set section.key=value

The loader knows nothing of individual keys: it walks the dataclass fields of
each section (``store``, ``broker``, ``server``, ``transaction``), so a new field is a new key
with no change here. A value's form comes from the field:

- ``int``, ``float``, ``str``, ``bool`` (``true/false/yes/no/on/off/1/0``),
  ``pathlib.Path``, enums (by value or name, case-insensitive), ``Literal``
  choices, ``X | None`` (``none`` or an empty string means None), and
  ``list``/``tuple`` (a TOML array, or comma-separated text).
- **Durations** read ``500ms``, ``6s``, ``1.5s``, ``1m``, ``2h``, ``1d``; a bare
  number is in the field's own unit, which its name and type give:
  an ``int`` field ending in ``_ms`` holds milliseconds, one ending in ``_s``
  whole seconds; a ``float`` field
  ending in ``_hours`` holds hours; any other ``float`` field holds seconds
  (``flush_interval``, ``tick_interval``, ...) unless its name ends in
  ``_ratio``, ``_multiplier``, ``_factor``, ``_rate``, ``_fraction`` or
  ``_percent``, which are plain numbers.
- **Sizes**: an ``int`` field whose name ends in ``_size`` or ``_bytes`` (but
  not ``batch_size``, a message count) holds bytes and reads ``512``, ``64KiB``, ``4MiB``, ``1GiB``
(binary) or ``1KB``/``1MB``/``1GB``
  (decimal).

An unknown key or a bad value raises :class:`ConfigError` naming the key, the
source and the accepted form. ``docs/configuration.md`` lists every key.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from halfmoon import environment
from halfmoon.auth.config import AuthConfig, EtcdTlsConfig, InternalTlsConfig, TlsConfig
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.config.cluster import LEGACY_ENV, ClusterConfig
from halfmoon.config.replication import ReplicationConfig
from halfmoon.errors import EXIT_USAGE, InvalidArgument
from halfmoon.logs import LogConfig
from halfmoon.store.config import StoreConfig

ENV_PREFIX = environment.PREFIX


class ConfigError(InvalidArgument):
    """A configuration key is unknown or its value has the wrong form."""

    code = "ILLEGAL_CONFIG"
    protocol_code = "BAD_REQUEST"
    exit_code = EXIT_USAGE  # a wrong flag, variable or config file


# The server's own section lives here, not in halfmoon.server: the server reads this
# whole-program config, so its settings sit below it. Durations are float seconds.
@dataclass
class ServerConfig:
    # gRPC endpoint (apache.rocketmq.v2.MessagingService). Port 0 binds a free port;
    # the ready line reports the real one.
    listen: str = "127.0.0.1:8081"
    # Admin HTTP API (JSON + /metrics), served by halfmoon.server.admin.
    admin_listen: str = "127.0.0.1:8082"
    # AMQP 0-9-1 endpoint (docs/amqp.md); "" turns it off. 5673, not AMQP's 5672: RabbitMQ
    # often holds 5672 on the same machine, and serve must start beside it.
    amqp_listen: str = "127.0.0.1:5673"
    # How long an AMQP delivery may stay unacked before it goes back to its queue (RabbitMQ's
    # consumer_timeout, 30 min). At least broker.min_receive_invisible_ms.
    amqp_consumer_timeout: float = 1800.0
    # Below this much free disk where messages are stored, AMQP publishers are blocked
    # (Connection.Blocked; RabbitMQ's disk_free_limit, whose default this is); 0 turns it
    # off. A cluster proxy compares it with the least free of the live brokers.
    amqp_disk_free_limit_bytes: int = 50_000_000
    # Longest a ReceiveMessage / PullMessage may wait for a message (the client asks
    # for less or more; RocketMQ's proxy caps at 20-30 s).
    long_polling_max: float = 30.0
    # Long-polling timeout announced to consumers in their Settings.
    long_polling_default: float = 20.0
    # How long a clean shutdown waits for in-flight RPCs before cancelling them.
    shutdown_grace: float = 5.0
    # How often broker.tick() runs (delay deliveries, offset/state snapshots).
    tick_interval: float = 0.1
    # Receive batch size announced to push consumers; also the cap on a request's batch.
    receive_batch_size: int = 32
    max_receive_batch_size: int = 1024
    # Producer retry policy announced in Settings (RocketMQ proxy defaults).
    producer_max_attempts: int = 3
    producer_backoff_initial: float = 0.01
    producer_backoff_max: float = 1.0
    producer_backoff_multiplier: float = 2.0
    # Largest gRPC request accepted (a batch of messages), bytes.
    max_request_bytes: int = 64 * 1024 * 1024
    # Threads that run broker calls off the event loop.
    worker_threads: int = 8
    # Host advertised in routes when the client's request names no endpoint.
    advertise_host: str | None = None
    # Push consumers' receives (auto_renew) get their invisible time renewed while the
    # listener works, as RocketMQ's proxy does (enableProxyAutoRenew); see server/renewal.py.
    auto_renew: bool = True
    # Invisible time of an auto-renewed receive; the client's own is ignored (RocketMQ
    # proxy's defaultInvisibleTimeMills). At least broker.min_receive_invisible_ms.
    auto_renew_invisible_time: float = 60.0
    # A handle is renewed once it would become visible within this (renewAheadTimeMillis).
    renew_ahead_time: float = 10.0
    # Longest pause between two looks for due handles (renewSchedulePeriodMillis); also
    # how long a client whose telemetry stream ended has to open a new one before its
    # handles are released.
    renew_schedule_period: float = 5.0
    # The n-th renewal hides the message this long; the last entry repeats (RocketMQ's
    # RenewStrategyPolicy: 1, 3, 5, 10, 30 min, 1 h).
    renew_durations: tuple[float, ...] = (60.0, 180.0, 300.0, 600.0, 1800.0, 3600.0)
    # Renewing stops this long after the first delivery: the message then gets the
    # group's retry backoff, as a failed delivery (renewMaxTimeMillis).
    renew_max_time: float = 3 * 3600.0
    # Failed renewals of one handle before it is left to expire (maxRenewRetryTimes).
    renew_max_retries: int = 3
    # Invisible time left to the handles of a client that went away, so another consumer
    # gets them soon (invisibleTimeMillisWhenClear).
    renew_clear_invisible_time: float = 1.0
    # Most handles renewed at once; deliveries beyond it are served unrenewed (a warning).
    renew_max_handles: int = 100_000
    # Once ready, freeze what startup and recovery built out of the garbage collector's
    # full collections (halfmoon/gc_tuning.py).
    gc_freeze: bool = True


def parse_host_port(address: str, *, what: str = "address") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too); raises InvalidArgument with a fix."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(f"{what} {address!r} must look like HOST:PORT, e.g. 127.0.0.1:8081")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidArgument(f"{what} {address!r} has a non-numeric port") from None
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"{what} {address!r}: port must be between 0 and 65535")
    return host, port


@dataclass
class Config:
    """Everything ``halfmoon serve`` needs, one section per layer."""

    store: StoreConfig = field(default_factory=lambda: StoreConfig(data_dir=Path("data")))
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    transaction: TransactionConfig = field(default_factory=TransactionConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    # Cluster mode: TLS to etcd, and mutual TLS between proxies and brokers.
    etcd: EtcdTlsConfig = field(default_factory=EtcdTlsConfig)
    internal: InternalTlsConfig = field(default_factory=InternalTlsConfig)
    # Cluster mode's processes (halfmoon broker, halfmoon proxy) and broker groups.
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    log: LogConfig = field(default_factory=LogConfig)


# -- value forms -------------------------------------------------------------

_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_NUMBER_WITH_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})

DURATION_FORM = "a duration such as 500ms, 6s, 1m, 2h, 1d"
SIZE_FORM = "a size such as 512, 64KiB, 4MiB, 1GiB (a bare integer means bytes)"


def parse_duration_ms(text: str | int | float, bare_unit_ms: float = 1) -> float:
    """A duration in milliseconds: ``"6s"`` → 6000. A bare number is in units of
    ``bare_unit_ms`` (1 = milliseconds, 1000 = seconds). Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"expected {DURATION_FORM}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError("a duration cannot be negative")
        return text * bare_unit_ms
    match = _NUMBER_WITH_UNIT.match(str(text))
    if not match:
        raise ValueError(f"expected {DURATION_FORM}")
    number, unit = match.groups()
    if not unit:
        return float(number) * bare_unit_ms if "." in number else int(number) * bare_unit_ms
    if unit.lower() not in _DURATION_UNITS_MS:
        raise ValueError(f"unknown duration unit {unit!r}; expected {DURATION_FORM}")
    ms = float(number) * _DURATION_UNITS_MS[unit.lower()]
    return int(ms) if ms == int(ms) else ms


def _whole(amount: float, text: object, unit_ms: int) -> int:
    if amount != int(amount):
        raise ValueError(f"{text!r} is not a whole number of {_UNIT_NAMES[unit_ms]}")
    return int(amount)


def parse_size(text: str | int) -> int:
    """``"4MiB"`` → 4194304; a bare integer is already bytes. Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"expected {SIZE_FORM}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError("a size cannot be negative")
        return text
    match = _NUMBER_WITH_UNIT.match(str(text))
    if not match:
        raise ValueError(f"expected {SIZE_FORM}")
    number, unit = match.groups()
    if unit.lower() not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r}; expected {SIZE_FORM}")
    size = float(number) * _SIZE_UNITS[unit.lower()]
    if size != int(size):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(size)


_PLAIN_NUMBER_WORDS = frozenset({"ratio", "multiplier", "factor", "rate", "fraction", "percent"})


def duration_unit_ms(name: str, tp: Any) -> int | None:
    """Milliseconds per unit of a duration field, or None when ``name`` is no duration."""
    if tp is int and name.endswith("_ms"):
        return 1
    if tp is int and name.endswith("_s"):
        return 1000
    if tp is float:
        if name.endswith("_ms"):
            return 1
        if name.endswith("_hours"):
            return 3_600_000
        if name.rsplit("_", 1)[-1] not in _PLAIN_NUMBER_WORDS:
            return 1000
    return None


_UNIT_NAMES = {1: "milliseconds", 1000: "seconds", 3_600_000: "hours"}


def is_size_key(name: str, tp: Any = int) -> bool:
    # A batch size counts messages, not bytes.
    return tp is int and name.endswith(("_size", "_bytes")) and not name.endswith("batch_size")


@dataclass(frozen=True)
class KeyInfo:
    """One configuration key: where it lives, its type and its default."""

    key: str  # "section.name" (deeper nesting adds more dots)
    type: Any
    default: Any

    @property
    def name(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")

    def form(self) -> str:
        """The accepted form, in words, for error messages and the docs."""
        return describe_form(self.name, self.type)

    def convert(self, value: Any) -> Any:
        """A raw value (text from env/flags, or a TOML value) as the field's type."""
        return convert_value(self.name, self.type, value)


def describe_form(name: str, tp: Any) -> str:
    unit = duration_unit_ms(name, tp)
    if unit is not None:
        return f"{DURATION_FORM} (a bare number means {_UNIT_NAMES[unit]})"
    if is_size_key(name, tp):
        return SIZE_FORM
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        forms = " or ".join(describe_form(name, a) for a in inner)
        return f"{forms}, or none" if type(None) in typing.get_args(tp) else forms
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (list, tuple, set, frozenset):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item_form = describe_form("", args[0]) if args else "text"
        return f"a list of {item_form} (a TOML array or comma-separated text)"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is Path:
        return "a path"
    return "text"


def convert_value(name: str, tp: Any, value: Any) -> Any:
    """Convert ``value`` for a field called ``name`` of type ``tp``; raises ValueError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (
            value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))
        ):
            return None
        choices = [a for a in args if a is not type(None)]
        if len(choices) == 1:  # X | None: X's own reason for a refusal
            return convert_value(name, choices[0], value)
        for arg in choices:
            try:
                return convert_value(name, arg, value)
            except ValueError:
                continue
        raise ValueError(f"expected {describe_form(name, tp)}")
    unit = duration_unit_ms(name, tp)
    if unit is not None:
        ms = parse_duration_ms(value, unit)
        return _whole(ms / unit, value, unit) if tp is int else ms / unit
    if is_size_key(name, tp):
        return parse_size(value)
    if origin is typing.Literal:
        for choice in typing.get_args(tp):
            if value == choice or (isinstance(value, str) and str(choice).lower() == value.lower()):
                return choice
        raise ValueError(f"expected {describe_form(name, tp)}")
    if origin in (list, tuple, set, frozenset):
        items = (
            [s.strip() for s in value.split(",") if s.strip()] if isinstance(value, str) else value
        )
        if not isinstance(items, list | tuple):
            raise ValueError(f"expected {describe_form(name, tp)}")
        item_args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item_type = item_args[0] if item_args else str
        return origin(convert_value(name, item_type, item) for item in items)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if value == member.value or (
                isinstance(value, str)
                and value.lower() in (str(member.value).lower(), member.name.lower())
            ):
                return member
        raise ValueError(f"expected {describe_form(name, tp)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError("expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return int(value)
        raise ValueError("expected an integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError("expected a number")
    if tp is Path:
        if isinstance(value, str | Path):
            return Path(value).expanduser()
        raise ValueError("expected a path")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError("expected text")
    if tp is Any:
        return value
    raise ValueError(f"cannot set a value of type {tp!r} from configuration")


# -- walking the dataclasses -------------------------------------------------


def iter_keys(root: type = Config) -> Iterator[KeyInfo]:
    """Every settable leaf key of ``root`` (a dataclass type), in field order.

    Defaults are read from ``root()``, so a section default set by the parent
    (``Config.store``'s data directory) counts.
    """
    yield from _walk(root, root(), "")


def _walk(cls: type, instance: Any, prefix: str) -> Iterator[KeyInfo]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from _walk(tp, getattr(instance, f.name), key + ".")
        else:
            yield KeyInfo(key=key, type=tp, default=getattr(instance, f.name))


def _build(instance: Any, values: Mapping[str, Any], prefix: str = "") -> Any:
    """A copy of ``instance`` with ``values`` (flat keys) applied, validated by the section."""
    hints = typing.get_type_hints(type(instance))
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(instance):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            changes[f.name] = _build(getattr(instance, f.name), values, key + ".")
        elif key in values:
            changes[f.name] = values[key]
    section = prefix.rstrip(".") or "root"
    try:
        return dataclasses.replace(instance, **changes)
    except InvalidArgument as exc:
        raise ConfigError(f"configuration section {section}: {exc.message}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"configuration section {section}: {exc}") from exc


# -- the layered loader ------------------------------------------------------


class _Layers:
    """Collects raw values source by source, converting and checking each as it comes."""

    def __init__(self, root: type) -> None:
        self.keys = {info.key: info for info in iter_keys(root)}
        self.values: dict[str, Any] = {}

    def set(self, key: str, raw: Any, source: str) -> None:
        info = self.keys.get(key)
        if info is None:
            raise ConfigError(
                f"unknown configuration key {key!r} (from {source}); {self._hint(key)}"
            )
        try:
            self.values[key] = info.convert(raw)
        except ValueError as exc:
            # The form always ends the message; the reason is added only when it says more.
            reason = "" if str(exc).startswith("expected") else f"{exc}; "
            raise ConfigError(
                f"bad value {raw!r} for {key} (from {source}): {reason}expected {info.form()}"
            ) from exc

    def _hint(self, key: str) -> str:
        section = key.split(".", 1)[0]
        same_section = sorted(k for k in self.keys if k.startswith(section + "."))
        if same_section:
            return "known keys in this section: " + ", ".join(same_section)
        sections = sorted({k.split(".", 1)[0] for k in self.keys})
        return "sections are: " + ", ".join(sections)

    def add_toml(self, path: Path) -> None:
        try:
            with open(path, "rb") as fh:
                document = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        for key, raw in _flatten(document):
            self.set(key, raw, str(path))

    def add_env(self, env: Mapping[str, str]) -> None:
        by_env_name = {info.env_name: info.key for info in self.keys.values()}
        sections = {k.split(".", 1)[0].upper() for k in self.keys}
        # Older names first, so a key's own variable wins over its alias.
        for alias, aliased in LEGACY_ENV.items():
            if env.get(alias) and aliased in self.keys:
                self.set(aliased, env[alias], f"environment variable {alias}")
        for name in sorted(env):
            if not name.startswith(ENV_PREFIX) or name in LEGACY_ENV:
                continue
            key = by_env_name.get(name)
            if key is not None:
                self.set(key, env[name], f"environment variable {name}")
                continue
            # HALFMOON_ADMIN and other tool variables have no section prefix:
            # only names that claim a section must name a real key.
            rest = name[len(ENV_PREFIX) :]
            if rest.split("_", 1)[0] in sections:
                raise ConfigError(
                    f"unknown configuration key in environment variable {name}; "
                    f"{self._hint(rest.split('_', 1)[0].lower() + '.')}"
                )


def _flatten(document: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in document.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            yield from _flatten(value, key + ".")
        else:
            yield key, value


def parse_assignment(text: str) -> tuple[str, str]:
    """``"broker.default_queue_count=4"`` → (key, value); raises ConfigError."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or "." not in key:
        raise ConfigError(
            f"bad --set {text!r}: expected section.key=value, e.g. broker.default_queue_count=4"
        )
    return key.strip(), value.strip()


def load_config(
    *,
    file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    root: type = Config,
) -> Any:
    """Build the configuration from its layers (see the module docstring).

    ``env`` defaults to this process's environment; ``flags`` maps keys (``"server.listen"``)
    to values of dedicated command-line flags (None = flag not given);
    ``overrides`` are ``section.key=value`` texts from ``--set``.
    """
    layers = _Layers(root)
    if file is not None:
        layers.add_toml(Path(file))
    layers.add_env(environment.variables() if env is None else env)
    for key, raw in (flags or {}).items():
        if raw is not None:
            layers.set(key, raw, "command-line flag")
    for text in overrides:
        key, raw = parse_assignment(text)
        layers.set(key, raw, f"--set {text}")
    return _build(root(), layers.values)


def config_to_dict(config: Any) -> dict[str, Any]:
    """The configuration as plain JSON-able values (enums by value, paths as text)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = config_to_dict(value)
        else:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return value
