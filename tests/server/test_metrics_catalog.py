"""What a real server exports on /metrics against what docs/metrics.md documents and what
the Grafana dashboard (docs/grafana/halfmoon.json) queries."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from halfmoon.cluster.proxy.replication_view import families as replication_families
from tests.server.conftest import ROOT, ServerProcess, unique

DASHBOARD = ROOT / "docs" / "grafana" / "halfmoon.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
_TYPE = re.compile(r"^# TYPE (\S+) (counter|gauge|histogram|untyped)$", re.M)
_METRIC_NAME = re.compile(r"\bhalfmoon_[a-z0-9_]+\b")


def exported(server: ServerProcess) -> dict[str, str]:
    """Family name -> type, as the server's /metrics says."""
    with urllib.request.urlopen(server.admin + "/metrics", timeout=10) as response:
        return dict(_TYPE.findall(response.read().decode()))


def series_names(families: dict[str, str]) -> set[str]:
    """The names a query may use: a histogram's _bucket, _sum and _count, others as they are."""
    names: set[str] = set()
    for name, kind in families.items():
        if kind == "histogram":
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


def test_every_exported_family_is_documented(server: ServerProcess):
    server.create_topic(unique("catalog"))
    documented = set(_METRIC_NAME.findall(METRICS_DOC.read_text(encoding="utf-8")))
    missing = sorted(set(exported(server)) - documented)
    assert not missing, f"in /metrics but not in docs/metrics.md: {missing}"


def test_every_dashboard_query_names_a_metric_the_server_exports(server: ServerProcess):
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    # A proxy of a cluster adds the broker groups' replication families (no I/O to list).
    cluster = {family.name: family.kind for family in replication_families([])}
    known = series_names(exported(server)) | series_names(cluster)
    queries = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    queries += [
        ("variable " + v["name"], v["query"])
        for v in dashboard["templating"]["list"]
        if v.get("type") == "query"
    ]
    assert len(queries) >= 20
    unknown = []
    for title, expr in queries:
        names = _METRIC_NAME.findall(expr)
        assert names, f"{title}: a query naming no halfmoon metric: {expr}"
        unknown += [(title, name) for name in names if name not in known]
    assert not unknown, f"queries naming metrics the server does not export: {unknown}"
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_metrics_doc_links_the_dashboard():
    assert "grafana/halfmoon.json" in METRICS_DOC.read_text(encoding="utf-8")
    assert Path(DASHBOARD).is_file()
