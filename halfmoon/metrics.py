"""Counters and gauges, rendered in the Prometheus text format (version 0.0.4).

Small and dependency-free. Two kinds of metric:

- **owned** metrics (:class:`Counter`, :class:`Gauge`, :class:`Histogram`) that
  code updates as things happen (``requests.inc(method="GET", status="200")``);
- **collected** families, produced at scrape time by a callback registered
  with :meth:`MetricsRegistry.add_collector`, for numbers that already live
  elsewhere (queue offsets, lag, broker status) and would only go stale if
  copied.

A collector that raises is skipped for that scrape (and counted in
``halfmoon_metrics_collector_errors_total``) so one broken source never hides
every other metric.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelValues = tuple[str, ...]


@dataclass
class MetricFamily:
    """One metric name with its samples: what a collector returns."""

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    # A histogram's samples name their series (_bucket, _sum, _count) with SUFFIX.
    samples: list[tuple[Mapping[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: object) -> MetricFamily:
        self.samples.append(({k: str(v) for k, v in labels.items()}, value))
        return self


SUFFIX = "__suffix"  # a sample "label" naming a histogram's series; never rendered as a label


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME.match(name):
            raise ValueError(f"illegal metric name {name!r}")
        for label in labelnames:
            if not _LABEL.match(label) or label.startswith("__"):
                raise ValueError(f"illegal label name {label!r}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._values: dict[LabelValues, float] = {}
        self._lock = threading.Lock()

    def _key(self, labels: Mapping[str, object]) -> LabelValues:
        if set(labels) != set(self.labelnames):
            raise ValueError(
                f"{self.name} takes labels {list(self.labelnames)}, got {sorted(labels)}"
            )
        return tuple(str(labels[name]) for name in self.labelnames)

    def value(self, **labels: object) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def family(self) -> MetricFamily:
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.labelnames:
            items = [((), 0.0)]  # an unlabelled metric exists from the start, at zero
        return MetricFamily(
            self.name,
            self.kind,
            self.help,
            [(dict(zip(self.labelnames, key, strict=True)), value) for key, value in items],
        )


class Counter(_Metric):
    """A value that only goes up (restarts at zero with the process)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if amount < 0:
            raise ValueError("a counter cannot go down")
        self.inc_key(self._key(labels), amount)

    def inc_key(self, key: LabelValues, amount: float = 1.0) -> None:
        """:meth:`inc` for label values already in ``labelnames`` order, as strings (a hot
        path builds its keys once instead of checking the label names on every call)."""
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(_Metric):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: object) -> None:
        self.inc(-amount, **labels)


class Histogram(_Metric):
    """Observations counted into fixed buckets (upper bounds, ascending), with their sum.

    :meth:`observe_key` is one bisect and three additions under the lock: cheap enough
    for a per-request path."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = ()
    ) -> None:
        super().__init__(name, help, labelnames)
        if not buckets or list(buckets) != sorted(buckets):
            raise ValueError(f"{name}: buckets must be ascending upper bounds")
        self.buckets = tuple(float(b) for b in buckets)
        # label values -> [per-bucket counts..., +Inf count, sum]
        self._series: dict[LabelValues, list[float]] = {}

    def observe(self, value: float, **labels: object) -> None:
        self.observe_key(self._key(labels), value)

    def observe_key(self, key: LabelValues, value: float) -> None:
        slot = bisect.bisect_left(self.buckets, value)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = [0.0] * (len(self.buckets) + 2)
            series[slot] += 1
            series[-1] += value

    def count(self, **labels: object) -> float:
        with self._lock:
            series = self._series.get(self._key(labels))
            return sum(series[:-1]) if series is not None else 0.0

    def family(self) -> MetricFamily:
        with self._lock:
            items = sorted((key, list(series)) for key, series in self._series.items())
        fam = MetricFamily(self.name, self.kind, self.help)
        bounds = [*(_number(b) for b in self.buckets), "+Inf"]
        for key, series in items:
            labels = dict(zip(self.labelnames, key, strict=True))
            running = 0.0
            for bound, count in zip(bounds, series[:-1], strict=True):
                running += count
                fam.samples.append(({**labels, "le": bound, SUFFIX: "_bucket"}, running))
            fam.samples.append(({**labels, SUFFIX: "_sum"}, series[-1]))
            fam.samples.append(({**labels, SUFFIX: "_count"}, running))
        return fam


Collector = Callable[[], Iterable[MetricFamily]]


class MetricsRegistry:
    """The metrics of one process; :meth:`render` is the ``/metrics`` body."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: list[Collector] = []
        self._lock = threading.Lock()
        self.collector_errors = Counter(
            "halfmoon_metrics_collector_errors_total",
            "Scrapes in which a metrics source failed (its metrics were left out).",
        )
        self._metrics[self.collector_errors.name] = self.collector_errors

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self._register(Counter, name, help, labelnames)

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self._register(Gauge, name, help, labelnames)

    def histogram(
        self, name: str, help: str, labelnames: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return self._register(Histogram, name, help, labelnames, buckets=buckets)

    def _register(self, cls: type, name: str, help: str, labelnames: Sequence[str], **extra):  # noqa: ANN202, ANN003
        with self._lock:
            existing = self._metrics.get(name)
            if existing is not None:
                # Registering twice returns the same metric, so modules need not coordinate.
                if type(existing) is not cls or existing.labelnames != tuple(labelnames):
                    raise ValueError(f"metric {name!r} is already registered differently")
                return existing
            metric = cls(name, help, labelnames, **extra)
            self._metrics[name] = metric
            return metric

    def add_collector(self, collector: Collector) -> None:
        with self._lock:
            self._collectors.append(collector)

    def remove_collector(self, collector: Collector) -> None:
        with self._lock:
            if collector in self._collectors:
                self._collectors.remove(collector)

    def families(self) -> list[MetricFamily]:
        with self._lock:
            metrics = list(self._metrics.values())
            collectors = list(self._collectors)
        collected: list[MetricFamily] = []
        for collector in collectors:
            try:
                collected.extend(collector())
            except Exception:  # a broken source must not hide every other metric
                log.exception("metrics collector %r failed", collector)
                self.collector_errors.inc()
        # Owned metrics last in time, first in the text: this scrape's errors count.
        return [m.family() for m in metrics] + collected

    def render(self) -> str:
        return render_families(self.families())


def render_families(families: Iterable[MetricFamily]) -> str:
    """The Prometheus text exposition of ``families`` (one HELP/TYPE block per name)."""
    merged: dict[str, MetricFamily] = {}
    for fam in families:
        if fam.name in merged:
            merged[fam.name].samples.extend(fam.samples)
        else:
            merged[fam.name] = MetricFamily(fam.name, fam.kind, fam.help, list(fam.samples))
    lines: list[str] = []
    for fam in merged.values():
        lines.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        for labels, value in fam.samples:
            suffix = labels.get(SUFFIX, "")
            if suffix:
                labels = {k: v for k, v in labels.items() if k != SUFFIX}
            lines.append(f"{fam.name}{suffix}{_labels(labels)} {_number(value)}")
    return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


_DEFAULT = MetricsRegistry()


def default_registry() -> MetricsRegistry:
    """The process-wide registry: the gRPC server and the admin API share it."""
    return _DEFAULT
