"""Moved to :mod:`halfmoon.metrics` (the outbox relay uses it too); kept for old imports."""

from halfmoon.metrics import (
    CONTENT_TYPE,
    Counter,
    Gauge,
    MetricFamily,
    MetricsRegistry,
    default_registry,
    render_families,
)

__all__ = [
    "CONTENT_TYPE",
    "Counter",
    "Gauge",
    "MetricFamily",
    "MetricsRegistry",
    "default_registry",
    "render_families",
]
