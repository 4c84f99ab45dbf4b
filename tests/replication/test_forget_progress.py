"""Before its log is cut, a member drops the broker's snapshots of progress through the log and
keeps its configuration."""

from __future__ import annotations

from pathlib import Path

from halfmoon.broker_node import forget_log_progress


def test_progress_snapshots_go_and_configuration_stays(tmp_path: Path) -> None:
    metadata = tmp_path / "metadata"
    metadata.mkdir()
    progress = ["offsets.json", "transactions.json", "timer.json", "consumption.json"]
    for name in [*progress, "topics.json", "groups.json"]:
        (metadata / name).write_text("{}")
    forget_log_progress(metadata)
    assert sorted(p.name for p in metadata.iterdir()) == ["groups.json", "topics.json"]
    forget_log_progress(tmp_path / "absent")  # a member that never served a broker
