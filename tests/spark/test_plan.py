"""Offsets arithmetic: admission control shares, range splitting, offset specs (no Spark, no
server)."""

from __future__ import annotations

import pytest

from halfmoon.spark.jobs.audit import key_ranges
from halfmoon.spark.options import SparkOptionError, offset_spec, source_options
from halfmoon.spark.plan import admit, resolve, span, split


def test_admit_caps_the_span_and_shares_it_by_backlog() -> None:
    start = {"t": {"0": 0, "1": 100}}
    latest = {"t": {"0": 900, "1": 200}, "u": {"0": 50}}  # topic u is new: starts at 0
    end = admit(start, latest, 100)
    assert span(start, end) == 100
    assert end["t"]["0"] - 0 > end["t"]["1"] - 100 > 0  # the big backlog gets the big share
    assert end["u"]["0"] > 0  # a small queue is not starved
    assert admit(start, latest, None) == latest
    assert admit(start, latest, 10_000) == latest


def test_admit_never_moves_backwards() -> None:
    assert admit({"t": {"0": 10, "1": 5}}, {"t": {"0": 7}}, 3) == {"t": {"0": 10, "1": 5}}


def test_split_cuts_long_ranges_per_queue() -> None:
    ranges = split({"t": {"0": 0, "1": 5}}, {"t": {"0": 250, "1": 5, "2": 10}}, 100)
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 250),
        (2, 0, 10),
    ]


def test_resolve_json_needs_every_queue_and_maps_minus_two_and_one() -> None:
    def lookup(topic: str, queue: int, policy: str, ts: int | None) -> int:
        return {"earliest": 3, "latest": 99, "timestamp": 42}[policy]

    spec = offset_spec('{"t": {"0": -2, "1": -1, "2": 7}}', "startingOffsets")
    assert resolve(spec, [("t", 0), ("t", 1), ("t", 2)], lookup) == {"t": {"0": 3, "1": 99, "2": 7}}
    assert resolve(offset_spec("timestamp:1700000000000", "x"), [("t", 0)], lookup) == {
        "t": {"0": 42}
    }
    with pytest.raises(SparkOptionError, match="queue 3"):
        resolve(spec, [("t", 3)], lookup)


def test_bad_options_say_what_to_do() -> None:
    with pytest.raises(SparkOptionError, match="topic"):
        source_options({"endpoint": "h:1"}, streaming=True)
    with pytest.raises(SparkOptionError, match="host:port"):
        source_options({"topic": "t"}, streaming=True)
    with pytest.raises(SparkOptionError, match="endingOffsets is for batch"):
        source_options({"endpoint": "h:1", "topic": "t", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(SparkOptionError, match="maxRecordsPerTrigger"):
        source_options(
            {"endpoint": "h:1", "topic": "t", "maxRecordsPerTrigger": "0"}, streaming=True
        )
    with pytest.raises(SparkOptionError, match="JSON"):
        offset_spec("{oops", "startingOffsets")


def test_key_ranges_cover_the_whole_range() -> None:
    ranges = key_ranges(1, 10, 3)
    assert ranges[0][0] == 1 and ranges[-1][1] == 11
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert key_ranges(5, 4, 3) == []
