"""The queue-counts benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from bench import queue_counts


def test_the_counts_agree_with_the_walk_and_are_timed() -> None:
    row = queue_counts.measure(in_flight=1500, requeued=7, repeat=3)
    assert row["in_flight"] == 1500 and row["ready"] == 7  # measure asserts the walk agrees
    assert row["group_progress_us"] > 0 and row["walk_us"] > 0
